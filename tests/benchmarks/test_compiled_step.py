"""`bench compiled-step`'s comparison of two modes' greedy codes, and its knob that holds EOS off."""

from __future__ import annotations

import pytest

import talker.models.qwen3_tts.static as static_math
import talker.runner as eager_math
from benchmarks.compiled_step import agreement, to_the_cap


def test_agreement_counts_the_frames_before_the_first_difference() -> None:
    a = [[1, 2, 3], [4, 5, 6], [7, 8, 9], [1, 1, 1]]
    assert agreement(a, a) == {"frames": 4, "identical_prefix_frames": 4, "codes_equal": 1.0, "code0_equal": 1.0}
    b = [[1, 2, 3], [4, 5, 0], [7, 8, 9]]
    got = agreement(a, b)
    assert got["frames"] == 3 and got["identical_prefix_frames"] == 1 and got["code0_equal"] == 1.0
    assert got["codes_equal"] == round(8 / 9, 4)
    assert agreement([], b) == {"frames": 0}


def test_to_the_cap_holds_eos_off_in_both_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eager_math, "MIN_FRAMES_BEFORE_EOS", eager_math.MIN_FRAMES_BEFORE_EOS)
    monkeypatch.setattr(static_math, "MIN_FRAMES_BEFORE_EOS", static_math.MIN_FRAMES_BEFORE_EOS)
    to_the_cap()
    assert eager_math.MIN_FRAMES_BEFORE_EOS > 10**6 and static_math.MIN_FRAMES_BEFORE_EOS > 10**6
