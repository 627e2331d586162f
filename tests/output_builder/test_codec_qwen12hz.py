"""Qwen3-TTS 12 Hz codec decoder: official parity, streaming exactness, batching, init and checkpoint I/O.

``tests/fixtures/codec_tiny_official_decode.npz`` was made by the official ``qwen-tts==0.1.1`` package
(transformers 4.57.3, torch 2.13.0 CPU): ``Qwen3TTSTokenizerV2Model.from_pretrained(<speech_tokenizer dir>)``,
then ``model.decode(codes.transpose(1, 2))`` with ``codes = torch.randint(0, 2048, (2, 16, 40),
generator=torch.Generator().manual_seed(0))``; both sdpa and eager attention gave the same waveform.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from output_builder.codecs import ChunkJob, CodecConfig, Qwen12HzCodec, Qwen12HzDecoder
from tests.conftest import OFFICIAL_TINY

CODEC_DIR = OFFICIAL_TINY / "speech_tokenizer"
OFFICIAL_NPZ = Path(__file__).resolve().parents[1] / "fixtures" / "codec_tiny_official_decode.npz"
SPF = 1920


@pytest.fixture(scope="module")
def random_codec() -> Qwen12HzCodec:
    return Qwen12HzCodec.from_config(CodecConfig.tiny(), seed=7)


@pytest.fixture(scope="module")
def short_window_codec() -> Qwen12HzCodec:
    """Two transformer layers with an 8-frame window: a 26-frame receptive field keeps streams short."""
    cfg = replace(CodecConfig.tiny(), num_hidden_layers=2, sliding_window=8)
    return Qwen12HzCodec.from_config(cfg, seed=5)


def random_codes(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, shape, generator=torch.Generator().manual_seed(seed))


def chunk_plan(total: int, context: int, first: int = 2, step: int = 8) -> list[tuple[int, int, int]]:
    """(start, end, context) per chunk: a small first chunk, then ``step`` frames, ``context`` behind."""
    plan, start, size = [], 0, first
    while start < total:
        end = min(start + size, total)
        plan.append((start, end, min(context, start)))
        start, size = end, step
    return plan


def stream_batched(codec: Qwen12HzCodec, streams: list[torch.Tensor]) -> list[list[tuple[int, torch.Tensor]]]:
    """Decodes several [Q, T_i] streams in lockstep, one ``decode_chunks`` batch per round."""
    plans = [chunk_plan(s.shape[-1], codec.left_context_frames) for s in streams]
    pieces: list[list[tuple[int, torch.Tensor]]] = [[] for _ in streams]
    for rnd in range(max(len(p) for p in plans)):
        active = [i for i, p in enumerate(plans) if rnd < len(p)]
        jobs = []
        for i in active:
            start, end, ctx = plans[i][rnd]
            jobs.append(ChunkJob(streams[i][:, start - ctx : end], ctx))
        for i, wav in zip(active, codec.decode_chunks(jobs), strict=True):
            pieces[i].append((plans[i][rnd][0], wav))
    return pieces


def test_matches_official_decoder_on_fixture(official: Qwen12HzCodec) -> None:
    ref = np.load(OFFICIAL_NPZ)
    wav = official.decode(torch.from_numpy(ref["codes"]))
    assert wav.dtype == torch.float32 and wav.shape == (2, 40 * SPF)
    np.testing.assert_allclose(wav.numpy(), ref["wav"], rtol=0, atol=1e-4)


def test_fixture_geometry(official: Qwen12HzCodec) -> None:
    assert (official.sample_rate, official.samples_per_frame, official.num_quantizers) == (24000, SPF, 16)
    assert official.receptive_field_frames == 83
    assert official.left_context_frames == 83


def test_left_context_is_capped_for_real_sized_models() -> None:
    real = CodecConfig()
    with torch.device("meta"):
        codec = Qwen12HzCodec(Qwen12HzDecoder(real))
    assert codec.receptive_field_frames == 8 * 71 + 12
    assert codec.left_context_frames == 96
    codec.max_left_context = 200
    assert codec.left_context_frames == 200


@pytest.mark.parametrize(
    ("which", "lengths"), [("official", (92, 41, 9)), ("short_window_codec", (45, 30, 3))]
)
def test_streaming_equals_one_shot_at_every_seam(
    which: str, lengths: tuple[int, ...], request: pytest.FixtureRequest
) -> None:
    codec: Qwen12HzCodec = request.getfixturevalue(which)
    assert max(lengths) > codec.left_context_frames + 8
    streams = [random_codes((16, n), seed=n) for n in lengths]
    pieces = stream_batched(codec, streams)
    for stream, parts in zip(streams, pieces, strict=True):
        full = codec.decode(stream[None])[0]
        assert sum(p.numel() for _, p in parts) == full.numel()
        for start, part in parts:
            expect = full[start * SPF : start * SPF + part.numel()]
            err = (part - expect).abs().max().item()
            assert err <= 1e-5, f"chunk at frame {start} of {stream.shape[-1]}: max error {err}"
        assert torch.allclose(torch.cat([p for _, p in parts]), full, rtol=0, atol=1e-5)


def test_right_padding_in_a_batch_changes_nothing(random_codec: Qwen12HzCodec) -> None:
    jobs = [ChunkJob(random_codes((16, n), seed=n), c) for n, c in ((30, 22), (5, 0), (17, 9))]
    batched = random_codec.decode_chunks(jobs)
    for job, got in zip(jobs, batched, strict=True):
        (alone,) = random_codec.decode_chunks([job])
        assert got.shape == (job.new_frames * SPF,) and got.dtype == torch.float32
        assert torch.allclose(got, alone, rtol=0, atol=1e-5)


@pytest.mark.bitexact
def test_receptive_field_is_tight(short_window_codec: Qwen12HzCodec) -> None:
    codec = short_window_codec
    reach = codec.receptive_field_frames
    assert reach == 2 * 7 + 12
    codes = random_codes((1, 16, reach + 3), seed=1)
    changed = codes.clone()
    changed[:, :, 0] = (changed[:, :, 0] + 1) % 2048
    a, b = codec.decode(codes)[0], codec.decode(changed)[0]
    assert torch.equal(a[(reach + 1) * SPF :], b[(reach + 1) * SPF :])
    assert not torch.equal(a[reach * SPF : (reach + 1) * SPF], b[reach * SPF : (reach + 1) * SPF])


@pytest.mark.bitexact
def test_from_config_is_audible_and_seeded(random_codec: Qwen12HzCodec) -> None:
    codes = random_codes((2, 16, 12), seed=3)
    wav = random_codec.decode(codes)
    rms = wav.pow(2).mean().sqrt().item()
    assert not torch.isnan(wav).any() and wav.abs().max() <= 1.0
    assert 0.05 <= rms <= 0.5
    same = Qwen12HzCodec.from_config(CodecConfig.tiny(), seed=7).decode(codes)
    other = Qwen12HzCodec.from_config(CodecConfig.tiny(), seed=8).decode(codes)
    assert torch.equal(wav, same) and not torch.equal(wav, other)


@pytest.mark.bitexact
def test_save_and_reload_round_trip(random_codec: Qwen12HzCodec, tmp_path: Path) -> None:
    random_codec.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "qwen3_tts_tokenizer_12hz"
    assert config["encoder_config"]["model_type"] == "mimi"
    assert config["decoder_config"]["sliding_window"] == 72
    assert all(k.startswith("decoder.") for k in load_file(tmp_path / "model.safetensors"))
    reloaded = Qwen12HzCodec.from_pretrained(tmp_path)
    codes = random_codes((1, 16, 6), seed=4)
    assert torch.equal(reloaded.decode(codes), random_codec.decode(codes))


def test_resave_keeps_fixture_template(official: Qwen12HzCodec, tmp_path: Path) -> None:
    official.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    original = json.loads((CODEC_DIR / "config.json").read_text())
    assert saved["encoder_config"] == original["encoder_config"]
    assert CodecConfig.from_dict(saved) == CodecConfig.from_dict(original) == official.config


def test_config_dict_round_trip() -> None:
    cfg = CodecConfig.tiny()
    assert CodecConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="decode_upsample_rate"):
        CodecConfig(upsample_rates=(8, 5, 4))


def test_load_errors_name_the_file(random_codec: Qwen12HzCodec, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        Qwen12HzCodec.from_pretrained(tmp_path)
    random_codec.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    state = load_file(weights)
    state["decoder.extra.weight"] = torch.zeros(1)
    del state["decoder.pre_conv.conv.bias"]
    save_file(state, weights)
    with pytest.raises(ValueError, match=r"model\.safetensors.*pre_conv\.conv\.bias.*extra\.weight"):
        Qwen12HzCodec.from_pretrained(tmp_path)
    weights.unlink()
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors"):
        Qwen12HzCodec.from_pretrained(tmp_path)


def test_bad_inputs_are_rejected(random_codec: Qwen12HzCodec) -> None:
    with pytest.raises(ValueError, match="expected codes"):
        random_codec.decode(random_codes((1, 15, 4), seed=0))
    with pytest.raises(ValueError, match="context"):
        random_codec.decode_chunks([ChunkJob(random_codes((16, 4), seed=0), 5)])
    assert random_codec.decode(random_codes((2, 16, 0), seed=0)).shape == (2, 0)
    assert random_codec.decode_chunks([]) == []
