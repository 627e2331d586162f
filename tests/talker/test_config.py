"""The one engine configuration: defaults, environment variables, validation."""

from __future__ import annotations

import pytest

from talker.config import EngineConfig


def test_environment_variables_are_parsed_by_the_fields_type(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TALKSTREAM_WORKER_NICE", "0")
    monkeypatch.setenv("TALKSTREAM_CODEC_HOLD_S", "0.01")
    monkeypatch.setenv("TALKSTREAM_PREFILL_ALONE", "off")
    cfg = EngineConfig.from_env(max_batch=4)
    assert (cfg.worker_nice, cfg.codec_hold_s, cfg.prefill_alone, cfg.max_batch) == (0, 0.01, False, 4)


@pytest.mark.parametrize(("field", "value"), [("worker_nice", -1), ("worker_nice", 20), ("codec_hold_s", -0.1),
                                              ("max_batch", 0), ("torch_threads", -1), ("quantize", "int4")])
def test_out_of_range_settings_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        EngineConfig(**{field: value}).validate()  # type: ignore[arg-type]


def test_quantize_comes_from_the_environment_and_is_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert EngineConfig.from_env().quantize is None
    monkeypatch.setenv("TALKSTREAM_QUANTIZE", "int8")
    assert EngineConfig.from_env().quantize == "int8"
