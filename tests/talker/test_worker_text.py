"""The Talker worker with a text fed over time (`Feed`): it waits where the text runs out, with no step, and its
codes are those of the whole text in the streaming layout's prompt. Each of its steps has it alone (the same one
row as the whole text's), while other requests run only while it waits."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from talker.device import DeviceLayer
from talker.models.frontend import Frontend, load_tokenizer
from talker.models.loader import LoadedTalker
from talker.request import SpeechRequest, TextLayout
from talker.runner import Runner
from talker.scheduler import Seq, TextFeed
from talker.worker import Feed, Stop, Submit, TalkerWorker
from tests.talker.test_worker import CPU, Recorder, codes, loaded  # noqa: F401  (loaded: a fixture)

pytestmark = pytest.mark.bitexact
TEXT = "the quick brown fox jumps over the lazy dog"


def wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


def worker_for(loaded: LoadedTalker, recorder: Recorder, steps: list[tuple[str, ...]]) -> TalkerWorker:  # noqa: F811
    runner = Runner(loaded.model.talker, loaded.cfg, 4, 256, 256, CPU, torch.float32)
    worker = TalkerWorker(runner, DeviceLayer(CPU), 4, recorder, loaded.cfg.codec.eos)
    worker.fault_hook = lambda where, batch: steps.append(tuple(s.request_id for s in batch)) \
        if where == "step" else None
    worker.start()
    return worker


def ended(recorder: Recorder, rid: str, eos: int) -> bool:
    return any(int(c[0]) == eos for _, c in recorder.rows[rid])


@pytest.mark.parametrize("chunks", [[1, 1, 1], [0, 5, 2, 30], [3, 0, 0, 4]], ids=["ones", "mixed", "empty"])
def test_fed_text_gives_the_whole_prompts_codes_and_waits_without_steps(
    loaded: LoadedTalker, tiny_dir: Path, chunks: list[int]  # noqa: F811
) -> None:
    frontend = Frontend(loaded.cfg, loaded.generation, load_tokenizer(tiny_dir), 200, 256, 256)
    request = SpeechRequest(text=TEXT, voice="aria", seed=3, text_layout=TextLayout.STREAMING)
    whole = frontend.prepare(request)
    settings = frontend.settings(request)
    tokens = list(whole.prompt.text)
    head = [*frontend.tokenizer.plain("assistant\n")[:2], tokens[0]]
    eos = loaded.cfg.codec.eos

    recorder, steps = Recorder(), list[tuple[str, ...]]()
    worker = worker_for(loaded, recorder, steps)
    try:
        worker.send(Submit((Seq("whole", whole.prompt, whole.params, whole.seed, whole.max_frames, None),)))
        wait_for(lambda: ended(recorder, "whole", eos), "the whole text ends")
        fed = Seq("fed", frontend.stream_prompt(settings, head), settings.params, settings.seed, settings.max_frames,
                  None, feed=TextFeed([]))
        worker.send(Submit((fed,)))
        sent = 0

        def waits(sent: int) -> Callable[[], bool]:  # it has made frame 0 and a frame per token sent, then waits
            return lambda: len(recorder.rows["fed"]) == sent + 1 and fed.starved

        def ends(rid: str) -> Callable[[], bool]:
            return lambda: len(recorder.rows[rid]) == 4

        for i, n in enumerate(chunks):
            wait_for(waits(sent), "it waits for text")
            # another request runs to its end meanwhile: its steps take the feedback of the waiting one's last step,
            # summed without the text token it lacked (which must be summed in again when it comes)
            other = Seq(f"other{i}", whole.prompt, whole.params, i, 4, None)
            worker.send(Submit((other,)))
            wait_for(ends(other.request_id), "the other request ends")
            worker.send(Feed("fed", tuple(tokens[1 + sent : 1 + sent + n])))
            sent = min(sent + n, len(tokens) - 1)
        worker.send(Feed("fed", tuple(tokens[1 + sent :]), done=True))
        wait_for(lambda: ended(recorder, "fed", eos), "the fed text ends")
    finally:
        worker.send(Stop())
        assert worker.join(30)
    # a step per frame and none while it waited (such a step would have made a frame of its own)
    assert np.array_equal(codes(recorder, "fed"), codes(recorder, "whole"))
    assert sum("fed" in s for s in steps) == len(recorder.rows["fed"])
