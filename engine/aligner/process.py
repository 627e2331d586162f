"""The aligner process: a child that runs the forced aligner (engine/aligner/aligner.py) under SCHED_IDLE, so that it
only takes the CPU the Talker and the codec leave (the parent's side is engine/model_process.py's).

Down the pipe: ("languages",) (loads the checkpoint and finds the Korean word list: the engine asks at start),
("align", clips), or None to stop.
Back: ("ok", value) or ("failed", text)."""

from __future__ import annotations

import contextlib
import sys
from multiprocessing.connection import Connection
from pathlib import Path

from common.children import die_with_parent
from engine.aligner.words import Clip
from engine.model_process import ModelProcess

# An alignment call's budget: a batch of clips of up to a minute's audio; the 0.6B aligner times ~10 s of audio in
# about a second on 2 CPU cores. Past it the child is taken to be hung: it is killed, and the next call starts another.
CALL_TIMEOUT_S = 120.0

Timed = list[tuple[str, float, float]]  # a clip's (word, start, end), seconds from its start


class AlignerProcess(ModelProcess):
    module, what, code = "engine.aligner.process", "aligner", "aligner"

    def __init__(self, directory: Path, threads: int, cache_dir: Path, timeout_s: float = CALL_TIMEOUT_S) -> None:
        """`cache_dir`: where the official Korean word list is kept (fetched there by the child, if need be)."""
        super().__init__(directory, timeout_s, (str(threads), str(cache_dir)))

    def languages(self) -> tuple[str, ...]:
        """The checkpoint's languages; starts the child and loads the checkpoint (RequestFailedError if it cannot)."""
        names: tuple[str, ...] = self._call(("languages",))
        return names

    def align(self, clips: list[Clip]) -> list[Timed]:
        timed: list[Timed] = self._call(("align", clips))
        return timed


def _serve(conn: Connection, directory: Path, threads: int, cache_dir: Path) -> None:
    import torch

    from common.children import idle_only
    from engine.aligner.aligner import Aligner
    from engine.aligner.korean import KoreanWordlist

    torch.set_num_threads(threads)
    try:
        loaded = Aligner(directory)
        loaded.korean = KoreanWordlist(directory, cache_dir)  # once the checkpoint is known to load
        aligner: Aligner | None = loaded
        problem = ""
    except Exception as exc:
        aligner, problem = None, f"{type(exc).__name__}: {exc}"
    idle_only()  # after the load: under SCHED_IDLE on a busy machine the load itself starved (100 s for tiny's)
    while (message := conn.recv()) is not None:
        if aligner is None:
            conn.send(("failed", problem))
            continue
        try:
            if message[0] == "languages":
                conn.send(("ok", aligner.languages))
            else:
                words = aligner.align(message[1])
                conn.send(("ok", [[(w.word, w.start, w.end) for w in clip] for clip in words]))
        except Exception as exc:
            conn.send(("failed", f"{type(exc).__name__}: {exc}"))


if __name__ == "__main__":
    die_with_parent(int(sys.argv[3]))
    with contextlib.suppress(EOFError, OSError):  # the parent is gone
        _serve(Connection(int(sys.argv[1])), Path(sys.argv[2]), int(sys.argv[4]), Path(sys.argv[5]))
