"""What an engine loads at start: the Talker checkpoint, its codec (in this process or its own), the tokenizer and
frontend, the CPU kernels and the thread plan, for Base checkpoints the voice encoder, and the aligner if asked."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from common.request import VoiceKind
from engine.aligner.model import checked as aligner_files
from engine.aligner.on_device import AlignerOnDevice
from engine.aligner.process import AlignerProcess
from engine.config import EngineConfig, OutputMode
from engine.tiny import ensure_tiny
from engine.voices.process import VoiceProcess
from frontend.frontend import Frontend, load_tokenizer
from frontend.lexicon import Lexicon
from output_builder.codec_process import CodecProcess
from output_builder.codecs.native import load_native
from output_builder.codecs.qwen12hz import Qwen12HzCodec
from talker.device import Threads, resolve_device, thread_plan, usable_cores
from talker.models.hub import resolve
from talker.models.loader import LoadedTalker, load_talker, resolve_dtype
from talker.models.qwen3_tts.config import GenerationDefaults, Qwen3TTSConfig, read_json
from talker.sampler_native import SamplingKernel, load_sampling_kernel

log = logging.getLogger("talkstream.engine")


@dataclass(slots=True)
class Loaded:
    path: Path
    talker: LoadedTalker
    codec: Qwen12HzCodec | None  # in this process (sync mode); async mode decodes in the codec process
    codec_process: CodecProcess | None
    frontend: Frontend
    device: torch.device
    sample_rate: int
    sampler: SamplingKernel | None  # the CPU sampling kernel, when native kernels are on and build here
    threads: Threads
    voice_encoder: VoiceProcess | None  # Base checkpoints: reference recordings → clone prompts
    aligner: AlignerProcess | AlignerOnDevice | None = None  # --aligner: word timestamps


def load(cfg: EngineConfig) -> Loaded:
    """The checkpoint, its codec (here or in its process), tokenizer, kernels and thread plan."""
    lexicon = Lexicon.load(cfg.lexicon) if cfg.lexicon else None  # a bad file stops the start before it began
    aligner_dir = resolve(cfg.aligner, check=aligner_files) if cfg.aligner else None  # and so does a missing file
    device = resolve_device(cfg.device)
    path = ensure_tiny(cfg.cache_dir) if cfg.model == "tiny" else resolve(cfg.model, cfg.revision)
    talker = load_talker(path, device, resolve_dtype(cfg.dtype, device), cfg.quantize, batches=cfg.max_batch > 1)
    arch = talker.cfg
    step_params = arch.talker.linear_params + (arch.num_code_groups - 1) * arch.predictor.linear_params
    threads = thread_plan(cfg.tuning.torch_threads, step_params, usable_cores(), int8=cfg.quantize == "int8")
    log.info("torch threads: Talker %d, codec %d (%d cores)", threads.talker, threads.codec, usable_cores())
    codec_dir = path / "speech_tokenizer"
    codec_cfg = read_json(codec_dir / "config.json")
    sample_rate = int(codec_cfg.get("output_sample_rate", 24000))
    frame_rate = sample_rate / int(codec_cfg.get("decode_upsample_rate", 1920))
    codec, process = None, None
    native = cfg.tuning.native_kernels and device.type == "cpu"
    if cfg.output_mode is OutputMode.ASYNC:
        process = CodecProcess(codec_dir, str(device), threads.codec, native, cfg.tuning.worker_nice)
    else:
        codec = Qwen12HzCodec.from_pretrained(codec_dir, device=device)
        codec.use_native(load_native() if native else None)
    max_frames = min(cfg.max_frames, cfg.max_len // 2)
    frontend = Frontend(talker.cfg, talker.generation, load_tokenizer(path), max_frames, cfg.tuning.text_width,
                        cfg.max_len - max_frames, frame_rate)
    frontend.lexicon = lexicon
    frontend.detects = cfg.tuning.detect_language
    if frontend.detects:
        frontend.detector.detect("Warm up.")  # Lingua's models load now, not in a request on the event loop
    sampler = load_sampling_kernel() if native else None
    voices = VoiceProcess(path) if frontend.kind is VoiceKind.BASE else None
    aligner = _aligner(aligner_dir, device, cfg) if aligner_dir else None
    return Loaded(path, talker, codec, process, frontend, device, sample_rate, sampler, threads, voices, aligner)


def _aligner(directory: Path, device: torch.device, cfg: EngineConfig) -> AlignerProcess | AlignerOnDevice:
    """On CUDA, beside the Talker on a stream of its own; on a CPU, in a process under SCHED_IDLE."""
    if device.type == "cuda":
        return AlignerOnDevice(directory, device, cfg.cache_dir)
    return AlignerProcess(directory, usable_cores(), cfg.cache_dir)


def frontend_for(cfg: EngineConfig) -> Frontend:
    """A checkpoint's request front-end alone, without its weights (benchmarks and tools)."""
    path = ensure_tiny(cfg.cache_dir) if cfg.model == "tiny" else resolve(cfg.model, cfg.revision)
    max_frames = min(cfg.max_frames, cfg.max_len // 2)
    return Frontend(Qwen3TTSConfig.load(path), GenerationDefaults.load(path), load_tokenizer(path), max_frames,
                    cfg.tuning.text_width, cfg.max_len - max_frames)
