"""Torch threads per worker: the plan the engine takes from the model's size and the machine's cores."""

from __future__ import annotations

from talker.device import SMALL_STEP_PARAMS, Threads, thread_plan, usable_cores


def test_a_small_model_gets_one_thread_per_worker_whatever_the_cores() -> None:
    assert thread_plan(0, 200_000, 16) == Threads(talker=1, codec=1)


def test_at_real_sizes_the_codec_gets_a_quarter_of_the_cores_and_the_talker_the_rest() -> None:
    assert thread_plan(0, 1_620_000_000, 1) == Threads(talker=1, codec=1)
    assert thread_plan(0, 1_620_000_000, 2) == Threads(talker=2, codec=1)  # measured best on two cores
    assert thread_plan(0, 1_620_000_000, 4) == Threads(talker=3, codec=1)
    assert thread_plan(0, SMALL_STEP_PARAMS, 16) == Threads(talker=12, codec=4)


def test_an_int8_talker_leaves_the_codec_its_core_on_two_cores_too() -> None:
    assert thread_plan(0, 1_620_000_000, 2, int8=True) == Threads(talker=1, codec=1)  # measured best on two cores
    assert thread_plan(0, 1_620_000_000, 1, int8=True) == Threads(talker=1, codec=1)
    assert thread_plan(0, 1_620_000_000, 8, int8=True) == Threads(talker=6, codec=2)
    assert thread_plan(0, 200_000, 2, int8=True) == Threads(talker=1, codec=1)


def test_a_number_the_user_sets_applies_to_both_workers() -> None:
    assert thread_plan(3, 200_000, 16) == Threads(3, 3)
    assert thread_plan(1, 1_620_000_000, 2) == Threads(1, 1)


def test_usable_cores_counts_this_process_cpus() -> None:
    assert usable_cores() >= 1
