"""Routing and delivery shared by both output modes: a resolved snapshot's rows → chunks → codec calls → audio
delivered to each request's stream."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Hashable

import numpy as np

from common.request import FinishReason, RequestFailedError
from output_builder.assembler import ChunkJob, RequestOutput
from output_builder.chunk_decoder import ChunkDecoder
from output_builder.codec_process import CodecProcessError
from talker.snapshot import StepSnapshot

log = logging.getLogger("talkstream.output")
Find = Callable[[str, Hashable], "RequestOutput | None"]


class OutputPipeline:
    """Routing and delivery shared by both modes. `deliver*` run on the event loop."""

    def __init__(self, decoder: ChunkDecoder, on_fatal: Callable[[BaseException], None], find: Find,
                 batch_frames: int = 64) -> None:
        """`find(request_id, key)`: the live request's output a snapshot row goes to, if the row's key (`Seq.sink`)
        is its stream's (the engine's one record of live requests: engine/live.py); rows cross the bridge as ids."""
        self.decoder = decoder
        self.on_fatal = on_fatal
        self.find = find
        self.batch_frames = batch_frames
        self.jobs_in_flight = 0
        self.tap: Callable[[StepSnapshot, np.ndarray], None] | None = None  # benchmarks: each step's codes
        self.waiting: dict[int, RequestOutput] = {}  # by stream id: waiting for text with frames not yet heard

    def route(self, snap: StepSnapshot) -> list[ChunkJob]:
        """Rows of a resolved snapshot → ready chunks (in batch order)."""
        assert snap.codes is not None
        codes = snap.codes.numpy()  # [B, G]
        if snap.buffer is not None:
            codes = codes.copy()  # a reused host buffer (CUDA): pending frames must not alias it once released
        if self.tap is not None:
            self.tap(snap, codes)
        jobs = []
        for row, (rid, key, segment) in enumerate(snap.rows):
            out = self.find(rid, key)  # gone or closed: the request ended (its Seq may still be stepped)
            if out is None or out.closed:
                continue
            if (job := out.push(codes[row], segment, key in snap.held)) is not None:
                jobs.append(job)
            if out.waiting:
                self.waiting[out.stream_id] = out
        snap.release()
        return jobs

    def look_aheads(self, now: float, lead_s: float) -> tuple[list[ChunkJob], float | None]:
        """The waiting requests' look-aheads that are due: those whose client is still playing and has `lead_s` or
        less of audio left (`AudioStream.plays_until`). Returns them and, if others are not due yet, the seconds
        until the first of them is.

        A look-ahead costs the codec a whole chunk, so it is spent where it keeps speech going: a client with audio
        to spare gets these frames with their chunk if the text resumes in time, and one that has already run out
        (its text comes slower than speech) waits for the text anyway and gets them with their chunk."""
        jobs: list[ChunkJob] = []
        later: float | None = None
        for sid, out in list(self.waiting.items()):
            left = out.stream.plays_until - now
            if out.waiting and left > lead_s:
                later = min(later or math.inf, left - lead_s)
                continue
            del self.waiting[sid]
            if left > 0 and (job := out.look_ahead()) is not None:
                jobs.append(job)
        return jobs, later

    def batches(self, jobs: list[ChunkJob]) -> list[tuple[bool, list[ChunkJob]]]:
        """A step's chunks → codec calls as (urgent, jobs): the new requests' first chunks in one urgent call, then
        the rest in calls of at most `batch_frames` frames. A function of the step's chunks alone."""
        calls: list[tuple[bool, list[ChunkJob]]] = []
        if firsts := [j for j in jobs if j.first]:
            calls.append((True, firsts))
        current: list[ChunkJob] = []
        frames = 0
        for job in (j for j in jobs if not j.first):
            if current and frames + job.frames > self.batch_frames:
                calls.append((False, current))
                current, frames = [], 0
            current.append(job)
            frames += job.frames
        if current:
            calls.append((False, current))
        return calls

    def deliver(self, jobs: list[ChunkJob], pcm: list[np.ndarray | None]) -> None:
        for job, audio in zip(jobs, pcm, strict=True):
            stream = job.out.stream
            if audio is not None:
                stream.usage.frames += job.heard
            if job.out.timer is not None:
                job.out.timer.feed(audio, job.heard, job.ends, job.silences, job.final is not None)
            if job.silences:
                audio = with_silences(audio, job)
            if audio is not None:
                stream.put(audio)
            if job.final is not None:
                self.decoder.release(job.out)
                self.waiting.pop(job.out.stream_id, None)
                stream.finish(job.final)

    def fail_jobs(self, jobs: list[ChunkJob], exc: BaseException, on_abort: Callable[[str], None]) -> None:
        log.error("audio output failed for %d request(s): %r", len(jobs), exc)
        for job in jobs:
            self.fail_output(job.out, RequestFailedError(f"audio decoding failed: {exc}", code="output_error"))
            on_abort(job.out.request_id)
        if isinstance(exc, CodecProcessError):
            self.on_fatal(exc)

    def fail_step(self, snap: StepSnapshot) -> None:
        err = snap.error or RuntimeError("step failed")
        for rid, key, segment in snap.rows:
            out = self.find(rid, key)
            if out is not None and not out.closed and segment == out.segment:  # not a finished segment's Seq
                self.fail_output(out, RequestFailedError(f"generation failed: {err}", code="generation_error"))
        if snap.fatal:
            self.on_fatal(err)

    def fail_output(self, out: RequestOutput, exc: BaseException) -> None:
        self.abandon(out)
        out.stream.finish(FinishReason.ERROR, exc)

    def abandon(self, out: RequestOutput) -> None:
        out.abandon()
        self.decoder.release(out)
        self.waiting.pop(out.stream_id, None)


def with_silences(audio: np.ndarray | None, job: ChunkJob) -> np.ndarray:
    """`audio` ([S], the job's heard frames) with the job's silences spliced in where their frames end."""
    pieces, at = [], 0
    per_frame = audio.shape[-1] // job.heard if audio is not None and job.heard else 0
    for frames, samples in job.silences:
        end = frames * per_frame
        if audio is not None:
            pieces.append(audio[..., at:end])
        pieces.append(np.zeros(samples, dtype=audio.dtype if audio is not None else np.int16))
        at = end
    if audio is not None:
        pieces.append(audio[..., at:])
    return np.concatenate(pieces)
