"""`bench compiled-step`'s comparison of two modes' greedy codes, and its knob that holds EOS off."""

from __future__ import annotations

import pytest

import talker.models.qwen3_tts.static as static_math
import talker.runner as eager_math
from benchmarks.compiled_step import agreement, launches, to_the_cap


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


SOURCE = '''
cpp_fused_add_0 = async_compile.cpp_pybinding(["float*"], "...")
class Runner:
    def call(self, args):
        buf0 = empty_strided_cpu((1, 64), (64, 1), torch.float32)
        cpp_fused_add_0(arg0_1, buf0)
        buf1 = torch.ops.talkstream.project.default(buf0, 3, 64)
        cpp_fused_mul_1(buf1)
        buf2 = extern_kernels.mm(buf1, arg1_1)
        triton_poi_fused_add_2.run(buf2, stream=stream0)
        return (buf2, )
'''


CPP_SOURCE = '''
extern "C"  void  cpp_fused_project_sin_0(const float* in_ptr0, float* out_ptr0);
void inductor_entry_impl(AtenTensorHandle* input_handles, AtenTensorHandle* output_handles) {
    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(2, int_array_0, int_array_1, f32, cpu, 0, &buf0_handle));
    cpp_fused_project_sin_0((const float*)(arg0_1.data_ptr()), (float*)(buf0.data_ptr()));
    {
        AOTI_TORCH_ERROR_CODE_CHECK(
            aoti_torch_call_dispatcher("talkstream::project", "", dispatch_vars.data())
        );
    }
    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_cpu_mm_out(buf3, buf2, arg1_1));
    cpp_fused_cos_1((float*)(buf3.data_ptr()));
    output_handles[0] = buf3.release();
} // inductor_entry_impl
extern "C"  void  cpp_fused_project_sin_0(const float* in_ptr0, float* out_ptr0)
{
}
'''


def test_launches_counts_the_kernels_and_library_calls_a_program_runs() -> None:
    assert launches(SOURCE) == (3, 2)  # cpp_fused_add_0's definition, above `call`, is not a launch
    assert launches(CPP_SOURCE) == (2, 2)  # the C++ wrapper's entry; the kernels' definitions are not launches
