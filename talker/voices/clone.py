"""A Base checkpoint's clone prompt: a reference recording → the speaker encoder's x-vector and, for in-context
cloning, the 12 Hz tokenizer's codes of the recording, with its transcript. Computed once per voice, off the hot
path (the engine runs it on a thread of its own, never the event loop or the Talker's thread)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from talker.device import lower_priority
from talker.request import ClonePrompt, RequestError
from talker.voices.codec_encoder import CodecEncoder, load_codec_encoder
from talker.voices.speaker_encoder import SpeakerEncoder, load_speaker_encoder

SAMPLE_RATE = 24000


VOICE_NICE = 19  # measured (tiny, 16 streams): nice 0 kept 0.58x of their throughput while voices were made


def _background() -> None:
    torch.set_num_threads(1)
    lower_priority(VOICE_NICE)


class VoiceEncoder:
    """Both encoders of one checkpoint, loaded on first use (a server that never clones never holds them)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._loaded: tuple[SpeakerEncoder, CodecEncoder] | None = None
        # one thread, one torch thread, the lowest CPU priority: a creation takes what the streams leave
        self._pool = ThreadPoolExecutor(1, "voice-encoder", initializer=_background)

    async def create(self, wav: np.ndarray, transcript: str | None) -> ClonePrompt:
        """`prompt` on the encoder's own thread."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, self.prompt, wav, transcript)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def prompt(self, wav: np.ndarray, transcript: str | None) -> ClonePrompt:
        """wav: [samples] float32 mono at 24 kHz. With a transcript: in-context cloning; without: x-vector only."""
        if wav.ndim != 1 or wav.size == 0:
            raise RequestError("the reference must be non-empty mono audio", param="audio_sample")
        speaker, codec = self._encoders()
        x = np.ascontiguousarray(wav, dtype=np.float32)
        with torch.inference_mode():
            vector = speaker.embed(x)  # [dim]
            codes = codec.encode(x) if transcript else None  # [frames, G]
        return ClonePrompt(
            x_vector=tuple(float(v) for v in vector.tolist()),
            ref_codes=None if codes is None else tuple(tuple(int(c) for c in f) for f in codes.tolist()),
            ref_text=transcript or None,
        )

    def _encoders(self) -> tuple[SpeakerEncoder, CodecEncoder]:
        with self._lock:  # two first creations at once load once
            if self._loaded is None:
                speaker = load_speaker_encoder(self.directory)
                codec = load_codec_encoder(self.directory)
                if speaker is None or codec is None:
                    missing = "speaker encoder" if speaker is None else "speech tokenizer encoder"
                    raise RequestError(f"this checkpoint cannot clone voices: it has no {missing}", param="model")
                self._loaded = speaker, codec
            return self._loaded
