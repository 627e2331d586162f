"""The codec's one decode routine (shared by the child process and the in-process path)."""

from __future__ import annotations

import numpy as np
import pytest

from output_builder.codec_process import DecodeRequest, decode_batch
from output_builder.codecs import CodecConfig, Qwen12HzCodec


def test_codes_outside_the_codebook_fail_the_call_before_they_reach_the_device() -> None:
    codec = Qwen12HzCodec.from_config(CodecConfig.tiny(), seed=11)
    states: dict[int, object] = {}
    good = np.zeros((16, 2), dtype=np.int64)
    assert [p.shape for p in decode_batch(codec, states, DecodeRequest([(1, good)]))] == [
        (2 * codec.samples_per_frame,)]
    bad = good.copy()
    bad[0, 1] = codec.config.codebook_size  # e.g. a special token of the Talker's codebook 0
    with pytest.raises(ValueError, match="outside the codebook"):
        decode_batch(codec, states, DecodeRequest([(1, good), (2, bad)], closed=[2]))
    assert 2 not in states
    assert len(decode_batch(codec, states, DecodeRequest([(1, good)]))) == 1  # the stream goes on
