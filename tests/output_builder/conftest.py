"""Codec fixtures shared by the codec test modules."""

from __future__ import annotations

import pytest

from output_builder.codecs import Qwen12HzCodec
from tests.conftest import OFFICIAL_TINY


@pytest.fixture(scope="module")
def official() -> Qwen12HzCodec:
    """The 12 Hz codec of the tiny checkpoint the official package wrote (shared fixtures)."""
    codec_dir = OFFICIAL_TINY / "speech_tokenizer"
    if not codec_dir.is_dir():
        pytest.skip("shared Qwen3-TTS fixture not present")
    return Qwen12HzCodec.from_pretrained(codec_dir)
