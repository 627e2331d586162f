"""Tuning knobs: how the engine runs, not what it serves. Not user settings: each has a measured default; tests and
benchmarks set them explicitly (`EngineConfig.tuned(...)`), one variable sets them for debugging
(`TALKSTREAM_TUNING="native_kernels=0,warmup=0"`, read in engine/config.py), and one has a flag of its own
(`serve --codec-timeout`).

Which prefill policy runs where: a new request's prefill is a step of its own on every device (the scheduler's one
policy: no step mixes prefill and decode rows), so its first frame is not a 32-row step's; on the CPU that step
runs between the code predictor's sub-steps of the step in flight (`prefill_midstep`), since a CPU step is long;
on CUDA it waits for the step boundary (a pause inside the step could not be captured in a CUDA graph).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Tuning:
    max_prefills_per_step: int = 32  # new requests prefilled together in one step (a burst shares one prefill)
    max_prefill_tokens: int = 2048  # and only while count x longest prompt fits: bounds the step others wait on
    prefill_midstep: bool = True  # and run between the code predictor's sub-steps of the step in flight
    text_width: int = 4608  # text tokens per request (4096 characters of any script fit)
    # 80 ms of audio: the first chunk leaves after one step; sizes then double up to chunk_frames (1, 2, 4, 8, 8, …)
    first_chunk_frames: int = 1
    chunk_frames: int = 8
    # frames per backlog codec call; first chunks go on a lane of their own, served between a backlog call's stages
    codec_batch_frames: int = 64
    codec_hold_s: float = 0.02  # a backlog codec call waits up to this long while a first chunk is due
    # a request waiting for text has its pending frames decoded ahead once its client has this much audio or less
    # left to play (output_builder/pipeline.py `look_aheads`): codec time, and a client's margin for its delivery
    look_ahead_lead_s: float = 0.25
    codec_timeout_s: float = 30.0  # a codec call that takes longer fails its requests and kills the engine
    # torch threads per worker; 0: from the model's size and the cores (talker/device.py: one each for `tiny`; at
    # real sizes a quarter of the cores for the codec, the rest for the Talker; both for the Talker on 2 cores)
    torch_threads: int = 0
    worker_nice: int = 5  # the Talker thread and the codec process yield a busy core to the event loop
    native_kernels: bool = True  # the codec's and sampler's CPU kernels (compiled when the package is installed)
    warmup: bool = True  # a short request at start, so the first client's request does not pay for lazy setup
    # a text whose language is not named is spoken in the language detected (frontend/language.py); off, it
    # goes to the model with none, as the official package sends it (the parity tests against its outputs)
    detect_language: bool = True
    timing_ring: int = 4096  # step timings kept for benchmarks and /metrics

    def validate(self) -> Tuning:
        positive = ("max_prefills_per_step", "max_prefill_tokens", "text_width", "first_chunk_frames",
                    "chunk_frames", "codec_batch_frames", "timing_ring")
        for name in positive:
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.torch_threads < 0:
            raise ValueError("torch_threads must be >= 0")
        if self.codec_timeout_s <= 0 or self.codec_hold_s < 0 or self.look_ahead_lead_s < 0:
            raise ValueError("codec_timeout_s must be > 0, codec_hold_s and look_ahead_lead_s >= 0")
        if not 0 <= self.worker_nice <= 19:
            raise ValueError("worker_nice must be in [0, 19]")
        return self
