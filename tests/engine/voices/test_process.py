"""The voice process through its parent side: real prompts, a refused reference's error with its field, a child
killed mid-life (the call fails, the next call starts another), a hung one stopped past its budget, and a child that
outlives the thread that started it (the kernel's parent-death signal follows the thread that forked, so children
are forked by one that stays)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import soundfile as sf

from common.request import RequestError, RequestFailedError
from engine.voices.process import VoiceProcess
from tests.conftest import OFFICIAL_BASE, VOICE_REF


@pytest.fixture(scope="module")
def voices() -> Iterator[VoiceProcess]:
    process = VoiceProcess(OFFICIAL_BASE)
    yield process
    process.close()


def reference() -> np.ndarray:
    wav, _ = sf.read(str(VOICE_REF), dtype="float32")
    return np.asarray(wav, np.float32)


def test_a_child_started_from_a_thread_that_ends_lives_on() -> None:
    voices = VoiceProcess(OFFICIAL_BASE)
    try:
        first: list[object] = []
        starter = threading.Thread(target=lambda: first.append(voices.prompt(reference(), None)))
        starter.start()
        starter.join()
        pid = voices.pid
        assert first and pid is not None
        assert voices.prompt(reference(), None) == first[0] and voices.pid == pid  # the same child, not a new one
        assert voices.stats()["prompts"] == 2
    finally:
        voices.close()


def test_a_refused_reference_names_its_field(voices: VoiceProcess) -> None:
    with pytest.raises(RequestError, match="non-empty mono audio") as refused:
        voices.prompt(np.zeros(0, np.float32), None)
    assert refused.value.param == "audio_sample"


def test_a_killed_child_fails_its_call_and_the_next_call_starts_another(voices: VoiceProcess) -> None:
    voices.prompt(reference(), None)
    pid = voices.pid
    assert pid is not None
    failed: list[BaseException] = []

    def call() -> None:
        try:
            voices.prompt(reference(), "Okay.")
        except RequestFailedError as exc:
            failed.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    os.kill(pid, signal.SIGKILL)  # before or while the call is sent: it never comes back
    caller.join(60)
    assert len(failed) == 1 and "died" in str(failed[0])
    assert voices.prompt(reference(), None).ref_codes is None and voices.pid not in (None, pid)
    assert voices.stats()["prompts"] == 1  # a new child's count


def test_close_stops_the_child(voices: VoiceProcess) -> None:
    voices.prompt(reference(), None)
    pid = voices.pid
    assert pid is not None
    voices.close()
    assert voices.pid is None and not os.path.exists(f"/proc/{pid}")  # ended and reaped


def test_a_hung_child_is_stopped_past_its_budget_and_the_next_call_starts_another() -> None:
    voices = VoiceProcess(OFFICIAL_BASE)
    try:
        voices.prompt(reference(), None)  # started, its encoders loaded
        voices.timeout_s = 1.0
        pid = voices.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # hung: it never answers, however long the budget
        with pytest.raises(RequestFailedError, match="longer than 1 s") as stopped:
            voices.prompt(reference(), "Okay.")
        assert stopped.value.code == "voice_encoder_timeout"
        assert voices.pid is None and not os.path.exists(f"/proc/{pid}")  # killed and reaped
        voices.timeout_s = 600.0
        assert voices.prompt(reference(), None).ref_codes is None and voices.pid not in (None, pid)
    finally:
        voices.close()
