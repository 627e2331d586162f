"""The voice library's SQLite store: what goes in comes out (clone prompts bit for bit), names are unique per model
(compared as Unicode case folds), the quota counts recordings and voices, a failed write stores nothing, concurrent
writers all land, and nothing is written until something is stored."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from common.request import ClonePrompt
from server.voices.db import QuotaExceededError
from server.voices.store import ConsentInUseError, NameTakenError, Quota, Usage, VoiceStore, default_data_dir

X_VECTOR = tuple(np.random.default_rng(1).standard_normal(64).astype(np.float32).tolist())
CODES = tuple(tuple(int(c) for c in row) for row in np.random.default_rng(2).integers(0, 2048, (66, 16)))
ICL = ClonePrompt(X_VECTOR, CODES, "Okay. Yeah.")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[VoiceStore]:
    s = VoiceStore(tmp_path / "data")
    yield s
    s.close()


def consent_id(store: VoiceStore, name: str = "me") -> str:
    return store.add_consent(name, "en-US", b"RIFF recording", 5.2).id


def test_nothing_is_written_until_something_is_stored(store: VoiceStore) -> None:
    assert store.voices() == [] and store.voice("voice_x") is None and store.consents() == ([], False)
    assert not store.delete_voice("voice_x") and not store.delete_consent("cons_x")
    assert store.rename_consent("cons_x", "y") is None
    assert not store.path.parent.exists()
    consent_id(store)
    assert store.path.exists()


def test_clone_prompts_and_descriptions_come_back_as_stored(store: VoiceStore) -> None:
    cons = consent_id(store)
    icl = store.add_voice("Ann", "base", clone=ICL, consent_id=cons)
    xvec = store.add_voice("Bob", "base", clone=ClonePrompt(X_VECTOR), consent_id=cons)
    desc = store.add_voice("Calm", "vd", prompt="A calm, deep male voice.")
    assert icl.id.startswith("voice_") and store.voice(icl.id) == icl
    assert store.voice(icl.id).clone == ICL  # type: ignore[union-attr]
    assert store.voice(xvec.id).clone == ClonePrompt(X_VECTOR)  # type: ignore[union-attr]
    got = store.voice(desc.id)
    assert got is not None and got.type == "prompt" and got.prompt == "A calm, deep male voice." and got.clone is None
    assert [v.name for v in store.voices("base")] == ["Ann", "Bob"] and [v.id for v in store.voices()][2] == desc.id
    assert store.voice_named("base", "ann") == icl and store.voice_named("vd", "ann") is None


def test_names_are_unique_per_model_without_case(store: VoiceStore) -> None:
    store.add_voice("Calm", "vd", prompt="calm")
    with pytest.raises(NameTakenError):
        store.add_voice("CALM", "vd", prompt="other")
    store.add_voice("calm", "vd2", prompt="calm elsewhere")
    assert len(store.voices()) == 2


def test_names_are_compared_by_their_unicode_keys(store: VoiceStore) -> None:
    first = store.add_voice(" Ärger\u200b", "vd", prompt="calm")
    assert first.name == "Ärger" and store.voice_named("vd", "ÄR\u200bGER") == first
    for same in ("ärger", "A\u0308RGER"):  # SQLite's NOCASE folds ASCII only: these were new names before
        with pytest.raises(NameTakenError):
            store.add_voice(same, "vd", prompt="other")
    assert [v.name for v in store.voices()] == ["Ärger"]


def test_the_quota_counts_recordings_and_voices(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path, Quota(max_bytes=1000, max_voices=2))
    try:
        assert store.usage() == Usage()
        store.add_consent("me", "en-US", bytes(600), 1.0)
        with pytest.raises(QuotaExceededError):
            store.add_consent("again", "en-US", bytes(600), 1.0)
        store.add_voice("A", "vd", prompt="x" * 100)
        store.add_voice("B", "vd", prompt="y")
        with pytest.raises(QuotaExceededError):
            store.add_voice("C", "vd", prompt="z")
        assert store.usage() == Usage(bytes=701, voices=2, consents=1)
        assert len(store.voices()) == 2 and len(store.consents()[0]) == 1
    finally:
        store.close()


def test_a_failed_creation_stores_nothing(store: VoiceStore) -> None:
    with pytest.raises(KeyError):
        store.add_voice("Ann", "base", clone=ICL, consent_id="cons_missing")
    assert store.voices() == []


def test_consents_page_rename_and_are_kept_while_in_use(store: VoiceStore) -> None:
    ids = [consent_id(store, f"c{i}") for i in range(5)]
    page, more = store.consents(limit=2)
    assert [c.id for c in page] == ids[:2] and more
    page, more = store.consents(after=ids[1], limit=10)
    assert [c.id for c in page] == ids[2:] and not more
    renamed = store.rename_consent(ids[0], "renamed")
    assert renamed is not None and renamed.name == "renamed" and renamed.language == "en-US"
    assert store.rename_consent("cons_missing", "x") is None
    voice = store.add_voice("Ann", "base", clone=ICL, consent_id=ids[0])
    with pytest.raises(ConsentInUseError) as info:
        store.delete_consent(ids[0])
    assert info.value.voices == [voice.id]
    assert store.delete_voice(voice.id) and not store.delete_voice(voice.id)
    assert store.delete_consent(ids[0]) and not store.delete_consent(ids[0])


def test_a_new_store_on_the_same_directory_sees_everything(tmp_path: Path) -> None:
    first = VoiceStore(tmp_path)
    cons = consent_id(first)
    voice = first.add_voice("Ann", "base", clone=ICL, consent_id=cons)
    first.close()
    second = VoiceStore(tmp_path)
    try:
        assert second.voice(voice.id) == voice and second.consent(cons) is not None
    finally:
        second.close()


def test_concurrent_creations_all_land_and_one_name_wins_once(store: VoiceStore) -> None:
    cons = consent_id(store)
    results: list[str] = []
    start = threading.Barrier(24)

    def create(name: str) -> None:
        start.wait()
        try:
            results.append(store.add_voice(name, "base", clone=ICL, consent_id=cons).name)
        except NameTakenError:
            results.append("taken")

    threads = [threading.Thread(target=create, args=(f"v{i}",)) for i in range(16)]
    threads += [threading.Thread(target=create, args=("same",)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results) == sorted([f"v{i}" for i in range(16)] + ["same"] + ["taken"] * 7)
    assert len(store.voices("base")) == 17


def test_data_dir_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TALKSTREAM_DATA_DIR", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_data_dir() == tmp_path / ".local" / "share" / "talkstream"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_data_dir() == tmp_path / "xdg" / "talkstream"
    monkeypatch.setenv("TALKSTREAM_DATA_DIR", str(tmp_path / "explicit"))
    assert default_data_dir() == tmp_path / "explicit"
