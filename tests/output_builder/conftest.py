"""Fixtures shared by the output-side test modules: the codecs and their native kernels."""

from __future__ import annotations

import pytest

from output_builder.codecs import Qwen12HzCodec
from output_builder.codecs.native import NativeKernels, load_native
from tests.conftest import OFFICIAL_TINY


@pytest.fixture(scope="module")
def official() -> Qwen12HzCodec:
    """The 12 Hz codec of the tiny checkpoint the official package wrote (tests/fixtures/official)."""
    return Qwen12HzCodec.from_pretrained(OFFICIAL_TINY / "speech_tokenizer")


@pytest.fixture(scope="session")
def native_kernels() -> NativeKernels:
    """The codec's CPU kernels, compiled when the package was installed (setup.py): the suite's installs have them."""
    kernels = load_native()
    assert kernels is not None, "the install has no native codec kernels (setup.py builds them; see the log)"
    return kernels

