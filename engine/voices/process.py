"""The voice process: a child that runs a Base checkpoint's encoders (engine/voices/clone.py) for clone prompts
(the parent's side is engine/model_process.py's). Started on the first clone, restarted on the next after it dies.

Down the pipe: ("prompt", wav, transcript), ("stats",), or None to stop. Back: ("ok", value), ("error",
RequestError) for a reference the encoders refuse, or ("failed", text) for anything else."""

from __future__ import annotations

import contextlib
import sys
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from common.children import die_with_parent
from common.request import ClonePrompt, RequestError
from engine.model_process import ModelProcess

# A clone's budget: a 30 s reference takes ~4 s at the 0.6B sizes on a 2-core CPU. Past it the child is taken to be
# hung (it would hold every queued clone behind it): it is killed, and the next clone starts another.
CALL_TIMEOUT_S = 120.0


class VoiceProcess(ModelProcess):
    """The parent's side. The engine's clone queue makes one call at a time."""

    module, what, code = "engine.voices.process", "voice encoder", "voice_encoder"

    def __init__(self, directory: Path, timeout_s: float = CALL_TIMEOUT_S) -> None:
        super().__init__(directory, timeout_s)

    def prompt(self, wav: np.ndarray, transcript: str | None) -> ClonePrompt:
        """wav: [samples] float32 mono at 24 kHz. With a transcript: in-context cloning; without: x-vector only."""
        prompt: ClonePrompt = self._call(("prompt", np.ascontiguousarray(wav, np.float32), transcript or None))
        return prompt

    def stats(self) -> dict[str, int]:
        """The child's counts: `prompts`, the encoder runs it has made (0 when none runs)."""
        with self._lock:
            if self._conn is None:
                return {"prompts": 0}
        counts: dict[str, int] = self._call(("stats",))
        return counts


def _serve(conn: Connection, directory: Path) -> None:
    import torch

    from common.children import lower_priority
    from engine.voices.clone import VOICE_NICE, Encoders

    torch.set_num_threads(1)
    lower_priority(VOICE_NICE)
    encoders, prompts = Encoders(directory), 0
    while (message := conn.recv()) is not None:
        if message[0] == "stats":
            conn.send(("ok", {"prompts": prompts}))
            continue
        _, wav, transcript = message
        prompts += 1
        try:
            conn.send(("ok", encoders.prompt(wav, transcript)))
        except RequestError as exc:
            conn.send(("error", exc))
        except Exception as exc:
            conn.send(("failed", f"{type(exc).__name__}: {exc}"))


if __name__ == "__main__":
    die_with_parent(int(sys.argv[3]))
    with contextlib.suppress(EOFError, OSError):  # the parent is gone
        _serve(Connection(int(sys.argv[1])), Path(sys.argv[2]))
