"""The voice library: consent recordings and the voices made from them (or from a description), in SQLite in the
data directory. Blocking: routes call it through `asyncio.to_thread`. One connection behind a lock serves every
thread, so concurrent creations are applied one after another; each write is one transaction. The file, its
schema, the quota and what storage failures mean are server/voices/db.py's; names are compared as
server/voices/names.py says.

The database file is made on the first write: a server that never stores a voice writes nothing to disk; a missing
directory reads as an empty library, and one that cannot be written is read as it is (writes fail, reads work)."""

from __future__ import annotations

import hashlib
import logging
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
from server.voices import db as voice_db
from server.voices import names as voice_names
from server.voices.db import DB_NAME, Quota, Usage

__all__ = ["DB_NAME", "ConsentInUseError", "NameTakenError", "Quota", "StoredVoice", "Usage", "VoiceStore"]
log = logging.getLogger("talkstream.server")

VoiceType = Literal["audio_sample", "prompt"]


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
    def __init__(self, data_dir: Path, quota: Quota | None = None) -> None:
        self.path = data_dir / DB_NAME
        self.quota = quota or Quota()
        self._db: sqlite3.Connection | None = None
        self._writable = False
        self._key = "name_key"  # the column lookups by name compare (voice_db.key_column)
        self._lock = threading.Lock()

    # Consents -----------------------------------------------------------------------------------------------
    def add_consent(self, name: str, language: str, recording: bytes, seconds: float) -> Consent:
        consent = Consent(new_id("cons"), voice_names.display(name), language, int(time.time()), round(seconds, 3))
        with self._write("storing the consent", len(recording), 0) as db:
            db.execute("INSERT INTO consents VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (consent.id, consent.name, language, consent.created_at, recording,
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
        with self._write("renaming the consent") as db:
            db.execute("UPDATE consents SET name = ? WHERE id = ?", (voice_names.display(name), consent_id))
        return self.consent(consent_id)

    def delete_consent(self, consent_id: str) -> bool:
        """Refused (ConsentInUseError) while voices made under it exist: delete those first."""
        if not self._exists():
            return False
        with self._write("deleting the consent") as db:
            users = [r[0] for r in db.execute("SELECT id FROM voices WHERE consent_id = ? ORDER BY rowid",
                                              (consent_id,))]
            if users:
                raise ConsentInUseError(users)
            return db.execute("DELETE FROM consents WHERE id = ?", (consent_id,)).rowcount > 0

    # Voices -----------------------------------------------------------------------------------------------------
    def add_voice(self, name: str, model: str, *, clone: ClonePrompt | None = None, prompt: str | None = None,
                  consent_id: str | None = None) -> StoredVoice:
        """A cloned voice (`clone`, made before this call: a failed clone stores nothing) or a designed one
        (`prompt`). NameTakenError if `model` has a voice of that name (voice_names.key); KeyError if the consent is
        gone; QuotaExceededError past the quota."""
        name = voice_names.display(name)
        voice = StoredVoice(new_id("voice"), name, "audio_sample" if clone else "prompt", model, int(time.time()),
                            prompt, clone, consent_id)
        x_vector, codes, frames = _pack(clone)
        transcript = clone.ref_text if clone else None
        size = sum(len(b) for b in (x_vector, codes, (prompt or "").encode(), (transcript or "").encode()) if b)
        with self._write("storing the voice", size, 1) as db:
            if consent_id is not None and db.execute("SELECT 1 FROM consents WHERE id = ?",
                                                     (consent_id,)).fetchone() is None:
                raise KeyError(consent_id)
            try:
                db.execute("INSERT INTO voices (id, name, type, model, created_at, prompt, transcript, x_vector, "
                           "ref_codes, ref_frames, consent_id, name_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           (voice.id, name, voice.type, model, voice.created_at, prompt, transcript, x_vector, codes,
                            frames, consent_id, voice_names.key(name)))
            except sqlite3.IntegrityError:
                raise NameTakenError(name) from None
        return voice

    def voice(self, voice_id: str) -> StoredVoice | None:
        rows = self._read(f"{_VOICE} WHERE id = ?", (voice_id,))
        return _voice(rows[0]) if rows else None

    def voice_named(self, model: str, name: str) -> StoredVoice | None:
        """By name as voice_names compares them: one row, through the key's index."""
        rows = self._read(f"{_VOICE} WHERE model = ? AND {self._key} = ? LIMIT 1", (model, voice_names.key(name)),
                          keyed=True)
        return _voice(rows[0]) if rows else None

    def names(self, model: str, limit: int) -> list[str]:
        """The names of `model`'s latest `limit` voices, and nothing else of them."""
        return [r[0] for r in self._read("SELECT name FROM voices WHERE model = ? ORDER BY rowid DESC LIMIT ?",
                                         (model, limit))]

    def voices(self, model: str | None = None) -> list[StoredVoice]:
        """Every voice (of `model`), oldest first."""
        if model is None:
            return [_voice(r) for r in self._read(f"{_VOICE} ORDER BY rowid", ())]
        return [_voice(r) for r in self._read(f"{_VOICE} WHERE model = ? ORDER BY rowid", (model,))]

    def delete_voice(self, voice_id: str) -> bool:
        if not self._exists():
            return False
        with self._write("deleting the voice") as db:
            return db.execute("DELETE FROM voices WHERE id = ?", (voice_id,)).rowcount > 0

    # Quota ------------------------------------------------------------------------------------------------------
    def usage(self) -> Usage:
        """What the library holds (one query); nothing when it has no file."""
        with self._lock, self._translated("reading the voice library's size"):
            db = self._open(write=False)
            return Usage() if db is None else voice_db.usage(db)

    def check_room(self, more_bytes: int, more_voices: int) -> None:
        """QuotaExceededError unless the quota has room for so much more (checked again when it is stored)."""
        voice_db.check_room(self.quota, self.usage(), more_bytes, more_voices)

    def close(self) -> None:
        with self._lock:
            self._close()

    # Connection ------------------------------------------------------------------------------------------------
    @contextmanager
    def _write(self, action: str, more_bytes: int = 0, more_voices: int = 0) -> Iterator[sqlite3.Connection]:
        """One transaction, with the quota checked inside it: committed when the block ends, rolled back if it
        raises. A failure of the storage is a StorageError saying which `action` failed."""
        with self._lock, self._translated(action, more_bytes):
            db = self._open(write=True)
            assert db is not None
            with db:
                db.execute("BEGIN IMMEDIATE")  # the quota's sums and the insert, with no other writer between
                if more_bytes or more_voices:
                    voice_db.check_room(self.quota, voice_db.usage(db), more_bytes, more_voices)
                yield db

    def _read(self, sql: str, args: tuple[object, ...], keyed: bool = False) -> list[tuple[Any, ...]]:
        with self._lock, self._translated("reading the voice library"):
            db = self._open(write=False)
            if db is None:
                return []
            return db.execute(sql.replace("name_key", self._key) if keyed else sql, args).fetchall()

    @contextmanager
    def _translated(self, action: str, more_bytes: int = 0) -> Iterator[None]:
        try:
            yield
        except (sqlite3.Error, OSError) as exc:
            failure = voice_db.failure(exc, self.path, action, more_bytes)
            if failure is None:
                raise
            log.warning("%s", failure)
            raise failure from exc

    def _exists(self) -> bool:
        """Whether there is a database: changing what is not there must not make one."""
        return self._db is not None or self.path.exists()

    def _open(self, write: bool) -> sqlite3.Connection | None:
        """The connection: writable when it can be, else (for reads) read-only; None for reads with no file."""
        if self._db is not None and (self._writable or not write):
            return self._db
        if not write and not self.path.exists():
            return None
        self._close()  # read-only: a write tries again, the directory may be writable by now
        try:
            self._db, self._writable = voice_db.open_writable(self.path), True
        except (sqlite3.Error, OSError):
            if write:
                raise
            self._db, self._writable = voice_db.open_read_only(self.path), False
        self._key = voice_db.key_column(self._db)
        return self._db

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


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
