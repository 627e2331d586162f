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

from common.request import SpeechRequest, TextLayout
from frontend.frontend import Frontend, load_tokenizer
from talker.device import DeviceLayer
from talker.models.loader import LoadedTalker
from talker.runner import Runner
from talker.scheduler import Seq, SeqStatus, TextFeed
from talker.worker import Abort, Feed, Pause, Stop, Submit, TalkerWorker
from tests.talker.test_worker import CPU, Recorder, codes, loaded  # noqa: F401  (loaded: a fixture)

pytestmark = pytest.mark.bitexact
TEXT = "the quick brown fox jumps over the lazy dog"


def wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


def worker_for(loaded: LoadedTalker, recorder: Recorder, steps: list[tuple[str, ...]],  # noqa: F811
               slots: int = 4) -> TalkerWorker:
    runner = Runner(loaded.model.talker, loaded.cfg, slots, 256, 256, CPU, torch.float32)
    worker = TalkerWorker(runner, DeviceLayer(CPU), slots, recorder, loaded.cfg.codec.eos)
    worker.fault_hook = lambda where, batch: steps.append(tuple(s.request_id for s in batch)) \
        if where == "step" else None
    worker.start()
    return worker


def made(recorder: Recorder, rid: str, frames: int) -> Callable[[], bool]:
    return lambda: len(recorder.rows[rid]) == frames


def ended(recorder: Recorder, rid: str, eos: int) -> bool:
    return any(int(c[0]) == eos for _, c in recorder.rows[rid])


@pytest.mark.parametrize("chunks", [[1, 1, 1], [0, 5, 2, 30], [3, 0, 0, 4]], ids=["ones", "mixed", "empty"])
def test_fed_text_gives_the_whole_prompts_codes_and_waits_without_steps(
    loaded: LoadedTalker, tiny_dir: Path, chunks: list[int]  # noqa: F811
) -> None:
    frontend = Frontend(loaded.cfg, loaded.generation, load_tokenizer(tiny_dir), 200, 256, 256)
    frontend.detects = False  # the whole text goes without a language, as a streamed one does
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


@pytest.mark.parametrize("slots", [1, 2], ids=["its_own_slot", "another_slot"])
def test_a_starved_request_gives_its_slot_to_queued_work_and_resumes_bit_for_bit(
    loaded: LoadedTalker, tiny_dir: Path, slots: int  # noqa: F811
) -> None:
    """Each time its text runs out, a request queued behind it gets its slot and is served while it waits (parked:
    its slot's state in host memory); its text then brings it back, with two slots into the other one, and its
    codes are still those of the whole text."""
    frontend = Frontend(loaded.cfg, loaded.generation, load_tokenizer(tiny_dir), 200, 256, 256)
    frontend.detects = False  # the whole text goes without a language, as a streamed one does
    request = SpeechRequest(text=TEXT, voice="aria", seed=3, text_layout=TextLayout.STREAMING)
    whole = frontend.prepare(request)
    settings = frontend.settings(request)
    tokens = list(whole.prompt.text)
    head = [*frontend.tokenizer.plain("assistant\n")[:2], tokens[0]]
    eos = loaded.cfg.codec.eos

    recorder, steps = Recorder(), list[tuple[str, ...]]()
    worker = worker_for(loaded, recorder, steps, slots)
    held_in: list[int] = []
    try:
        worker.send(Submit((Seq("whole", whole.prompt, whole.params, whole.seed, whole.max_frames, None),)))
        wait_for(lambda: ended(recorder, "whole", eos), "the whole text ends")
        fed = Seq("fed", frontend.stream_prompt(settings, head), settings.params, settings.seed, settings.max_frames,
                  None, feed=TextFeed([]))

        def block(i: int) -> Seq:  # the other slot is held (its reader is behind): queued work needs fed's
            blocker = Seq(f"blocker{i}", whole.prompt, whole.params, 10 + i, 64, None)
            worker.send(Submit((blocker,)))
            worker.send(Pause(blocker.request_id, True))
            wait_for(made(recorder, blocker.request_id, 1), "the blocker holds the other slot")
            return blocker

        first_blocker = block(0) if slots == 2 else None  # slot 0: fed starts in slot 1, and comes back in 0
        worker.send(Submit((fed,)))
        sent = 0
        for i, n in enumerate([3, 1, 4]):
            wait_for(lambda s=sent: len(recorder.rows["fed"]) == s + 1 and fed.starved, "it waits for text")  # type: ignore[misc]
            held_in.append(fed.slot)
            blocker = None
            if slots == 2:
                blocker = first_blocker if i == 0 else block(i)
            queued = Seq(f"queued{i}", whole.prompt, whole.params, i, 3, None)
            worker.send(Submit((queued,)))
            wait_for(made(recorder, queued.request_id, 3), "the queued request is served")
            assert fed.status is SeqStatus.PARKED and len(recorder.rows["fed"]) == sent + 1
            parked = fed.parked
            assert parked is not None and parked.k.shape[2] == int(parked.rows["lengths"])  # its whole KV, no more
            if blocker is not None:
                worker.send(Abort(blocker.request_id))
                wait_for(lambda b=blocker: b.status is SeqStatus.DONE, "the blocker is gone")  # type: ignore[misc]
            worker.send(Feed("fed", tuple(tokens[1 + sent : 1 + sent + n])))
            sent += n
        worker.send(Feed("fed", tuple(tokens[1 + sent :]), done=True))
        wait_for(lambda: ended(recorder, "fed", eos), "the fed text ends")
    finally:
        worker.send(Stop())
        assert worker.join(30)
    assert np.array_equal(codes(recorder, "fed"), codes(recorder, "whole"))
    assert sum("fed" in s for s in steps) == len(recorder.rows["fed"])  # a step per frame, none while parked
    assert set(held_in) == set(range(slots))  # with two slots, it came back in the other one
    assert worker.scheduler.parked == {} and not worker.scheduler.resuming and not worker.scheduler.hungry
