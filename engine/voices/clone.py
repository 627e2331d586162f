"""A Base checkpoint's clone prompt: a reference recording → the speaker encoder's x-vector and, for in-context
cloning, the 12 Hz tokenizer's codes of the recording, with its transcript. Computed once per voice, off the hot
path: in the voice process (engine/voices/process.py) at the lowest CPU priority, with one torch thread, so that it
shares neither the GIL with the Talker's thread nor a core with the playing streams while they need it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from common.request import ClonePrompt, RequestError
from engine.voices.codec_encoder import CodecEncoder, load_codec_encoder
from engine.voices.speaker_encoder import SpeakerEncoder, load_speaker_encoder

SAMPLE_RATE = 24000
# measured (tiny, 16 streams, voices made back to back): a thread at nice 0 kept 0.58x of their throughput; at
# nice 19, 0.69x, the Talker's step 1.4x (the GIL); this process: docs/benchmarks.md
VOICE_NICE = 19


class Encoders:
    """Both encoders of one checkpoint, loaded on first use."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._loaded: tuple[SpeakerEncoder, CodecEncoder] | None = None

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
        if self._loaded is None:
            speaker = load_speaker_encoder(self.directory)
            codec = load_codec_encoder(self.directory)
            if speaker is None or codec is None:
                missing = "speaker encoder" if speaker is None else "speech tokenizer encoder"
                raise RequestError(f"this checkpoint cannot clone voices: it has no {missing}", param="model")
            self._loaded = speaker, codec
        return self._loaded
