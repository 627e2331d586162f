"""The aligner's audio front: PCM at any rate → 16 kHz mono float32 → Whisper-style log-mel features.

As the official package prepares a clip: soxr's high-quality resampler (what librosa's default `soxr_hq` calls),
the result cut or zero-padded to ceil(n × 16000 / rate) samples; a clip whose peak is over 1 scaled down; then
transformers' `WhisperFeatureExtractor` (128 bins, 25 ms windows, 10 ms hop) over the clip as it is, not padded to
30 s: one feature frame per 160 samples."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import soxr
from transformers import WhisperFeatureExtractor

RATE = 16000


def to_16k(pcm: np.ndarray, rate: int) -> np.ndarray:
    """pcm: [S] int16 or float at `rate` → [S'] float32 at 16 kHz, within [-1, 1]."""
    audio = pcm.astype(np.float32) / 32768.0 if pcm.dtype == np.int16 else pcm.astype(np.float32)
    if rate != RATE:
        size = math.ceil(audio.shape[-1] * RATE / rate)
        audio = soxr.resample(audio, rate, RATE, quality="soxr_hq").astype(np.float32)
        audio = audio[:size] if audio.shape[-1] >= size else np.pad(audio, (0, size - audio.shape[-1]))
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    if peak > 1.0:
        audio = audio / peak
    return np.clip(audio, -1.0, 1.0) if peak > 0.0 else audio


class Features:
    """The checkpoint's feature extractor (its `preprocessor_config.json`)."""

    def __init__(self, directory: Path) -> None:
        self.extractor = WhisperFeatureExtractor.from_pretrained(str(directory))

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        """audio: [S] float32 at 16 kHz → [M, F] log-mel features, F = the frames the clip fills."""
        out = self.extractor(audio, sampling_rate=RATE, padding="longest", truncation=False, return_attention_mask=True,
                             return_tensors="np")
        frames = int(out["attention_mask"][0].sum())
        features: np.ndarray = out["input_features"][0][:, :frames]
        return features
