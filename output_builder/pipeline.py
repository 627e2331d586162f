"""Routing and delivery shared by both output modes: a resolved snapshot's rows → chunks → codec calls → audio
delivered to each request's stream."""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable

import numpy as np

from output_builder.assembler import ChunkJob, RequestOutput
from output_builder.chunk_decoder import ChunkDecoder
from output_builder.codec_process import CodecProcessError
from talker.request import FinishReason, RequestFailedError
from talker.snapshot import StepSnapshot

log = logging.getLogger("talkstream.output")


class OutputPipeline:
    """Routing and delivery shared by both modes. `deliver*` run on the event loop."""

    def __init__(self, decoder: ChunkDecoder, on_fatal: Callable[[BaseException], None],
                 batch_frames: int = 64) -> None:
        self.decoder = decoder
        self.on_fatal = on_fatal
        self.batch_frames = batch_frames
        self.jobs_in_flight = 0
        self.tap: Callable[[StepSnapshot, np.ndarray], None] | None = None  # benchmarks: each step's codes
        # every request's output by the key its worker Seqs carry (`Seq.sink`): rows cross the bridge as keys
        self.outputs: dict[Hashable, RequestOutput] = {}

    def route(self, snap: StepSnapshot) -> list[ChunkJob]:
        """Rows of a resolved snapshot → ready chunks (in batch order)."""
        assert snap.codes is not None
        codes = snap.codes.numpy()  # [B, G]
        if snap.buffer is not None:
            codes = codes.copy()  # a reused host buffer (CUDA): pending frames must not alias it once released
        if self.tap is not None:
            self.tap(snap, codes)
        jobs = []
        for row, (_, key, segment) in enumerate(snap.rows):
            out = self.outputs.get(key)  # gone: the request ended (a finished segment's Seq may still be stepped)
            if out is not None and (job := out.push(codes[row], segment, row in snap.held)) is not None:
                jobs.append(job)
        snap.release()
        return jobs

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
                stream.put(audio)
            if job.final is not None:
                self.decoder.release(job.out)
                self.outputs.pop(job.out.stream_id, None)
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
        for _, key, segment in snap.rows:
            out = self.outputs.get(key)
            if out is not None and segment == out.segment:  # not a finished segment's Seq still being stepped
                self.fail_output(out, RequestFailedError(f"generation failed: {err}", code="generation_error"))
        if snap.fatal:
            self.on_fatal(err)

    def fail_output(self, out: RequestOutput, exc: BaseException) -> None:
        self.abandon(out)
        out.stream.finish(FinishReason.ERROR, exc)

    def abandon(self, out: RequestOutput) -> None:
        out.abandon()
        self.decoder.release(out)
        self.outputs.pop(out.stream_id, None)
