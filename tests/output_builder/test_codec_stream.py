"""Stateful streaming decode of the Qwen3-TTS 12 Hz codec: any chunking or batching equals one-shot."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch

from output_builder.codecs import CodecConfig, Qwen12HzCodec, Qwen12HzDecoder
from output_builder.codecs.native import NativeKernels
from output_builder.codecs.qwen12hz_stream import DecodeStream, StreamingDecoder
from tests.conftest import OFFICIAL_TINY

CODEC_DIR = OFFICIAL_TINY / "speech_tokenizer"
SPF = 1920
FRAMES = 110  # past the 72-frame attention window and the 83-frame receptive field
TOL = 1e-5
Plan = tuple[tuple[int, ...], tuple[int, ...]]  # chunk sizes: a prefix, then a repeating cycle
PLANS: dict[str, Plan] = {
    "ones": ((), (1,)),
    "two_then_eights": ((2,), (8,)),
    "three_five_seven": ((), (3, 5, 7)),
}


@pytest.fixture(scope="module")
def random_codec() -> Qwen12HzCodec:
    return Qwen12HzCodec.from_config(CodecConfig.tiny(), seed=11)


@pytest.fixture(scope="module")
def gqa_codec() -> Qwen12HzCodec:
    """Two layers, grouped-query attention and an 8-frame window: eviction within a few chunks."""
    cfg = replace(CodecConfig.tiny(), num_hidden_layers=2, num_key_value_heads=1, sliding_window=8)
    return Qwen12HzCodec.from_config(cfg, seed=3)


@pytest.fixture(params=["torch", "native"])
def ops(request: pytest.FixtureRequest, native_kernels: NativeKernels) -> Iterator[NativeKernels | None]:
    """Runs a test on the torch ops and on the fused native kernels; codecs pass it to ``use_native``."""
    yield native_kernels if request.param == "native" else None


def random_codes(frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (16, frames), generator=torch.Generator().manual_seed(seed))


def chunk_sizes(plan: Plan, total: int) -> Iterator[int]:
    """The plan's sizes, the last one clipped so that they add up to ``total``."""
    done, (prefix, cycle) = 0, plan
    for size in itertools.chain(prefix, itertools.cycle(cycle)):
        if done >= total:
            return
        yield min(size, total - done)
        done += size


def max_error(got: torch.Tensor, want: torch.Tensor) -> float:
    assert got.shape == want.shape
    return (got - want).abs().max().item()


def stream_alone(codec: Qwen12HzCodec, codes: torch.Tensor, plan: Plan) -> torch.Tensor:
    stream, pieces, start = codec.open_stream(), [], 0
    for n in chunk_sizes(plan, codes.shape[-1]):
        (wav,) = codec.decode_streams([(stream, codes[:, start : start + n])])
        assert wav.shape == (n * SPF,) and wav.dtype == torch.float32
        pieces.append(wav)
        start += n
        assert stream.frames_decoded == start
    return torch.cat(pieces)


def stream_together(
    codec: Qwen12HzCodec, streams: list[torch.Tensor], plans: list[Plan]
) -> list[torch.Tensor]:
    """Decodes the streams in lockstep, one ``decode_streams`` call per round with every active stream."""
    states = [codec.open_stream() for _ in streams]
    chunks = [list(chunk_sizes(p, s.shape[-1])) for p, s in zip(plans, streams, strict=True)]
    pieces: list[list[torch.Tensor]] = [[] for _ in streams]
    for rnd in range(max(len(c) for c in chunks)):
        active = [i for i, c in enumerate(chunks) if rnd < len(c)]
        jobs = []
        for i in active:
            start = states[i].frames_decoded
            jobs.append((states[i], streams[i][:, start : start + chunks[i][rnd]]))
        for i, wav in zip(active, codec.decode_streams(jobs), strict=True):
            pieces[i].append(wav)
    return [torch.cat(p) for p in pieces]


@pytest.mark.parametrize("plan", PLANS.values(), ids=PLANS.keys())
@pytest.mark.parametrize("which", ["official", "random_codec"])
def test_chunked_stream_equals_one_shot(
    which: str, plan: Plan, ops: NativeKernels | None, request: pytest.FixtureRequest
) -> None:
    codec: Qwen12HzCodec = request.getfixturevalue(which)
    codec.use_native(ops)
    codes = random_codes(FRAMES, seed=sum(plan[1]))
    full = codec.decode(codes[None])[0]
    err = max_error(stream_alone(codec, codes, plan), full)
    assert err <= TOL, f"{which} {plan}: max error {err}"


@pytest.mark.parametrize("which", ["official", "random_codec", "gqa_codec"])
def test_streams_decoded_together_each_equal_their_one_shot(
    which: str, ops: NativeKernels | None, request: pytest.FixtureRequest
) -> None:
    codec: Qwen12HzCodec = request.getfixturevalue(which)
    codec.use_native(ops)
    streams = [random_codes(n, seed=n) for n in (FRAMES, 77, 30)]
    plans = [PLANS["three_five_seven"], PLANS["ones"], PLANS["two_then_eights"]]
    for codes, got in zip(streams, stream_together(codec, streams, plans), strict=True):
        err = max_error(got, codec.decode(codes[None])[0])
        assert err <= TOL, f"{codes.shape[-1]} frames: max error {err}"


@pytest.mark.parametrize("which", ["random_codec", "gqa_codec"])
def test_two_streams_sharing_every_call_each_keep_their_own_state(which: str, request: pytest.FixtureRequest) -> None:
    """The same chunk sizes put two streams in one group per call: the smallest batch whose states are packed
    and unpacked together (a mutation test found none of the tests above forms a group of exactly two)."""
    codec: Qwen12HzCodec = request.getfixturevalue(which)
    streams = [random_codes(40, seed=seed) for seed in (11, 12)]
    plans = [PLANS["two_then_eights"]] * 2
    for codes, got in zip(streams, stream_together(codec, streams, plans), strict=True):
        assert max_error(got, codec.decode(codes[None])[0]) <= TOL


def test_batch_mates_do_not_change_a_stream(random_codec: Qwen12HzCodec, ops: NativeKernels | None) -> None:
    codec, codes = random_codec, random_codes(96, seed=1)
    codec.use_native(ops)
    alone = stream_alone(codec, codes, ((), (8,)))
    mates = [codec.open_stream() for _ in range(3)]
    codec.decode_streams([(mates[0], random_codes(40, seed=2))])  # mates sit at other positions
    codec.decode_streams([(mates[1], random_codes(5, seed=3))])
    target, pieces = codec.open_stream(), []
    for rnd in range(12):
        jobs = [(target, codes[:, 8 * rnd : 8 * rnd + 8])]
        jobs += [(m, random_codes(8, seed=10 * rnd + j)) for j, m in enumerate(mates[: rnd % 4])]
        pieces.append(codec.decode_streams(jobs)[0])
    assert max_error(torch.cat(pieces), alone) <= TOL


@pytest.mark.bitexact
def test_a_decode_run_between_the_stages_of_another_changes_neither(
    random_codec: Qwen12HzCodec, ops: NativeKernels | None
) -> None:
    codec = random_codec
    codec.use_native(ops)
    backlog = [random_codes(8, seed=20 + i) for i in range(3)] + [random_codes(4, seed=30)]
    first = random_codes(1, seed=40)

    def call(codes: list[torch.Tensor]) -> list[torch.Tensor]:
        return codec.decode_streams([(codec.open_stream(), c) for c in codes])

    want_backlog, want_first = call(backlog), call([first])
    got_first: list[list[torch.Tensor]] = []
    stages = 0

    def between() -> None:  # what the codec process does with a first chunk that arrives mid-call
        nonlocal stages
        stages += 1
        if stages == 3:
            codec.between_stages(None)
            got_first.append(call([first]))
            codec.between_stages(between)

    codec.between_stages(between)
    try:
        got_backlog = call(backlog)
    finally:
        codec.between_stages(None)
    assert stages >= 10  # both chunk lengths: ~15 stages each, none longer than a decoder block's residual unit
    assert len(got_first) == 1 and torch.equal(got_first[0][0], want_first[0])
    assert all(torch.equal(g, w) for g, w in zip(got_backlog, want_backlog, strict=True))


def test_equal_chunk_lengths_share_one_batch(
    random_codec: Qwen12HzCodec, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches: list[int] = []
    step = StreamingDecoder.step

    def spy(
        self: StreamingDecoder, codes: torch.Tensor, slots: list[torch.Tensor], start: torch.Tensor
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        batches.append(int(codes.shape[0]))
        return step(self, codes, slots, start)

    monkeypatch.setattr(StreamingDecoder, "step", spy)
    states = [random_codec.open_stream() for _ in range(5)]
    sizes = (4, 2, 4, 4, 2)
    out = random_codec.decode_streams(
        [(s, random_codes(n, seed=n)) for s, n in zip(states, sizes, strict=True)]
    )
    assert sorted(batches) == [2, 3]
    assert [w.numel() for w in out] == [n * SPF for n in sizes]


@pytest.mark.parametrize("which", ["official", "gqa_codec"])
def test_state_memory_is_bounded(which: str, request: pytest.FixtureRequest) -> None:
    codec: Qwen12HzCodec = request.getfixturevalue(which)
    cfg = codec.config
    stream = codec.open_stream()
    size = stream.nbytes()
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.sliding_window - 1) * cfg.head_dim * 4
    assert kv < size < kv + 64 * 1024
    codes = random_codes(cfg.sliding_window + 40, seed=0)
    for start in range(0, codes.shape[-1], 10):
        codec.decode_streams([(stream, codes[:, start : start + 10])])
        assert stream.nbytes() == size


def test_state_size_of_the_real_model() -> None:
    with torch.device("meta"):
        codec = Qwen12HzCodec(Qwen12HzDecoder(CodecConfig()))
    kv = 2 * 8 * 16 * 71 * 64 * 4
    assert kv < codec.open_stream().nbytes() < kv + 1024 * 1024


def test_bad_jobs_are_rejected(random_codec: Qwen12HzCodec, gqa_codec: Qwen12HzCodec) -> None:
    stream = random_codec.open_stream()
    with pytest.raises(ValueError, match="more than one job"):
        random_codec.decode_streams([(stream, random_codes(2, 0)), (stream, random_codes(3, 0))])
    with pytest.raises(ValueError, match=r"\[16, N\]"):
        random_codec.decode_streams([(stream, random_codes(2, 0)[:15])])
    with pytest.raises(ValueError, match="different codec"):
        gqa_codec.decode_streams([(stream, random_codes(2, 0))])
    (empty,) = random_codec.decode_streams([(stream, random_codes(0, 0))])
    assert empty.shape == (0,) and stream.frames_decoded == 0
    assert random_codec.decode_streams([]) == []
    assert isinstance(stream, DecodeStream)
