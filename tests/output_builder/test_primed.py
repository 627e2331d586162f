"""A codec stream primed with a cloned voice's reference goes on exactly as a decode of the reference and the
new frames together, from which the reference's audio is cut; the primed state is made once per reference."""

from __future__ import annotations

import numpy as np
import torch

from output_builder.codec_process import DecodeRequest, decode_batch
from output_builder.codecs.qwen12hz import Qwen12HzCodec
from output_builder.primed import PrimedStates


def codes(seed: int, frames: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2048, (16, frames), dtype=np.int64)  # [G, F]


def test_a_primed_stream_continues_the_reference_and_is_made_once(official: Qwen12HzCodec) -> None:
    reference, spoken = codes(1, 20), codes(2, 6)
    whole = official.decode(torch.from_numpy(np.concatenate([reference, spoken], axis=1))[None])[0].numpy()
    primed = PrimedStates(size=2)
    for _ in range(2):  # the second start copies the kept state
        stream = primed.open(official, reference)
        assert stream.frames_decoded == 20
        (wave,) = official.decode_streams([(stream, torch.from_numpy(spoken))])
        assert np.abs(wave.numpy() - whole[20 * 1920:]).max() < 1e-5
    assert len(primed) == 1
    for seed in (3, 4):  # the least recently used reference goes first
        primed.open(official, codes(seed, 2))
    assert len(primed) == 2


def test_a_decode_call_hears_only_the_frames_after_the_context(official: Qwen12HzCodec) -> None:
    reference, spoken = codes(5, 8), codes(6, 3)
    states: dict[int, object] = {}
    job = np.concatenate([reference, spoken], axis=1)
    primed = PrimedStates()
    (pcm,) = decode_batch(official, states, DecodeRequest([(7, job)], context={7: 8}), None, primed)
    assert pcm.shape == (3 * 1920,)
    assert len(primed) == 1  # kept: the voice's next request starts from it (an empty cache is still the cache)
    (again,) = decode_batch(official, states, DecodeRequest([(9, job)], context={9: 8}), None, primed)
    assert np.array_equal(again, pcm) and len(primed) == 1
    (plain,) = decode_batch(official, {}, DecodeRequest([(8, job)]))
    assert np.abs(pcm.astype(np.int32) - plain[8 * 1920:].astype(np.int32)).max() <= 1
