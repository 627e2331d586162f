"""A request whose text arrives while it is spoken (`Engine.submit(StreamingSpeechRequest)`), on the tiny model.

Order is shown by events: a test waits until the request has made every frame its text allows (it is then
waiting for text) before it sends more, or sends at once to beat the Talker. The tiny model reads its text one
token per frame and ends its audio (EOS) right after its end of text: it makes exactly one frame per text token
and one more, and a frame whose input lacked its text token (`tts_pad` in its place) ends the audio there. Audio
is compared byte for byte only between requests run alone (one row per step), as docs/testing.md explains.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from common.request import (
    MAX_TEXT_S,
    MIN_TEXT_RATE,
    EngineBusyError,
    FinishReason,
    RequestError,
    SpeechRequest,
    StreamingSpeechRequest,
    TextEnd,
    TextLayout,
)
from engine.config import EngineConfig
from engine.engine import Engine
from engine.text_input import SpeechInput
from engine.watchdog import end_overdue_texts
from output_builder.streams import AudioStream
from talker.scheduler import SeqStatus

TEXT = "Hi there, it's 42."
SETTINGS = [{"seed": 5, "language": "english"}, {"seed": 6, "temperature": 0.0, "language": "english"}]  # seeded
# sampling, and greedy; the language named, as a streamed text has nothing to detect it from
# characters that draw nothing by themselves: zero-width space and joiner, BOM, a tag letter, the Hangul filler, the
# Braille blank, a combining accent alone, a variation selector, a direction mark, NUL, BEL
INVISIBLE = ["\u200b", "\u2060", "\ufeff", "\U000e0041", "\u3164", "\u2800", "\u0301", "\ufe0f", "\u200e", "\x00",
             "\x07"]



async def collect(stream: AudioStream) -> bytes:
    return b"".join([c.tobytes() async for c in stream])


async def wait_until(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.002)


def text_tokens(handle: SpeechInput) -> int:
    return handle.stream.usage.input_tokens


def frames(engine: Engine, handle: SpeechInput) -> int:
    live = engine.live.get(handle.request_id)
    return live.output.frames if live is not None else -1


async def caught_up(engine: Engine, handle: SpeechInput) -> None:
    """Until the request has made every frame its text so far allows (frame k takes text token k); at once if it
    has not started (no text token yet)."""
    await wait_until(lambda: frames(engine, handle) >= text_tokens(handle) or handle.stream.done)


async def whole(engine: Engine, text: str, **settings: Any) -> bytes:
    """The same text sent at once, in the streaming layout, as a streamed text is read: as it is (not normalised),
    in the language named (none detected)."""
    request = SpeechRequest(text=text, text_layout=TextLayout.STREAMING, normalize=False, **settings)
    return await collect(engine.submit(request))


async def streamed(engine: Engine, pieces: list[str], wait: list[bool], others: list[bool] | None = None,
                   **settings: Any) -> bytes:
    """`pieces` appended in turn; before each later one, wait for the Talker to catch up where `wait` says, and
    where `others` says, have another request run to its end while this one waits (its steps then take the waiting
    one's last feedback, summed without the text token it lacked: that token must be summed in when it comes)."""
    handle = engine.submit(StreamingSpeechRequest(**settings))
    for i, (piece, catch_up) in enumerate(zip(pieces, wait, strict=True)):
        if catch_up:
            await caught_up(engine, handle)
            if others and others[i] and text_tokens(handle):
                await collect(engine.submit(SpeechRequest(text="Meanwhile.", seed=i)))
        handle.append(piece)
    handle.finish()
    audio = await collect(handle.stream)
    assert handle.stream.finish_reason is FinishReason.EOS
    return audio


@pytest.mark.bitexact
@pytest.mark.parametrize("settings", SETTINGS, ids=["seeded", "greedy"])
async def test_split_at_every_character_the_audio_is_that_of_the_whole_text(engine: Engine,
                                                                            settings: dict[str, Any]) -> None:
    want = await whole(engine, TEXT, **settings)
    assert want
    for i in range(len(TEXT) + 1):
        got = await streamed(engine, [TEXT[:i], TEXT[i:]], [False, True], [False, i % 2 == 1], **settings)
        assert got == want, f"split at {i}: {TEXT[:i]!r} | {TEXT[i:]!r}"


@pytest.mark.bitexact
async def test_random_pieces_at_random_times_give_the_same_audio(engine: Engine) -> None:
    text = "So, 3 cats (and 12 dogs) sat; naïve café talk, 日本語 too!"
    want = await whole(engine, text, seed=9, language="english")  # named: a streamed text detects none
    rng = random.Random(22)
    for _ in range(6):
        points = sorted(rng.sample(range(1, len(text)), rng.randint(2, 12)))
        pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
        got = await streamed(engine, pieces, [rng.random() < 0.5 for _ in pieces], [rng.random() < 0.5 for _ in pieces],
                             seed=9, language="english")
        assert got == want, pieces


async def test_a_request_waits_for_text_without_steps_and_resumes(engine: Engine) -> None:
    """While it waits, others are stepped and it is not: no step, no frame, no KV position."""
    assert engine.worker is not None
    batches: list[tuple[str, ...]] = []
    engine.worker.fault_hook = lambda where, batch: batches.append(tuple(s.request_id for s in batch)) \
        if where == "step" else None
    handle = engine.submit(StreamingSpeechRequest(text="One two three four", seed=1))
    await caught_up(engine, handle)
    seq = engine.worker.scheduler.by_id[handle.request_id]
    made, steps = frames(engine, handle), len(batches)
    other = engine.submit(SpeechRequest(text="Meanwhile another request speaks a while.", seed=2))
    await collect(other)
    others = batches[steps:]
    assert len(others) > 10 and all(handle.request_id not in b for b in others)
    # its KV holds the prompt and a position per frame after the first (the prefill made that one), no more
    kv = int(engine.worker.runner.lengths[seq.slot])
    assert frames(engine, handle) == made and kv == seq.prefill_len + made - 1
    assert seq.starved and engine.stats()["slots_in_use"] == 1  # it keeps its slot
    handle.append(" five six.")
    handle.finish()
    await collect(handle.stream)
    stepped = sum(handle.request_id in b for b in batches)
    # one step per frame (the prefill made the first), one for EOS, and none while it waited
    assert handle.stream.finish_reason is FinishReason.EOS and handle.stream.usage.frames == text_tokens(handle) + 1
    assert stepped - 1 <= text_tokens(handle) + 1


async def test_a_waiting_request_has_sent_every_frame_it_made(engine_config: EngineConfig) -> None:
    """Frames made before the text ran out are heard while the request waits, not when its chunk fills later (its
    client, still playing, would run dry meanwhile). Each wait happens part way into a chunk (chunks of 1, 2, 4, 8,
    8… frames). The opening gives the client seconds of audio, so it is still playing at every wait; the lead is
    longer than that, so each look-ahead is due at once."""
    engine = Engine(engine_config.tuned(look_ahead_lead_s=600.0))
    await engine.start()
    try:
        handle = engine.submit(StreamingSpeechRequest(text="An opening long enough to play for a while: " * 3, seed=4))
        for piece in [" there", ", how", " are", " you", " doing", " today?"]:
            await caught_up(engine, handle)
            await wait_until(lambda: handle.stream.usage.frames == frames(engine, handle))
            assert handle.stream.plays_until > time.monotonic(), "the client ran out: the test's premise failed"
            handle.append(piece)
        handle.finish()
        audio = await collect(handle.stream)
        assert handle.stream.finish_reason is FinishReason.EOS
        assert len(audio) == handle.stream.usage.frames * 1920 * 2
    finally:
        await engine.stop()


async def test_cancel_while_waiting_frees_everything(engine: Engine) -> None:
    handle = engine.submit(StreamingSpeechRequest(text="Waiting for words that", seed=3))
    await caught_up(engine, handle)
    handle.stream.cancel()
    await wait_until(lambda: engine.stats()["slots_in_use"] == 0 and engine.active_requests() == 0)
    handle.append(" never come.")  # harmless: the request is gone
    handle.finish()
    assert handle.stream.finish_reason is FinishReason.CANCELLED and await collect(handle.stream) == b""
    assert engine.worker is not None and engine.worker.inbox.empty()
    assert not engine.live.texts() and engine.pipeline is not None and not engine.pipeline.decoder.open_streams


async def test_cancel_before_its_first_token_sends_nothing(engine: Engine) -> None:
    handle = engine.submit(StreamingSpeechRequest(text="Hel", seed=3))
    handle.stream.cancel()
    handle.append("lo there world")
    handle.finish()
    assert engine.worker is not None
    await wait_until(lambda: engine.worker.inbox.empty())  # type: ignore[union-attr]
    assert engine.stats()["slots_in_use"] == 0 and handle.stream.finish_reason is FinishReason.CANCELLED


async def test_streaming_and_ordinary_requests_share_steps(engine: Engine) -> None:
    """Ordinary requests keep running while streaming ones wait, and each speaks its whole text."""
    assert engine.worker is not None
    batches: list[tuple[str, ...]] = []
    engine.worker.fault_hook = lambda where, batch: batches.append(tuple(s.request_id for s in batch)) \
        if where == "step" else None
    ordinary = engine.submit_many([SpeechRequest(text=f"An ordinary request, number {i}, speaks. " * 4, seed=i)
                                   for i in range(3)])
    handles = [engine.submit(StreamingSpeechRequest(text="Streamed words", seed=10 + i)) for i in range(2)]
    rng = random.Random(5)
    for word in ["come", "in", "at", "their", "own", "pace", "and", "then", "stop."]:
        for handle in handles:
            if rng.random() < 0.5:
                await caught_up(engine, handle)
            handle.append(" " + word)
    for handle in handles:
        handle.finish()
    streams = [*ordinary, *(h.stream for h in handles)]
    await asyncio.gather(*(collect(s) for s in streams))
    for stream in streams:  # the tiny model: one frame per text token and one more, then EOS
        assert stream.finish_reason is FinishReason.EOS and stream.usage.frames == stream.usage.input_tokens + 1
    ids = {h.request_id for h in handles}
    together = [i for i, b in enumerate(batches) if ids <= set(b)]
    assert together and len(batches[together[0]]) > len(ids)  # in one batch with ordinary ones
    last = max(i for i, b in enumerate(batches) if ids & set(b))
    # ordinary ones stepped while both streaming ones waited, between their first step together and their last
    assert any(b and ids.isdisjoint(b) for b in batches[together[0] : last])


async def test_a_quiet_text_ends_as_if_finished(engine_config: EngineConfig) -> None:
    e = Engine(dataclasses.replace(engine_config, text_timeout_s=0.2))
    await e.start()
    try:
        handle = e.submit(StreamingSpeechRequest(text="Then the writer went quiet", seed=4))
        timed_out = asyncio.Event()
        handle.on_timeout = lambda _: timed_out.set()
        await asyncio.wait_for(timed_out.wait(), 30)
        await collect(handle.stream)
        assert handle.timed_out is TextEnd.QUIET and handle.finished and handle.stream.finish_reason is FinishReason.EOS
        assert handle.stream.usage.frames == text_tokens(handle) + 1  # all of it was spoken, then its end
        with pytest.raises(RequestError):
            handle.append(" more")
    finally:
        await e.stop()


async def test_edge_cases(engine: Engine) -> None:
    blank = engine.submit(StreamingSpeechRequest(text="  \n "))
    blank.finish()
    assert await collect(blank.stream) == b"" and blank.stream.finish_reason is FinishReason.EOS
    handle = engine.submit(StreamingSpeechRequest(seed=1))
    handle.append(b"caf\xc3")  # bytes cut inside "é"
    handle.append(b"\xa9 ok")
    handle.finish()
    handle.finish()
    assert await collect(handle.stream) and handle.text == "café ok"
    with pytest.raises(RequestError):
        handle.append("after the end")
    with pytest.raises(RequestError):
        engine.submit(StreamingSpeechRequest(text_layout=TextLayout.FULL))
    with pytest.raises(RequestError):
        engine.submit_many([StreamingSpeechRequest()])
    long = engine.submit(StreamingSpeechRequest(max_frames=4))
    with pytest.raises(RequestError):
        long.append("x" * 5000)
    long.stream.cancel()
    await wait_until(lambda: engine.active_requests() == 0)


async def test_the_layout_field_chooses_how_an_ordinary_request_is_fed(engine: Engine) -> None:
    full = await collect(engine.submit(SpeechRequest(text=TEXT, seed=2, text_layout=TextLayout.FULL)))
    streaming = await collect(engine.submit(SpeechRequest(text=TEXT, seed=2, text_layout=TextLayout.STREAMING)))
    default = await collect(engine.submit(SpeechRequest(text=TEXT, seed=2)))  # tiny's own: streaming
    assert default == streaming != full and full
    with pytest.raises(RequestError):
        engine.submit(SpeechRequest(text=TEXT, text_layout="sideways"))  # type: ignore[arg-type]



async def test_empty_and_blank_appends_do_not_keep_a_text_open(engine: Engine) -> None:
    """Only visible text is activity: a writer that appends "" (or blanks, or characters that draw nothing) forever
    still times out; what it appended is the text's all the same."""
    handle = engine.submit(StreamingSpeechRequest(text="Words, then nothing but", seed=1))
    quiet = handle.last_append
    for piece in ["", " ", "\n\t ", *INVISIBLE, b"", b"\xe2\x80\x8b", b"\xc3"]:  # the last completes no character
        handle.append(piece)
    assert handle.last_append == quiet
    assert handle.text == "Words, then nothing but \n\t " + "".join(INVISIBLE) + "\u200b"
    timeout = engine.config.text_timeout_s
    end_overdue_texts(engine.live.texts(), timeout, quiet + timeout + 0.001)  # the watchdog, a moment past the timeout
    assert handle.timed_out is TextEnd.QUIET and handle.finished
    await collect(handle.stream)
    assert handle.stream.finish_reason is FinishReason.EOS


async def test_a_blank_text_takes_no_admission_place_until_its_first_word(engine_config: EngineConfig) -> None:
    """Idle streamed texts of blanks cannot lock ordinary requests out; the first word asks for a place, and a full
    engine ends that request (its stream fails with EngineBusyError) instead of leaving it hanging."""
    e = Engine(dataclasses.replace(engine_config, max_batch=1, max_queue=0))
    await e.start()
    try:
        texts = ["", " \u200b", "\n" + "".join(INVISIBLE), "\u3164"]  # blank, or with characters that draw nothing
        blanks = [e.submit(StreamingSpeechRequest(text=text, seed=i)) for i, text in enumerate(texts)]
        for handle in blanks:
            handle.append("  \u2060\U000e0041\u0301")
        ordinary = e.submit(SpeechRequest(text="Still served.", seed=1))  # the one place
        with pytest.raises(EngineBusyError):
            e.submit(SpeechRequest(text="But only one.", seed=2))
        blanks[0].append("Now words")  # refused: the place is taken
        with pytest.raises(EngineBusyError):
            await collect(blanks[0].stream)
        assert await collect(ordinary)
        blanks[1].append("Now words, and a place.")
        blanks[1].finish()
        assert await collect(blanks[1].stream) and blanks[1].stream.finish_reason is FinishReason.EOS
        blanks[2].finish()  # blank to its end (invisible characters too): nothing to speak
        assert await collect(blanks[2].stream) == b"" and blanks[2].stream.finish_reason is FinishReason.EOS
        blanks[3].stream.cancel()
        await wait_until(lambda: e.active_requests() == 0)
        assert not e.live.outputs()
    finally:
        await e.stop()


async def test_a_trickle_ends_below_the_rate_floor_and_any_text_at_its_lifetime(engine: Engine) -> None:
    """A writer that is never quiet for `text_timeout_s` (a word now and then) still cannot hold a text for hours:
    past the timeout, a text averaging under MIN_TEXT_RATE visible characters a second ends (`SLOW`), and any text
    open MAX_TEXT_S ends (`EXPIRED`), each as if finished, speaking what it has. No time passes: each text is made
    to have opened long ago (`opened` moved back) and the watchdog is driven with `now` at its last append."""
    timeout = engine.config.text_timeout_s
    slow = engine.submit(StreamingSpeechRequest(text="A word", seed=1))
    for word in [" now", " and", " \u200b\u200bthen"]:
        slow.append(word)
    assert slow.visible == 15  # "A word now and then": the zero-width spaces are no rate
    fast = engine.submit(StreamingSpeechRequest(text="Enough words to keep up: far over one a second.", seed=2))
    old = engine.submit(StreamingSpeechRequest(text="Words " * 110, seed=3, max_frames=4))  # 550 visible
    old.append("Words " * 10)  # 600: the floor's rate, for ever
    ended: list[TextEnd] = []
    for handle, age in [(slow, 2 * timeout), (fast, 2 * timeout), (old, MAX_TEXT_S - 1)]:
        handle.opened = handle.last_append - age
        handle.on_timeout = ended.append
    end_overdue_texts(engine.live.texts(), timeout, max(h.last_append for h in (slow, fast, old)))  # not quiet: each
    # just had a piece
    assert slow.visible < MIN_TEXT_RATE * 2 * timeout <= fast.visible
    assert ended == [TextEnd.SLOW] and slow.timed_out is TextEnd.SLOW and slow.finished
    assert not fast.timed_out and not old.timed_out  # fast enough, and young enough
    old.opened = old.last_append - MAX_TEXT_S - 1
    end_overdue_texts(engine.live.texts(), timeout, old.last_append)
    assert ended == [TextEnd.SLOW, TextEnd.EXPIRED] and old.timed_out is TextEnd.EXPIRED and old.finished
    assert await collect(slow.stream) and slow.stream.finish_reason is FinishReason.EOS
    assert slow.stream.usage.frames == text_tokens(slow) + 1  # all of it was spoken, then its end
    await collect(old.stream)
    fast.finish()
    assert await collect(fast.stream) and not fast.timed_out


@pytest.mark.bitexact
@pytest.mark.parametrize("settings", SETTINGS, ids=["seeded", "greedy"])
async def test_a_waiting_request_gives_its_slot_to_queued_work_and_its_audio_does_not_change(
        engine_config: EngineConfig, settings: dict[str, Any]) -> None:
    """One slot: each time the streamed text runs out, an ordinary request queued behind it is served in its slot
    (it is parked in host memory meanwhile), and its audio is still that of the whole text."""
    e = Engine(dataclasses.replace(engine_config, max_batch=1))
    await e.start()
    try:
        assert e.worker is not None
        want = await whole(e, TEXT, **settings)
        handle = e.submit(StreamingSpeechRequest(**settings))
        words = TEXT.split(" ")
        handle.append(words[0])
        parked = 0
        for i, word in enumerate(words[1:]):
            await caught_up(e, handle)
            assert await collect(e.submit(SpeechRequest(text="Meanwhile.", seed=i)))
            assert not handle.stream.done and not handle.timed_out  # served while the streamed text is open
            seq = e.worker.scheduler.by_id.get(handle.request_id)
            parked += seq is not None and seq.status is SeqStatus.PARKED
            handle.append(" " + word)
        handle.finish()
        assert await collect(handle.stream) == want
        assert parked == len(words) - 2  # every time but the first: it had not started (its first word unsettled)
    finally:
        await e.stop()
