"""The Base checkpoint's speaker encoder: an ECAPA-TDNN that turns a reference voice into one x-vector.

Parameter names are the checkpoint's (under `speaker_encoder.`), hyper-parameters its config.json
`speaker_encoder_config`. The numbers match the official `extract_speaker_embedding` in float32; the encoder always
runs in float32 here, whatever the checkpoint's dtype, since it runs once per reference voice and is small.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from engine.voices import mel
from talker.models.loader import read_weights
from talker.models.qwen3_tts.config import CheckpointError, read_json

PREFIX = "speaker_encoder."
STD_FLOOR = 1e-12  # variance floor of the pooling statistics, as trained: a constant channel's std is 1e-6, not 0


@dataclass(frozen=True, slots=True)
class SpeakerEncoderArch:
    """config.json `speaker_encoder_config`; a missing key takes the official default."""

    mel_dim: int = 128
    enc_dim: int = 1024
    channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    attention_channels: int = 128
    res2net_scale: int = 8
    se_channels: int = 128
    sample_rate: int = 24_000

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str) -> SpeakerEncoderArch:
        base = cls()
        try:
            arch = cls(
                mel_dim=int(d.get("mel_dim", base.mel_dim)),
                enc_dim=int(d.get("enc_dim", base.enc_dim)),
                channels=tuple(int(c) for c in d.get("enc_channels", base.channels)),
                kernel_sizes=tuple(int(k) for k in d.get("enc_kernel_sizes", base.kernel_sizes)),
                dilations=tuple(int(k) for k in d.get("enc_dilations", base.dilations)),
                attention_channels=int(d.get("enc_attention_channels", base.attention_channels)),
                res2net_scale=int(d.get("enc_res2net_scale", base.res2net_scale)),
                se_channels=int(d.get("enc_se_channels", base.se_channels)),
                sample_rate=int(d.get("sample_rate", base.sample_rate)),
            )
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"malformed speaker_encoder_config in {where}: {exc}") from exc
        arch.check(where)
        return arch

    def check(self, where: str) -> None:
        n = len(self.channels)
        if n < 3 or len(self.kernel_sizes) != n or len(self.dilations) != n:
            raise CheckpointError(f"speaker_encoder_config in {where}: enc_channels, enc_kernel_sizes and "
                                  f"enc_dilations need one entry per layer (at least 3), got "
                                  f"{self.channels}, {self.kernel_sizes}, {self.dilations}")
        if any(c % self.res2net_scale for c in self.channels[1:-1]):
            raise CheckpointError(f"speaker_encoder_config in {where}: enc_channels {self.channels[1:-1]} "
                                  f"must split into enc_res2net_scale={self.res2net_scale} parts")
        if self.mel_dim != mel.N_MELS or self.sample_rate != mel.SAMPLE_RATE:
            raise CheckpointError(f"speaker_encoder_config in {where}: only {mel.N_MELS} mel bins at "
                                  f"{mel.SAMPLE_RATE} Hz are supported, got {self.mel_dim} at {self.sample_rate}")

    @property
    def min_frames(self) -> int:
        """The reflect padding of every 'same' convolution needs more frames than it pads on one side."""
        return 1 + max(d * (k - 1) - d * (k - 1) // 2 for k, d in zip(self.kernel_sizes, self.dilations, strict=True))


def _conv(c_in: int, c_out: int, kernel: int = 1, dilation: int = 1) -> nn.Conv1d:
    # the checkpoint was trained with 'same' reflect padding, not zeros: the edge frames see mirrored context
    return nn.Conv1d(c_in, c_out, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class Tdnn(nn.Module):
    """A time-delay layer: a dilated convolution over frames, then ReLU."""

    def __init__(self, c_in: int, c_out: int, kernel: int = 1, dilation: int = 1) -> None:
        super().__init__()
        self.conv = _conv(c_in, c_out, kernel, dilation)

    def forward(self, x: Tensor) -> Tensor:  # x: [B, C_in, T] -> [B, C_out, T]
        return torch.relu(self.conv(x))


class Res2Net(nn.Module):
    """Channel groups processed in a chain, each seeing the previous group's output: a ladder of receptive fields."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int) -> None:
        super().__init__()
        width = channels // scale
        self.scale = scale
        # the first group passes through untouched, so there is one layer fewer than groups
        self.blocks = nn.ModuleList(Tdnn(width, width, kernel, dilation) for _ in range(scale - 1))

    def forward(self, x: Tensor) -> Tensor:  # x: [B, C, T] -> [B, C, T]
        groups = torch.chunk(x, self.scale, dim=1)  # scale x [B, C / scale, T]
        outs = [groups[0]]
        for i, layer in enumerate(self.blocks, start=1):
            outs.append(layer(groups[i] if i == 1 else groups[i] + outs[-1]))
        return torch.cat(outs, dim=1)


class SqueezeExcite(nn.Module):
    """Rescales each channel by a gate computed from the whole utterance's mean."""

    def __init__(self, channels: int, bottleneck: int) -> None:
        super().__init__()
        self.conv1 = _conv(channels, bottleneck)
        self.conv2 = _conv(bottleneck, channels)

    def forward(self, x: Tensor) -> Tensor:  # x: [B, C, T]
        gate = torch.sigmoid(self.conv2(torch.relu(self.conv1(x.mean(dim=2, keepdim=True)))))  # [B, C, 1]
        return x * gate


class SeRes2NetBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, arch: SpeakerEncoderArch, kernel: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = Tdnn(c_in, c_out)
        self.res2net_block = Res2Net(c_out, arch.res2net_scale, kernel, dilation)
        self.tdnn2 = Tdnn(c_out, c_out)
        self.se_block = SqueezeExcite(c_out, arch.se_channels)

    def forward(self, x: Tensor) -> Tensor:  # x: [B, C, T] -> [B, C, T]
        y = self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))
        return y + x


def weighted_stats(x: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and standard deviation over frames under weights that sum to one.

    x: [B, C, T], w: [B, 1 or C, T] -> mean, std: [B, C]
    """
    mean = (w * x).sum(dim=2)
    var = (w * (x - mean.unsqueeze(2)).pow(2)).sum(dim=2)
    return mean, torch.sqrt(var.clamp(min=STD_FLOOR))


class AttentivePooling(nn.Module):
    """Per-channel attention over frames, conditioned on the utterance's global mean and std; returns the
    attention-weighted mean and std, concatenated."""

    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = Tdnn(channels * 3, attention_channels)
        self.conv = _conv(attention_channels, channels)

    def forward(self, x: Tensor) -> Tensor:  # x: [B, C, T] -> [B, 2C, 1]
        frames = x.shape[2]
        # uniform weights 1/T rather than x.mean: the official forms the global statistics this way (a mask over
        # a batch of one length), and the rounding then matches
        uniform = torch.ones_like(x[:, :1]) / frames  # [B, 1, T]
        mean, std = weighted_stats(x, uniform)
        context = torch.cat([x, mean.unsqueeze(2).expand_as(x), std.unsqueeze(2).expand_as(x)], dim=1)  # [B, 3C, T]
        # ReLU (inside the TDNN) and then tanh, as trained: the scores are squashed into [0, 1)
        scores = self.conv(torch.tanh(self.tdnn(context)))  # [B, C, T]
        mean, std = weighted_stats(x, torch.softmax(scores, dim=2))
        return torch.cat([mean, std], dim=1).unsqueeze(2)


class SpeakerEncoder(nn.Module):
    """ECAPA-TDNN: log-mel frames -> one x-vector of `dim` floats."""

    def __init__(self, arch: SpeakerEncoderArch) -> None:
        super().__init__()
        self.arch = arch
        ch, ks, ds = arch.channels, arch.kernel_sizes, arch.dilations
        self.blocks = nn.ModuleList([Tdnn(arch.mel_dim, ch[0], ks[0], ds[0])])
        self.blocks.extend(SeRes2NetBlock(ch[i - 1], ch[i], arch, ks[i], ds[i]) for i in range(1, len(ch) - 1))
        # multi-layer aggregation reads every SE-Res2Net block's output side by side
        self.mfa = Tdnn(sum(ch[1:-1]), ch[-1], ks[-1], ds[-1])
        self.asp = AttentivePooling(ch[-1], arch.attention_channels)
        self.fc = _conv(ch[-1] * 2, arch.enc_dim)

    @property
    def sample_rate(self) -> int:
        return self.arch.sample_rate

    @property
    def dim(self) -> int:
        return self.arch.enc_dim

    @property
    def min_samples(self) -> int:
        return max(mel.min_samples(), mel.samples_for(self.arch.min_frames))

    def forward(self, mels: Tensor) -> Tensor:  # mels: [B, M, T] -> [B, enc_dim]
        x = self.blocks[0](mels)
        outs = []
        for block in self.blocks[1:]:
            x = block(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs, dim=1))  # [B, C_last, T]
        return self.fc(self.asp(x)).squeeze(2)

    def embed(self, wav: np.ndarray) -> Tensor:
        """wav: [N] float32 mono samples at 24 kHz in [-1, 1] -> the x-vector [dim], float32, on the CPU."""
        samples = np.asarray(wav)
        if samples.ndim != 1:
            raise ValueError(f"speaker encoder takes mono audio as one dimension, got shape {samples.shape}")
        if samples.shape[0] < self.min_samples:
            raise ValueError(f"reference audio too short for the speaker encoder: {samples.shape[0]} samples, "
                             f"need at least {self.min_samples} ({self.min_samples / self.sample_rate:.3f} s)")
        device = self.fc.weight.device
        with torch.inference_mode():
            x = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32)).to(device).unsqueeze(0)  # [1, N]
            return self(mel.log_mel(x))[0].float().cpu()


def _expected_shapes(arch: SpeakerEncoderArch) -> dict[str, torch.Size]:
    with torch.device("meta"):
        return {k: v.shape for k, v in SpeakerEncoder(arch).state_dict().items()}


def _check_weights(weights: dict[str, Tensor], arch: SpeakerEncoderArch, where: Path) -> None:
    expected = _expected_shapes(arch)
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    wrong = sorted(k for k in set(expected) & set(weights) if weights[k].shape != expected[k])
    if missing or unexpected or wrong:
        shapes = "; ".join(f"{PREFIX}{k} {tuple(weights[k].shape)} != {tuple(expected[k])}" for k in wrong[:5])
        raise CheckpointError(f"speaker encoder weights in {where} do not match speaker_encoder_config: "
                              f"missing [{_few(missing)}], unexpected [{_few(unexpected)}], wrong shape [{shapes}]")


def _few(keys: list[str]) -> str:
    return ", ".join(PREFIX + k for k in keys[:5]) + (" …" if len(keys) > 5 else "")


def load_speaker_encoder(directory: Path, device: torch.device | None = None) -> SpeakerEncoder | None:
    """The checkpoint's speaker encoder in float32, or None when it has none (CustomVoice, VoiceDesign)."""
    directory = Path(directory)
    weights = {k.removeprefix(PREFIX): v for k, v in read_weights(directory).items() if k.startswith(PREFIX)}
    if not weights:
        return None
    config_path = directory / "config.json"
    config = read_json(config_path).get("speaker_encoder_config")
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path} has no speaker_encoder_config, yet the weights hold a speaker encoder")
    arch = SpeakerEncoderArch.from_dict(config, str(config_path))
    _check_weights(weights, arch, directory / "model.safetensors")
    with torch.device("meta"):  # no random initialisation: it would be overwritten, and it would draw from the RNG
        model = SpeakerEncoder(arch)
    model.load_state_dict({k: v.float().contiguous() for k, v in weights.items()}, assign=True, strict=True)
    model = model.to(device or torch.device("cpu"))
    model.eval().requires_grad_(False)
    return model
