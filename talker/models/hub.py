"""Where a checkpoint comes from: a local directory, or a Hugging Face Hub repository kept in the standard cache.

Downloads go through `huggingface_hub` (progress bars, parallel and resumable downloads, `HF_HOME` /
`HF_HUB_CACHE`, `HF_HUB_OFFLINE`, `HF_ENDPOINT`, `HF_TOKEN`). A repository already in the cache is used from there
without asking the Hub anything, so a server starts with the network down; `talkstream download` asks for the latest
revision.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from talker.models.qwen3_tts.config import CheckpointError

_REPO_ID = re.compile(r"^[\w.\-]+(/[\w.\-]+)?$")
REQUIRED = ("config.json", "speech_tokenizer/config.json")


def is_directory(model: str) -> bool:
    return Path(model).expanduser().is_dir()


def resolve(model: str, revision: str | None = None, *, refresh: bool = False,
            check: Callable[[Path], Path] | None = None) -> Path:
    """The checkpoint directory of `model`: itself if it is a directory, else the cached (or, when not cached or
    `refresh`, downloaded) snapshot of the Hub repository it names. Raises CheckpointError with a one-line reason.
    `check` says whether a directory holds the checkpoint wanted (default: a Qwen3-TTS one's files)."""
    check = check or checked
    if is_directory(model):
        return check(Path(model).expanduser())
    if not _REPO_ID.match(model) or ".." in model:
        raise CheckpointError(f"model '{model}' is neither a checkpoint directory nor a Hugging Face Hub repository id")
    return check(_download(model, revision) if refresh else _cached(model, revision))


def _cached(repo: str, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo, revision=revision, local_files_only=True))
    except LocalEntryNotFoundError:
        return _download(repo, revision)


def _download(repo: str, revision: str | None) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        from huggingface_hub.errors import IncompleteSnapshotError
    except ImportError:  # older huggingface_hub: no such case
        IncompleteSnapshotError = ()  # type: ignore[assignment,misc]

    at = f"{repo}@{revision}" if revision else repo
    try:
        return Path(snapshot_download(repo, revision=revision))
    except GatedRepoError:
        raise CheckpointError(f"{at}: access is restricted; accept its terms on the Hub and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise CheckpointError(f"{at}: no such repository on {constants.ENDPOINT} (a private one needs HF_TOKEN)"
                              ) from None
    except RevisionNotFoundError:
        raise CheckpointError(f"{at}: the repository has no revision '{revision}'") from None
    except IncompleteSnapshotError:
        raise CheckpointError(f"{at} is only partly in the cache and the Hub cannot be reached to finish it; run "
                              "`talkstream download` with the network up") from None
    except LocalEntryNotFoundError:
        why = "offline mode is on (HF_HUB_OFFLINE)" if constants.HF_HUB_OFFLINE else f"{constants.ENDPOINT} is down"
        raise CheckpointError(f"{at} is not in the cache ({constants.HF_HUB_CACHE}) and {why}") from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        hint = "; set HF_TOKEN" if status in (401, 403) else ""
        raise CheckpointError(f"{at}: the Hub answered {status}{hint}") from None
    except OSError as exc:
        raise CheckpointError(f"{at}: download failed: {exc}") from None


def checked(directory: Path) -> Path:
    """`directory` if it holds a Qwen3-TTS checkpoint's files; else an error that says which are missing."""
    missing = [name for name in REQUIRED if not (directory / name).is_file()]
    if not any(directory.glob("model*.safetensors")):
        missing.append("model.safetensors")
    if not (directory / "speech_tokenizer").is_dir() or not any((directory / "speech_tokenizer").glob("*.safetensors")):
        missing.append("speech_tokenizer/model.safetensors")
    if not (directory / "tokenizer.json").is_file() and not all(
            (directory / n).is_file() for n in ("vocab.json", "merges.txt")):
        missing.append("tokenizer.json (or vocab.json + merges.txt)")
    if missing:
        raise CheckpointError(f"{directory} is not a Qwen3-TTS checkpoint: missing {', '.join(missing)}")
    return directory
