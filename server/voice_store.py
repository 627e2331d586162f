"""The voice library: consent recordings and the voices made from them (or from a description), in SQLite in the
data directory. Blocking: routes call it through `asyncio.to_thread`. One connection behind a lock serves every
thread, so concurrent creations are applied one after another; each write is one transaction.

The database file is made on the first write: a server that never stores a voice writes nothing to disk."""

from __future__ import annotations

import hashlib
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from engine import ClonePrompt

DB_NAME = "voices.sqlite3"
VoiceType = Literal["audio_sample", "prompt"]
_SCHEMA = """
CREATE TABLE IF NOT EXISTS consents (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    language TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    recording BLOB NOT NULL,  -- the file as uploaded: the record of what was consented to
    sha256 TEXT NOT NULL,
    seconds REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS voices (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL COLLATE NOCASE,  -- voice names are matched as built-in ones are, without case
    type TEXT NOT NULL CHECK (type IN ('audio_sample', 'prompt')),
    model TEXT NOT NULL,  -- the served model id it was made for: an x-vector belongs to one speaker encoder
    created_at INTEGER NOT NULL,
    prompt TEXT,  -- a designed voice's description
    transcript TEXT,  -- a cloned voice's reference words (in-context cloning)
    x_vector BLOB,  -- float32, little-endian
    ref_codes BLOB,  -- int32, little-endian, [ref_frames][codebooks]
    ref_frames INTEGER,
    consent_id TEXT REFERENCES consents(id),
    UNIQUE (model, name)
);
"""


def default_data_dir() -> Path:
    """TALKSTREAM_DATA_DIR, else $XDG_DATA_HOME/talkstream, else ~/.local/share/talkstream."""
    if explicit := os.environ.get("TALKSTREAM_DATA_DIR"):
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "talkstream"


@dataclass(frozen=True, slots=True)
class Consent:
    id: str
    name: str
    language: str
    created_at: int
    seconds: float


@dataclass(frozen=True, slots=True)
class StoredVoice:
    id: str
    name: str
    type: VoiceType
    model: str
    created_at: int
    prompt: str | None = None
    clone: ClonePrompt | None = None  # audio_sample voices
    consent_id: str | None = None


class NameTakenError(ValueError):
    """A voice of that name exists for that model."""


class ConsentInUseError(ValueError):
    def __init__(self, voices: list[str]) -> None:
        super().__init__(", ".join(voices))
        self.voices = voices


class VoiceStore:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / DB_NAME
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    # Consents -----------------------------------------------------------------------------------------------
    def add_consent(self, name: str, language: str, recording: bytes, seconds: float) -> Consent:
        consent = Consent(new_id("cons"), name, language, int(time.time()), round(seconds, 3))
        with self._write() as db:
            db.execute("INSERT INTO consents VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (consent.id, name, language, consent.created_at, recording,
                        hashlib.sha256(recording).hexdigest(), consent.seconds))
        return consent

    def consent(self, consent_id: str) -> Consent | None:
        rows = self._read("SELECT id, name, language, created_at, seconds FROM consents WHERE id = ?", (consent_id,))
        return Consent(*rows[0]) if rows else None

    def consents(self, after: str | None = None, limit: int = 20) -> tuple[list[Consent], bool]:
        """A page of consents, oldest first, after the one with id `after`; and whether more follow."""
        rows = self._read("SELECT id, name, language, created_at, seconds FROM consents WHERE rowid > "
                          "coalesce((SELECT rowid FROM consents WHERE id = ?), 0) ORDER BY rowid LIMIT ?",
                          (after, limit + 1))
        return [Consent(*row) for row in rows[:limit]], len(rows) > limit

    def rename_consent(self, consent_id: str, name: str) -> Consent | None:
        if not self._exists():
            return None
        with self._write() as db:
            db.execute("UPDATE consents SET name = ? WHERE id = ?", (name, consent_id))
        return self.consent(consent_id)

    def delete_consent(self, consent_id: str) -> bool:
        """Refused (ConsentInUseError) while voices made under it exist: delete those first."""
        if not self._exists():
            return False
        with self._write() as db:
            users = [r[0] for r in db.execute("SELECT id FROM voices WHERE consent_id = ? ORDER BY rowid",
                                              (consent_id,))]
            if users:
                raise ConsentInUseError(users)
            return db.execute("DELETE FROM consents WHERE id = ?", (consent_id,)).rowcount > 0

    # Voices -----------------------------------------------------------------------------------------------------
    def add_voice(self, name: str, model: str, *, clone: ClonePrompt | None = None, prompt: str | None = None,
                  consent_id: str | None = None) -> StoredVoice:
        """A cloned voice (`clone`, made before this call: a failed clone stores nothing) or a designed one
        (`prompt`). NameTakenError if `model` has a voice of that name; KeyError if the consent is gone."""
        voice = StoredVoice(new_id("voice"), name, "audio_sample" if clone else "prompt", model, int(time.time()),
                            prompt, clone, consent_id)
        x_vector, codes, frames = _pack(clone)
        with self._write() as db:
            if consent_id is not None and db.execute("SELECT 1 FROM consents WHERE id = ?",
                                                     (consent_id,)).fetchone() is None:
                raise KeyError(consent_id)
            try:
                db.execute("INSERT INTO voices VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           (voice.id, name, voice.type, model, voice.created_at, prompt,
                            clone.ref_text if clone else None, x_vector, codes, frames, consent_id))
            except sqlite3.IntegrityError:
                raise NameTakenError(name) from None
        return voice

    def voice(self, voice_id: str) -> StoredVoice | None:
        rows = self._read(f"{_VOICE} WHERE id = ?", (voice_id,))
        return _voice(rows[0]) if rows else None

    def voice_named(self, model: str, name: str) -> StoredVoice | None:
        rows = self._read(f"{_VOICE} WHERE model = ? AND name = ?", (model, name))
        return _voice(rows[0]) if rows else None

    def voices(self, model: str | None = None) -> list[StoredVoice]:
        """Every voice (of `model`), oldest first."""
        if model is None:
            return [_voice(r) for r in self._read(f"{_VOICE} ORDER BY rowid", ())]
        return [_voice(r) for r in self._read(f"{_VOICE} WHERE model = ? ORDER BY rowid", (model,))]

    def delete_voice(self, voice_id: str) -> bool:
        if not self._exists():
            return False
        with self._write() as db:
            return db.execute("DELETE FROM voices WHERE id = ?", (voice_id,)).rowcount > 0

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    # Connection ------------------------------------------------------------------------------------------------
    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One transaction: committed when the block ends, rolled back if it raises."""
        with self._lock:
            db = self._open(create=True)
            assert db is not None
            with db:
                yield db

    def _read(self, sql: str, args: tuple[object, ...]) -> list[tuple[Any, ...]]:
        with self._lock:
            db = self._open(create=False)
            return [] if db is None else db.execute(sql, args).fetchall()

    def _exists(self) -> bool:
        """Whether there is a database: changing what is not there must not make one."""
        return self._db is not None or self.path.exists()

    def _open(self, create: bool) -> sqlite3.Connection | None:
        if self._db is None:
            if not create and not self.path.exists():
                return None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, check_same_thread=False, timeout=10.0)  # the lock keeps it one at a time
            db.execute("PRAGMA journal_mode = WAL")  # another process reading (a second server) does not block writes
            db.execute("PRAGMA foreign_keys = ON")
            db.executescript(_SCHEMA)
            self._db = db
        return self._db


_VOICE = ("SELECT id, name, type, model, created_at, prompt, transcript, x_vector, ref_codes, ref_frames, consent_id "
          "FROM voices")


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _pack(clone: ClonePrompt | None) -> tuple[bytes | None, bytes | None, int | None]:
    if clone is None:
        return None, None, None
    x_vector = np.asarray(clone.x_vector, dtype="<f4").tobytes()
    if clone.ref_codes is None:
        return x_vector, None, None
    return x_vector, np.asarray(clone.ref_codes, dtype="<i4").tobytes(), len(clone.ref_codes)


def _voice(row: tuple[Any, ...]) -> StoredVoice:
    vid, name, kind, model, created_at, prompt, transcript, x_vector, codes, frames, consent_id = row
    clone = None
    if x_vector is not None:
        ref_codes = None
        if codes is not None:
            ref_codes = tuple(map(tuple, np.frombuffer(codes, "<i4").reshape(frames, -1).tolist()))
        clone = ClonePrompt(tuple(np.frombuffer(x_vector, "<f4").tolist()), ref_codes, transcript)
    return StoredVoice(vid, name, kind, model, created_at, prompt, clone, consent_id)
