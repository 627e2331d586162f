"""Chunk jobs → PCM: a look-ahead (the pending frames of a chunk heard early, while the request waits for text) gives
the same samples as the whole chunk later, so a request's audio does not depend on when it waited."""

from __future__ import annotations

import random

import numpy as np
import pytest

from output_builder.assembler import ChunkJob, RequestOutput
from output_builder.chunk_decoder import ChunkDecoder, InProcessCodec, padded
from output_builder.codecs import Qwen12HzCodec
from output_builder.codecs.native import NativeKernels
from output_builder.streams import AudioStream

EOS = 10_000  # outside the codebook: never drawn below


def play(codec: Qwen12HzCodec, frames: np.ndarray, held: list[bool]) -> tuple[bytes, int, int]:
    """Frames [G, F] pushed one at a time (`held[i]`: the text ran out at frame i), each job decoded at once, in
    order, then EOS. Returns the audio heard, the frames counted as heard, and the codec states left open."""
    backend = InProcessCodec(codec)
    decoder = ChunkDecoder(backend)
    out = RequestOutput("r", AudioStream("r", 24000, 8.0, lambda rid: None, lambda rid, paused: None), 1000, EOS,
                        1, 8)
    audio, heard = [], 0
    jobs: list[ChunkJob | None] = []
    for i in range(frames.shape[1]):
        jobs += [out.push(frames[:, i], held=held[i]), out.look_ahead()]
    jobs.append(out.push(np.full(frames.shape[0], EOS)))
    for job in jobs:
        if job is not None and job.codes is not None:
            (pcm,) = decoder.decode([job])
            assert pcm is not None
            audio.append(pcm.tobytes())
            heard += job.heard
    return b"".join(audio), heard, len(backend._states)


@pytest.mark.bitexact
@pytest.mark.parametrize("kernels", ["torch", "native"])
def test_looking_ahead_anywhere_gives_the_audio_of_never_looking_ahead(
    official: Qwen12HzCodec, native_kernels: NativeKernels, kernels: str,
) -> None:
    official.use_native(native_kernels if kernels == "native" else None)
    try:
        rng = np.random.default_rng(3)
        frames = rng.integers(0, official.config.codebook_size, (official.config.num_quantizers, 29))
        want, want_heard, _ = play(official, frames, [False] * 29)
        assert want_heard == 29 and len(want) == 29 * 1920 * 2
        draw = random.Random(8)
        for share in (0.2, 0.5, 1.0):  # how often the text runs out
            held = [draw.random() < share for _ in range(29)]
            got, heard, states = play(official, frames, held)
            assert got == want, held
            assert heard == 29 and states == 1  # a look-ahead keeps no state of its own
    finally:
        official.use_native(None)


def test_padding_repeats_the_last_frame_up_to_the_chunk_size() -> None:
    codes = np.arange(6).reshape(2, 3)
    assert padded(codes, 2) is codes and padded(codes, 3) is codes
    assert padded(codes, 5).tolist() == [[0, 1, 2, 2, 2], [3, 4, 5, 5, 5]]
