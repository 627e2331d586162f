"""The README's TALKSTREAM_DTYPE: `auto` is bf16 on CUDA and fp32 on the CPU; the names it lists, and no others."""

from __future__ import annotations

import pytest
import torch

from talker.models.loader import resolve_dtype

CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # a device object only: nothing runs on it


def test_auto_is_bf16_on_cuda_and_fp32_on_the_cpu() -> None:
    assert resolve_dtype("auto", CUDA) is torch.bfloat16
    assert resolve_dtype("auto", CPU) is torch.float32


@pytest.mark.parametrize(("name", "dtype"), [("float32", torch.float32), ("bfloat16", torch.bfloat16),
                                             ("float16", torch.float16), ("bf16", torch.bfloat16)])
def test_a_named_dtype_is_taken_on_any_device(name: str, dtype: torch.dtype) -> None:
    assert resolve_dtype(name, CPU) is dtype and resolve_dtype(name, CUDA) is dtype


def test_an_unknown_dtype_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown dtype 'float8'.*bfloat16"):
        resolve_dtype("float8", CPU)
