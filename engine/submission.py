"""Submission, on the event loop: a request in, its audio stream out; and the one place that decides what follows
when the output side ends a segment.

1. The front-end prepares the request: validation, tokenization, splitting, language detection, normalisation
   (`prepare`, ahead and off the loop for a long text; else in `submit`).
2. One admission check and one id check (engine/live.py).
3. Its output (`RequestOutput`, with its `AudioStream`) goes into the one record of live requests, with its plan.
4. Its first segment's Seq goes to the worker; each later one when the output side has seen the last one end
   (`segment_ended`); a segment the output side cuts short stops on the worker (`cut`).
A text that arrives over time is admitted at its first visible character and gets a handle (`SpeechInput`,
engine/text_input.py) that starts it on the worker once its head has come.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import numpy as np

from common.request import (
    EngineBusyError,
    EngineDeadError,
    FinishReason,
    RequestError,
    SpeechRequest,
    StreamingSpeechRequest,
)
from engine.aligning import Alignment, check_timestamps
from engine.config import EngineConfig
from engine.live import LiveRequests
from engine.loaded import Loaded
from engine.text_input import HEAD, SpeechInput
from frontend.frontend import Prepared
from frontend.normalize import worth_normalizing
from frontend.text_stream import visible_chars
from output_builder.assembler import RequestOutput
from output_builder.pipeline import OutputPipeline
from output_builder.repetition import RepeatWatch
from output_builder.streams import AudioStream
from talker.scheduler import Seq, TextFeed
from talker.worker import Abort, Pause, Submit, TalkerWorker

log = logging.getLogger("talkstream.engine")
LONG_TEXT_CHARS = 128  # `prepare` works off the event loop on a longer text (a shorter one takes under a millisecond)
NO_LIMIT = 1 << 62  # frames: a response the client set no limit for


class Submission:
    def __init__(self, loaded: Loaded, config: EngineConfig, live: LiveRequests, pipeline: OutputPipeline,
                 worker: TalkerWorker, alignment: Alignment | None, loop: asyncio.AbstractEventLoop,
                 admission: Callable[[int], None], abort: Callable[[str], None],
                 fail: Callable[[RequestOutput, BaseException], None], alive: Callable[[], bool]) -> None:
        """`admission(n)`: the engine's admission check; `abort(rid)`: ends a request (its stream cancelled);
        `fail(out, exc)`: ends one with an error; `alive()`: whether the engine still runs its worker."""
        self.loaded, self.config, self.live, self.pipeline, self.worker = loaded, config, live, pipeline, worker
        self.alignment, self.loop = alignment, loop
        self.admission, self.abort, self.fail, self.alive = admission, abort, fail, alive
        self.frontend = loaded.frontend
        self._prepared: dict[str, Prepared] = {}  # by request id: `prepare` done ahead, for its `submit`

    async def prepare(self, request: SpeechRequest) -> Prepared:
        self.admission(1)
        check_timestamps(request, self.alignment)
        if len(request.text) <= LONG_TEXT_CHARS and not (request.normalize and worth_normalizing(request.text)):
            prepared = self.frontend.prepare(request)
        else:
            prepared = await asyncio.to_thread(self.frontend.prepare, request)
        self._prepared[request.request_id] = prepared  # (the caller submits it next, with no await between)
        return prepared

    def submit(self, requests: list[SpeechRequest]) -> list[AudioStream]:
        ahead = [self._prepared.pop(r.request_id, None) for r in requests]  # first: nothing stays behind on a refusal
        self.admission(len(requests))
        if any(isinstance(r, StreamingSpeechRequest) for r in requests):
            raise RequestError("a request whose text arrives over time is submitted on its own", param="text")
        for r in requests:
            check_timestamps(r, self.alignment)
        prepared = [p if p is not None and p.request is r else self.frontend.prepare(r)
                    for p, r in zip(ahead, requests, strict=True)]
        self.live.check_ids([r.request_id for r in requests])
        outs = [self._first_output(p) for p in prepared]
        self.worker.send(Submit(tuple(self._first_seq(p, out) for p, out in zip(prepared, outs, strict=True))))
        return [out.stream for out in outs]

    def _first_output(self, p: Prepared) -> RequestOutput:
        out = self._new_output(p.request.request_id, p.limit, len(p.segments) - 1)
        self.live.add(out, plan=p)
        out.caps = p.caps
        out.pauses = tuple(round(seconds * self.loaded.sample_rate) for seconds in p.pauses)
        out.stream.transcript, out.stream.language = p.spoken, p.language
        if p.detected is not None:
            log.info("request %s: language detected per segment: %s", out.request_id,
                     ", ".join(lang or "unsure (the model's default)" for lang in p.detected))
        out.stream.usage.input_tokens = p.input_tokens
        if p.request.timestamps and self.alignment is not None:
            out.timer = self.alignment.timer(out.stream, p.texts, p.detected or (p.language,) * len(p.texts))
        if (ref := p.prompt.reference) is not None:
            out.context = np.array(ref.codes, dtype=np.int64).T  # [G, F]
        return out

    @staticmethod
    def _first_seq(p: Prepared, out: RequestOutput) -> Seq:
        return Seq(out.request_id, p.prompt, p.params, p.seed, min(p.max_frames, out.max_frames), out.stream_id)

    def submit_streaming(self, request: StreamingSpeechRequest) -> SpeechInput:
        blank = not visible_chars(request.text)  # admitted at its first visible character (`admit`)
        self.admission(0 if blank else 1)
        check_timestamps(request, self.alignment)
        frontend, worker, rid = self.frontend, self.worker, request.request_id
        s = frontend.prepare_stream(request)
        self.live.check_ids([rid])
        out = self._new_output(rid, s.limit)
        live = self.live.add(out, blank=blank)

        def start(head: list[int], done: bool) -> None:
            if len(head) < HEAD:  # the text ended blank: nothing to speak
                self.pipeline.abandon(out)
                out.stream.finish(FinishReason.EOS)
                return
            seq = Seq(rid, frontend.stream_prompt(s, head), s.params, s.seed, s.max_frames, out.stream_id,
                      feed=TextFeed(head[HEAD:], done))
            worker.send(Submit((seq,)))

        def admit() -> bool:
            """Its first visible character: it takes an admission place now, or ends (failed) if there is none."""
            try:
                self.admission(1)  # (counted without it: it is still blank)
            except (EngineBusyError, EngineDeadError) as exc:
                self.fail(out, exc)
                return False
            finally:
                live.blank = False
            return True

        def ended(tokens: int) -> None:  # its speech's cap, by its whole text (the output side cuts it there)
            out.caps = (min(s.max_frames, frontend.cap(tokens)),)

        live.text = handle = SpeechInput(rid, out.stream, frontend.tokenizer.stream(), start, worker.send,
                                         self.config.tuning.text_width - 1, len(s.instruct or ()),
                                         admit if blank else None, ended)
        if request.text:
            try:
                handle.append(request.text)
            except RequestError:
                out.stream.cancel()  # the caller never sees it: nothing may stay behind
                raise
        return handle

    def _new_output(self, rid: str, limit: int | None, segments_left: int = 0) -> RequestOutput:
        cfg, loaded = self.config, self.loaded
        stream = AudioStream(rid, loaded.sample_rate, cfg.max_ahead_s, self.abort, self.pace)
        return RequestOutput(rid, stream, limit or NO_LIMIT, loaded.talker.cfg.codec.eos, cfg.tuning.first_chunk_frames,
                             cfg.tuning.chunk_frames, segment_frames=self.frontend.max_frames,
                             segments_left=segments_left, on_segment_end=self.segment_ended,
                             watch=RepeatWatch(self.frontend.frame_rate), on_cut=self.cut)

    def segment_ended(self, out: RequestOutput) -> None:
        """The output side has seen a segment of a long text end: its next segment starts, on the event loop (sync
        mode ends segments on the worker thread), where aborts happen too: a request ended meanwhile starts
        nothing."""
        self.loop.call_soon_threadsafe(self._next_segment, out.request_id, out.stream_id)

    def _next_segment(self, rid: str, key: int) -> None:
        live = self.live.get(rid)
        if live is None or live.plan is None or live.output.stream_id != key or not self.alive():
            return
        out, p = live.output, live.plan
        if out.closed or out.stream.done:
            return
        frames = min(out.segment_cap, out.max_frames - out.frames)
        self.worker.send(Submit((Seq(rid, p.segments[out.segment], p.params, p.seed, frames, key,
                                     segment=out.segment),)))
        if out.stream.paused:  # its reader is behind: the new Seq waits like the last one did
            self.worker.send(Pause(rid, True))

    def cut(self, out: RequestOutput) -> None:
        """The output side ended `out`'s current segment before its EOS: that segment's Seq stops."""
        self.worker.send(Abort(out.request_id, out.segment))

    def pace(self, request_id: str, paused: bool) -> None:
        self.worker.send(Pause(request_id, paused))
