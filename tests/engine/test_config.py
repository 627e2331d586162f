"""The one engine configuration: defaults, environment variables, validation."""

from __future__ import annotations

from dataclasses import fields

import pytest

from engine.config import EngineConfig, OutputMode
from engine.tuning import Tuning


def test_environment_variables_are_parsed_by_the_fields_type(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TALKSTREAM_MAX_AHEAD_S", "2.5")
    monkeypatch.setenv("TALKSTREAM_OUTPUT_MODE", "sync")
    monkeypatch.setenv("TALKSTREAM_TUNING", "worker_nice=0, codec_hold_s=0.01,prefill_midstep=off")
    cfg = EngineConfig.from_env(max_batch=4)
    assert (cfg.max_ahead_s, cfg.output_mode, cfg.max_batch) == (2.5, OutputMode.SYNC, 4)
    t = cfg.tuning
    assert (t.worker_nice, t.codec_hold_s, t.prefill_midstep, t.warmup) == (0, 0.01, False, True)


def test_a_tuning_knob_is_not_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """About a dozen settings (`lexicon` the sixteenth, `aligner` the seventeenth); the knobs only through
    TALKSTREAM_TUNING, whose unknown names are refused."""
    assert len([f for f in fields(EngineConfig) if f.name != "tuning"]) <= 17
    monkeypatch.setenv("TALKSTREAM_WORKER_NICE", "0")  # no longer read
    assert EngineConfig.from_env().tuning.worker_nice == Tuning().worker_nice
    monkeypatch.setenv("TALKSTREAM_TUNING", "worker_niceness=0")
    with pytest.raises(ValueError, match="unknown knob 'worker_niceness'"):
        EngineConfig.from_env()


@pytest.mark.parametrize(("field", "value"), [("max_batch", 0), ("max_queue", -1), ("quantize", "int4"),
                                              ("device", "tpu"), ("reader_timeout_s", 0), ("compile", "yes")])
def test_out_of_range_settings_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        EngineConfig(**{field: value}).validate()  # type: ignore[arg-type]


@pytest.mark.parametrize(("knob", "value"), [("worker_nice", -1), ("worker_nice", 20), ("codec_hold_s", -0.1),
                                             ("torch_threads", -1), ("chunk_frames", 0)])
def test_out_of_range_knobs_are_refused(knob: str, value: float) -> None:
    with pytest.raises(ValueError, match=knob):
        EngineConfig().tuned(**{knob: value})


def test_quantize_comes_from_the_environment_and_is_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert EngineConfig.from_env().quantize is None
    monkeypatch.setenv("TALKSTREAM_QUANTIZE", "int8")
    assert EngineConfig.from_env().quantize == "int8"
