"""The engine's Python API, used by the server: start/stop from a config, `submit(request) → AudioStream`.

`Engine` is the lifecycle (start wires the loaded parts, drain and stop take them down, a dead part marks the whole
engine dead) and the face of the rest: submission (engine/submission.py), the one record of live requests and its
admission check (engine/live.py), the watchdog (engine/watchdog.py), clones (engine/cloning.py), word timestamps
(engine/aligning.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import overload

import numpy as np
import torch

from common.request import (
    ClonePrompt,
    EngineDeadError,
    EngineState,
    RequestError,
    SpeechRequest,
    StreamingSpeechRequest,
    VoiceKind,
)
from engine.aligning import Alignment
from engine.cloning import CloneKind, Cloning
from engine.config import EngineConfig, OutputMode
from engine.live import LiveRequests
from engine.loaded import Loaded, load
from engine.submission import Submission
from engine.text_input import SpeechInput
from engine.watchdog import dead_part, drop_idle_readers, end_overdue_texts, watch
from frontend.frontend import Prepared, Voice
from frontend.lexicon import Lexicon
from output_builder.assembler import RequestOutput
from output_builder.bridge import AsyncBridge
from output_builder.chunk_decoder import ChunkDecoder, InProcessCodec
from output_builder.pipeline import OutputPipeline
from output_builder.streams import AudioStream
from output_builder.sync_bridge import SyncBridge
from talker.compiled import use_cache_dir, wants_compile
from talker.device import DeviceLayer
from talker.models.hub import is_directory
from talker.static_runner import build_runner
from talker.worker import Abort, Stop, TalkerWorker

log = logging.getLogger("talkstream.engine")


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config.validate()
        self.state = EngineState.STOPPED
        self.dead_reason: str | None = None
        # a directory is served under its name, a Hub repository under its id as given
        self.model_id = Path(config.model).name if is_directory(config.model) else config.model
        self.worker: TalkerWorker | None = None
        self.pipeline: OutputPipeline | None = None
        self._loaded: Loaded | None = None
        self.live = LiveRequests(config.max_batch + config.max_queue)  # the one record of each live request
        self._submission: Submission | None = None  # once started
        self._bridge: AsyncBridge | SyncBridge | None = None
        self._codec_pool: ThreadPoolExecutor | None = None
        self._cloning: Cloning | None = None  # Base checkpoints
        self._alignment: Alignment | None = None  # --aligner
        self._watchdog: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # Lifecycle ------------------------------------------------------------------------------------
    async def start(self) -> None:
        self.state = EngineState.STARTING
        self._loop = asyncio.get_running_loop()
        cfg = self.config
        self._loaded = loaded = await asyncio.to_thread(load, self.config)
        if loaded.voice_encoder is not None:
            self._cloning = Cloning(loaded.voice_encoder, cfg.max_queue)
        aligning = None
        if loaded.aligner is not None:  # its checkpoint loads in its process while the Talker's step is built
            self._alignment = Alignment(loaded.aligner, loaded.sample_rate)
            aligning = self._loop.create_task(self._alignment.start(), name="aligner-start")
        # a thread per codec lane (AsyncBridge)
        self._codec_pool = ThreadPoolExecutor(2, "codec-worker", initializer=torch.set_num_threads,
                                              initargs=(loaded.threads.codec,))
        backend = loaded.codec_process or InProcessCodec(loaded.codec)  # type: ignore[arg-type]
        self.pipeline = OutputPipeline(ChunkDecoder(backend), self._mark_dead, self.live.find,
                                       cfg.tuning.codec_batch_frames)
        if cfg.output_mode is OutputMode.ASYNC:
            self._bridge = AsyncBridge(self._loop, self.pipeline, self._codec_pool, self._abort,
                                       codec_timeout_s=cfg.tuning.codec_timeout_s, first_due=self._first_due,
                                       hold_s=cfg.tuning.codec_hold_s,
                                       look_ahead_lead_s=cfg.tuning.look_ahead_lead_s)
        else:
            self._bridge = SyncBridge(self._loop, self.pipeline, self._abort, cfg.tuning.codec_timeout_s)
        t = loaded.talker.cfg.talker
        runner_args = (loaded.talker.model.talker, loaded.talker.cfg, cfg.max_batch, cfg.max_len,
                       cfg.tuning.text_width, loaded.device, next(loaded.talker.model.parameters()).dtype,
                       loaded.sampler)
        compiled = wants_compile(cfg.compile, loaded.device, loaded.talker.cfg)
        if compiled:
            use_cache_dir(cfg.cache_dir)
        try:
            runner = await asyncio.to_thread(build_runner, runner_args, compiled, loaded.threads.talker)
        finally:
            if aligning is not None:
                await aligning  # an aligner that cannot be used stops the start
        log.info("KV cache: %.1f MiB for %d slots (%d layers, hidden %d); native CPU kernels: codec %s, sampler %s",
                 runner.kv.nbytes / 2**20, cfg.max_batch, t.num_layers, t.hidden_size,
                 "on" if self.native_kernels else "off", "on" if loaded.sampler else "off")
        knobs = cfg.tuning
        device = DeviceLayer(loaded.device, loaded.threads.talker, nice=knobs.worker_nice)
        self.worker = TalkerWorker(runner, device, cfg.max_batch, self._bridge, loaded.talker.cfg.codec.eos,
                                   knobs.max_prefills_per_step, knobs.timing_ring, knobs.max_prefill_tokens,
                                   knobs.prefill_midstep and loaded.device.type == "cpu")
        self._submission = Submission(loaded, cfg, self.live, self.pipeline, self.worker, self._alignment, self._loop,
                                      self.check_admission, self._abort, self._fail,
                                      lambda: self.state is not EngineState.DEAD)
        self._bridge.start()
        self.worker.start()
        self._watchdog = self._loop.create_task(watch(self._check), name="reader-watchdog")
        self.state = EngineState.READY
        if cfg.tuning.warmup:
            await self._warmup()

    async def _warmup(self) -> None:
        frames = min(12, self.config.max_frames, self.config.max_len // 2)
        assert self._loaded is not None
        # a Base checkpoint has no voice of its own: a silent x-vector stands in
        clone = ClonePrompt((0.0,) * self._loaded.talker.cfg.talker.hidden_size) if self._loaded.voice_encoder else None
        stream = self.submit(SpeechRequest(text="Warm up.", seed=0, max_frames=frames, clone=clone))
        async for _ in stream:
            pass

    def stop_admitting(self) -> None:
        """New submissions fail with EngineDeadError ("draining"); what is in flight goes on."""
        if self.state is EngineState.READY:
            self.state = EngineState.DRAINING

    async def drain(self, timeout: float) -> None:
        """Stop admitting; wait up to `timeout` for in-flight streams to end, then abort the rest."""
        self.stop_admitting()
        deadline = time.monotonic() + timeout
        while self.active_requests() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for out in self.live.outputs():
            self._fail(out, EngineDeadError("the server is shutting down"))

    async def stop(self) -> None:
        if self.state is EngineState.STOPPED:
            return
        if self.state is not EngineState.DEAD:
            self.state = EngineState.DRAINING
        for out in self.live.outputs():
            self._fail(out, EngineDeadError("the engine stopped"))
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self.worker is not None:
            self.worker.send(Stop())  # a dead engine's worker may be hung (sync mode: in the codec)
            await asyncio.to_thread(self.worker.join, 10.0 if self.state is not EngineState.DEAD else 1.0)
        if self._bridge is not None:
            await self._bridge.stop()
        if self._codec_pool is not None:  # a dead engine's codec thread may be hung: do not wait for it
            self._codec_pool.shutdown(wait=self.state is not EngineState.DEAD)
        if self._cloning is not None:
            await self._cloning.close()  # a clone being encoded ends first
        if self._alignment is not None:
            await self._alignment.close()
        if self._loaded is not None and self._loaded.codec_process is not None:
            await asyncio.to_thread(self._loaded.codec_process.stop)
        self.state = EngineState.STOPPED if self.state is not EngineState.DEAD else EngineState.DEAD

    # Requests (engine/submission.py) ------------------------------------------------------------
    async def prepare(self, request: SpeechRequest) -> Prepared:
        """`submit`'s validation, tokenization, splitting, language detection and normalisation, done ahead, off the
        event loop for a long text or one with something to read out, where they take milliseconds (20 for 4,096
        characters; 10 for a Chinese sentence's numbers). The next `submit` of the request takes it as it is."""
        return await self._submission_or_refusal().prepare(request)

    @overload  # the subclass first: mypy calls that overlap unsafe, since a SpeechRequest may be one
    def submit(self, request: StreamingSpeechRequest) -> SpeechInput: ...  # type: ignore[overload-overlap]

    @overload
    def submit(self, request: SpeechRequest) -> AudioStream: ...

    def submit(self, request: SpeechRequest) -> AudioStream | SpeechInput:
        """Validate (unless `prepare` did) and enqueue. Raises RequestError (bad input), EngineBusyError or
        EngineDeadError. A request whose text arrives over time returns its handle (`append`, `finish`, and the
        audio `stream`)."""
        if isinstance(request, StreamingSpeechRequest):
            return self._submission_or_refusal().submit_streaming(request)
        return self.submit_many([request])[0]

    def submit_many(self, requests: list[SpeechRequest]) -> list[AudioStream]:
        """Submit requests that the worker sees together (admitted in one step when slots allow)."""
        return self._submission_or_refusal().submit(requests)

    def _submission_or_refusal(self) -> Submission:
        if self._submission is None:  # not started, or its start failed
            self.check_admission()
        assert self._submission is not None
        return self._submission

    def reload_lexicon(self) -> int | None:
        """Reads the lexicon file again (SIGHUP): the new one applies to requests from now on. Raises LexiconError
        (the one in use stays) when it cannot be used. Returns its entries; None without a lexicon."""
        if self.config.lexicon is None or self._loaded is None:
            return None
        lexicon = Lexicon.load(self.config.lexicon)
        self._loaded.frontend.lexicon = lexicon
        return len(lexicon)

    def check_admission(self, n: int = 1) -> None:
        """Raises what `submit` would for `n` new requests on account of the engine: not ready (or dead), or full
        (engine/live.py). A route calls it before work of its own on a request (a voice to clone), so that work is
        not wasted."""
        self.live.check_admission(self.state, self.dead_reason, n)

    def active_requests(self) -> int:
        return len(self.live)

    def _abort(self, request_id: str) -> None:
        """A request ends early (its stream cancelled or failed): the output side and the worker let go of it."""
        live = self.live.end(request_id)
        if live is not None and self.pipeline is not None:
            self.pipeline.abandon(live.output)
        if self.worker is not None:
            self.worker.send(Abort(request_id))

    def _first_due(self) -> bool:
        return self.live.first_due(self.config.max_batch)

    def _fail(self, out: RequestOutput, exc: BaseException) -> None:
        assert self.pipeline is not None
        self.pipeline.fail_output(out, exc)
        self._abort(out.request_id)

    def _mark_dead(self, exc: BaseException) -> None:
        log.error("engine is dead: %r", exc)
        self.state = EngineState.DEAD
        self.dead_reason = str(exc) or type(exc).__name__
        assert self.pipeline is not None
        for out in self.live.outputs():
            self.pipeline.fail_output(out, EngineDeadError(f"the engine is dead: {self.dead_reason}"))

    def _check(self, now: float) -> None:
        """The watchdog's rounds (engine/watchdog.py)."""
        drop_idle_readers(self.live.outputs(), self.config.reader_timeout_s, now, self._fail)
        end_overdue_texts(self.live.texts(), self.config.text_timeout_s, now)
        if self.state in (EngineState.READY, EngineState.DRAINING):
            process = self._loaded.codec_process if self._loaded else None
            if (dead := dead_part(self._bridge, self.worker, process, now)) is not None:
                self._mark_dead(RuntimeError(dead))

    # Introspection --------------------------------------------------------------------------------
    @property
    def sample_rate(self) -> int:
        return self._loaded.sample_rate if self._loaded else 24000

    @property
    def native_kernels(self) -> bool:
        """Whether the codec runs its compiled CPU kernels (see output_builder/codecs/native.py)."""
        loaded = self._loaded
        if loaded is not None and loaded.codec_process is not None:
            return loaded.codec_process.native_kernels
        return loaded is not None and loaded.codec is not None and loaded.codec.native_kernels

    @property
    def voices(self) -> dict[str, Voice]:
        return self._loaded.frontend.voices if self._loaded else {}

    @property
    def voice_kind(self) -> VoiceKind:
        return self._loaded.frontend.kind if self._loaded else VoiceKind.CUSTOM_VOICE

    async def clone_prompt(self, wav: np.ndarray, transcript: str | None, param: str = "transcript",
                           kind: CloneKind = "creation") -> ClonePrompt:
        """A reference recording (float32 mono, 24 kHz) → the clone prompt of a voice, for Base checkpoints. With a
        transcript: in-context cloning; without: x-vector only. Runs in the voice process (engine/voices/process.py),
        queued by `kind` (a one-off `ref_audio` clone or a voice's creation) and cached (engine/cloning.py).
        An in-context prompt whose transcript and recording leave an input too little room is a RequestError naming
        `param` (the field that carries the transcript)."""
        if self._loaded is None or self.state is not EngineState.READY:
            raise EngineDeadError(f"the engine is {self.state.value}")
        if self._cloning is None:
            raise RequestError(f"this model cannot clone voices (it is a {self.voice_kind.value} checkpoint; cloning "
                               "needs a Base one)", param="model")
        clone = await self._cloning.prompt(wav, transcript, kind)
        if clone.ref_text is not None and clone.ref_codes is not None:  # the recording's length is known only now
            self._loaded.frontend.check_reference(clone.ref_text, len(clone.ref_codes), param)
        return clone

    def check_clone_text(self, transcript: str | None, param: str) -> None:
        """Refuses (RequestError naming `param`) a transcript too long for a cloned voice to ever speak, even with
        the shortest recording: cheap, so it runs before any decoding or cloning work."""
        if transcript is not None and self._loaded is not None:
            self._loaded.frontend.check_reference(transcript, 0, param)

    def check_design(self, description: str, param: str) -> None:
        """Refuses (RequestError naming `param`) a designed voice's description too long for it to ever speak."""
        if self._loaded is not None:
            self._loaded.frontend.check_design(description, param)

    @property
    def timestamps(self) -> bool:
        """Whether requests may ask for word timestamps (an aligner is loaded)."""
        return self._alignment is not None

    @property
    def languages(self) -> list[str]:
        return ["auto", *sorted(self._loaded.talker.cfg.languages)] if self._loaded else ["auto"]

    def memory(self) -> dict[str, int]:
        """The Talker's weights, its KV cache, and the bytes each active request holds: its Talker slot (KV cache
        and device state) and its codec stream state."""
        if self.worker is None or self._loaded is None:
            return {}
        slot = self.worker.runner.bytes_per_slot
        codec = self._loaded.codec.open_stream().nbytes() if self._loaded.codec else 0
        return {"slot_bytes": slot, "codec_state_bytes": codec, "bytes_per_request": slot + codec,
                "kv_cache_bytes": self.worker.runner.kv.nbytes, "weights_bytes": self._loaded.talker.weights_bytes}

    def stats(self) -> dict[str, int]:
        sched = self.worker.scheduler if self.worker else None
        return {
            "active_requests": self.active_requests(),
            "slots_in_use": sched.active if sched else 0,
            "queued_requests": len(sched.waiting) if sched else 0,
            "codec_jobs_in_flight": self.pipeline.jobs_in_flight if self.pipeline else 0,
            "snapshot_backlog": self._bridge.backlog if self._bridge else 0,
            "codec_streams": len(self.pipeline.decoder.open_streams) if self.pipeline else 0,
            "output_routes": sum(not o.closed for o in self.live.outputs()),  # outputs the router can reach
            "clone_jobs": self._cloning.jobs if self._cloning else 0,  # queued or being encoded
        }
