"""The forced aligner on a CUDA device, in the engine's process. Its kernels go to a CUDA stream of its own, so an
alignment is never queued on the stream the Talker's steps run on; its Python runs on the alignment thread
(engine/aligning.py), not the worker's. On a CPU the aligner runs in a process of its own instead
(engine/aligner/process.py), where SCHED_IDLE keeps it off the Talker's cores; a GPU has no such priority between
processes, while streams of one process share it kernel by kernel.

Its face is the aligner process's: `languages()` loads the checkpoint (RequestFailedError if it cannot), `align()`,
`close()`."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from common.request import RequestFailedError
from engine.aligner.aligner import Aligner
from engine.aligner.korean import KoreanWordlist
from engine.aligner.process import Timed
from engine.aligner.words import Clip


class AlignerOnDevice:
    def __init__(self, directory: Path, device: torch.device, cache_dir: Path) -> None:
        self.directory, self.device, self.cache_dir = directory, device, cache_dir
        self._aligner: Aligner | None = None
        self._stream: torch.cuda.Stream | None = None

    def languages(self) -> tuple[str, ...]:
        if self._aligner is None:
            try:
                aligner = Aligner(self.directory, device=str(self.device))
            except Exception as exc:
                raise RequestFailedError(f"the aligner failed: {type(exc).__name__}: {exc}", "aligner_error") from None
            aligner.korean = KoreanWordlist(self.directory, self.cache_dir)  # once the checkpoint is known to load
            if self.device.type == "cuda":
                self._stream = torch.cuda.Stream(self.device)
            self._aligner = aligner
        return self._aligner.languages

    def align(self, clips: list[Clip]) -> list[Timed]:
        if self._aligner is None:
            raise RequestFailedError("the aligner is not loaded", "aligner_error")
        stream = torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext()
        with stream:
            words = self._aligner.align(clips)  # its times come back to the host: the stream is done with them
        return [[(w.word, w.start, w.end) for w in clip] for clip in words]

    def close(self) -> None:
        self._aligner = None
