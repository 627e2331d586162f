"""The log-mel spectrogram the Base checkpoint's speaker encoder was trained on.

Same analysis as the official `extract_speaker_embedding`: 24 kHz mono, a 1024-point STFT every 256 samples with a
periodic Hann window, 128 Slaney-scale, Slaney-normalised mel bands up to 12 kHz, natural log clamped at 1e-5.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

SAMPLE_RATE = 24_000
N_FFT = 1024
HOP = 256
WIN = 1024
N_MELS = 128
F_MIN = 0.0
F_MAX = 12_000.0
# the official reflect-pads the waveform by (N_FFT - HOP) / 2 itself and runs the STFT uncentred: frame t is
# centred on sample t * HOP + HOP / 2 (not t * HOP) and there are n // HOP frames (not torch.stft's n // HOP + 1)
EDGE_PAD = (N_FFT - HOP) // 2
MAGNITUDE_EPS = 1e-9  # inside the square root, as trained: a silent bin's magnitude is 3.2e-5, not 0
LOG_FLOOR = 1e-5

# Slaney's mel scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above (27 mels per factor 6.4)
_HZ_PER_MEL = 200.0 / 3
_LOG_START_HZ = 1000.0
_LOG_START_MEL = _LOG_START_HZ / _HZ_PER_MEL
_LOG_STEP = np.log(6.4) / 27.0


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    mel = hz / _HZ_PER_MEL
    high = hz >= _LOG_START_HZ
    mel[high] = _LOG_START_MEL + np.log(hz[high] / _LOG_START_HZ) / _LOG_STEP
    return mel


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    hz = _HZ_PER_MEL * mel
    high = mel >= _LOG_START_MEL
    hz[high] = _LOG_START_HZ * np.exp(_LOG_STEP * (mel[high] - _LOG_START_MEL))
    return hz


@lru_cache(maxsize=4)
def mel_filterbank(sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS,
                   f_min: float = F_MIN, f_max: float = F_MAX) -> Tensor:
    """Triangular mel filters, area-normalised (Slaney): [n_mels, n_fft // 2 + 1] float32, shared: never modify.

    Bit-identical to librosa.filters.mel, which the official calls: like librosa, each triangle is rounded to float32
    before the normalisation multiplies it. (transformers' mel_filter_bank rounds once, at the end, and so differs
    from librosa by an ulp in about 250 of the 65,664 entries.)
    """
    fft_hz = np.fft.rfftfreq(n_fft, 1.0 / sample_rate)  # [F]
    mel_lo, mel_hi = _hz_to_mel(np.array([f_min, f_max], dtype=np.float64))
    edges_mel = np.linspace(mel_lo, mel_hi, n_mels + 2)
    edges = _mel_to_hz(edges_mel)  # [M + 2]: band m rises over edges[m..m+1] and falls over edges[m+1..m+2]
    width = np.diff(edges)  # [M + 1]
    offset = edges[:, None] - fft_hz[None, :]  # [M + 2, F]
    rising = -offset[:-2] / width[:-1, None]
    falling = offset[2:] / width[1:, None]
    bank = np.maximum(0.0, np.minimum(rising, falling)).astype(np.float32)  # [M, F]
    area = 2.0 / (edges[2:] - edges[:-2])  # [M]: each triangle then has unit area over Hz
    bank = (bank * area[:, None]).astype(np.float32)
    return torch.from_numpy(bank)


@lru_cache(maxsize=4)
def hann_window(win: int = WIN) -> Tensor:
    return torch.hann_window(win)  # periodic (torch's default), as the official builds it


def min_samples() -> int:
    """The shortest waveform that gives one frame (the edge reflection also needs more than EDGE_PAD samples)."""
    return max(N_FFT - 2 * EDGE_PAD, EDGE_PAD + 1)


def frames_for(samples: int) -> int:
    return (samples + 2 * EDGE_PAD - N_FFT) // HOP + 1


def samples_for(frames: int) -> int:
    """The fewest samples that give `frames` frames (the inverse of frames_for)."""
    return (frames - 1) * HOP + N_FFT - 2 * EDGE_PAD


def log_mel(wav: Tensor) -> Tensor:
    """wav: [B, N] float32 in [-1, 1] at 24 kHz -> [B, N_MELS, T], T = frames_for(N)."""
    if wav.shape[-1] < min_samples():
        raise ValueError(f"audio too short for a mel frame: {wav.shape[-1]} samples, need {min_samples()}")
    padded = torch.nn.functional.pad(wav.unsqueeze(1), (EDGE_PAD, EDGE_PAD), mode="reflect").squeeze(1)
    spec = torch.stft(padded, N_FFT, hop_length=HOP, win_length=WIN, window=hann_window().to(wav.device),
                      center=False, normalized=False, onesided=True, return_complex=True)  # [B, F, T]
    # |X| as the official forms it: the squared parts summed, plus eps, under the root (not torch.abs)
    magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + MAGNITUDE_EPS)
    mel = torch.matmul(mel_filterbank().to(wav.device), magnitude)  # [B, M, T]
    return torch.log(torch.clamp(mel, min=LOG_FLOOR))
