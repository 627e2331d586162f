"""The voice library's SQLite file: opening it (read-only where it cannot be written), bringing a database of an older
schema up to date, the library's quota, and what a failed read or write means (StorageError, which server/errors.py
answers with 507 or 503)."""

from __future__ import annotations

import errno
import os
import resource
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from server.voices import names as voice_names

DB_NAME = "voices.sqlite3"
DEFAULT_QUOTA_BYTES = 1 << 30
DEFAULT_MAX_VOICES = 1000
_ROOM_MARGIN = 1 << 20  # an I/O error with less free than this past the write is the disk being full
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
    name TEXT NOT NULL COLLATE NOCASE,  -- as shown: trimmed, NFKC (server/voices/names.py)
    type TEXT NOT NULL CHECK (type IN ('audio_sample', 'prompt')),
    model TEXT NOT NULL,  -- the served model id it was made for: an x-vector belongs to one speaker encoder
    created_at INTEGER NOT NULL,
    prompt TEXT,  -- a designed voice's description
    transcript TEXT,  -- a cloned voice's reference words (in-context cloning)
    x_vector BLOB,  -- float32, little-endian
    ref_codes BLOB,  -- int32, little-endian, [ref_frames][codebooks]
    ref_frames INTEGER,
    consent_id TEXT REFERENCES consents(id),
    name_key TEXT,  -- what names are compared by (voice_names.key); added later, so last and nullable
    UNIQUE (model, name)  -- the first schema's; the key's index (below) is stricter
);
"""
_KEY_INDEX = "CREATE UNIQUE INDEX IF NOT EXISTS voices_by_key ON voices (model, name_key)"
_USAGE = """SELECT (SELECT count(*) FROM voices), (SELECT count(*) FROM consents),
    (SELECT coalesce(sum(length(recording)), 0) FROM consents) + (SELECT coalesce(sum(
        coalesce(length(x_vector), 0) + coalesce(length(ref_codes), 0) + coalesce(length(CAST(prompt AS BLOB)), 0)
        + coalesce(length(CAST(transcript AS BLOB)), 0)), 0) FROM voices)"""


class StorageError(Exception):
    """The library could not be read or written. `code`: the error code clients see."""

    code = "storage_unavailable"


class StorageFullError(StorageError):
    code = "storage_full"


class QuotaExceededError(StorageFullError):
    code = "storage_quota_exceeded"


@dataclass(frozen=True, slots=True)
class Quota:
    """What the library may hold: bytes of recordings and voice data, and created voices (of every model)."""

    max_bytes: int = DEFAULT_QUOTA_BYTES
    max_voices: int = DEFAULT_MAX_VOICES

    @classmethod
    def from_env(cls, max_bytes: int | None = None, max_voices: int | None = None) -> Quota:
        """The given values, else TALKSTREAM_VOICE_STORAGE_QUOTA and TALKSTREAM_MAX_VOICES, else the defaults."""
        quota = cls(_setting(max_bytes, "TALKSTREAM_VOICE_STORAGE_QUOTA", DEFAULT_QUOTA_BYTES),
                    _setting(max_voices, "TALKSTREAM_MAX_VOICES", DEFAULT_MAX_VOICES))
        if quota.max_bytes < 0 or quota.max_voices < 0:
            raise ValueError("the voice storage quota and the voice limit must be >= 0")
        return quota


@dataclass(frozen=True, slots=True)
class Usage:
    bytes: int = 0
    voices: int = 0
    consents: int = 0


def usage(db: sqlite3.Connection) -> Usage:
    voices, consents, size = db.execute(_USAGE).fetchone()
    return Usage(size, voices, consents)


def check_room(quota: Quota, used: Usage, more_bytes: int, more_voices: int) -> None:
    if more_voices and used.voices + more_voices > quota.max_voices:
        raise QuotaExceededError(f"the voice library holds {used.voices} voices, its limit (--max-voices); delete "
                                 "some first")
    if more_bytes and used.bytes + more_bytes > quota.max_bytes:
        raise QuotaExceededError(f"the voice library's quota is full: {used.bytes} bytes in use and {more_bytes} "
                                 f"more asked for, of {quota.max_bytes} (--voice-storage-quota); delete voices or "
                                 "consents first")


def open_writable(path: Path) -> sqlite3.Connection:
    """Made (with its directory) when missing, and brought up to date."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, check_same_thread=False, timeout=10.0)  # the store's lock keeps it one at a time
    try:
        db.execute("PRAGMA journal_mode = WAL")  # another process reading (a second server) does not block writes
        db.execute("PRAGMA synchronous = NORMAL")  # WAL's safe setting: no fsync per commit, never a corrupt file
        db.execute("PRAGMA foreign_keys = ON")
        _migrate(db)
    except BaseException:
        db.close()
        raise
    return db


def open_read_only(path: Path) -> sqlite3.Connection:
    """For a file that cannot be written. A WAL database needs its -shm file, which a read-only directory cannot
    hold: then it is opened as immutable, which is safe because nobody can change it there either."""
    failure: sqlite3.Error | None = None
    for options in ("mode=ro", "mode=ro&immutable=1"):
        db = sqlite3.connect(f"{path.absolute().as_uri()}?{options}", uri=True, check_same_thread=False)
        try:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
            db.create_function("voice_key", 1, voice_names.key, deterministic=True)
            return db
        except sqlite3.Error as exc:
            db.close()
            failure = exc
    assert failure is not None
    raise failure


def key_column(db: sqlite3.Connection) -> str:
    """What lookups by name compare: the key column, or on a read-only database of the older schema (which has
    none), the key computed row by row."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(voices)")}
    return "name_key" if "name_key" in columns else "voice_key(name)"


def _migrate(db: sqlite3.Connection) -> None:
    """Makes the schema, or adds the key column to a database made before it and fills it. Of older names that have
    one key (`Ärger` and `ärger`), the oldest keeps it; the others stay reachable by id."""
    db.executescript(_SCHEMA)
    if key_column(db) != "name_key":
        db.execute("ALTER TABLE voices ADD COLUMN name_key TEXT")
    with db:
        rows = db.execute("SELECT rowid, model, name, name_key FROM voices ORDER BY rowid").fetchall()
        taken = {(model, key) for _, model, _, key in rows if key is not None}
        for rowid, model, name, key in rows:
            if key is None:
                key = voice_names.key(name)
                key = key if (model, key) not in taken else f"{key}\x00{rowid}"
                taken.add((model, key))
                db.execute("UPDATE voices SET name_key = ? WHERE rowid = ?", (key, rowid))
    db.execute(_KEY_INDEX)


def failure(exc: BaseException, path: Path, action: str, more_bytes: int = 0) -> StorageError | None:
    """What `exc`, raised while `action` on the library at `path`, tells the client; None when it is no storage
    failure (a bug, a constraint)."""
    where = f"the voice library at {path.parent}"
    if isinstance(exc, sqlite3.Error) and getattr(exc, "sqlite_errorcode", None) is not None:
        return _sqlite_failure(exc.sqlite_errorcode & 0xFF, where, path, action, more_bytes)
    if isinstance(exc, OSError):
        return _os_failure(exc, where, action)
    return None


def _sqlite_failure(code: int, where: str, path: Path, action: str, more_bytes: int) -> StorageError | None:
    match code:
        case sqlite3.SQLITE_FULL:
            return StorageFullError(f"{action} failed: the disk holding {where} is full")
        case sqlite3.SQLITE_IOERR if _out_of_space(path, more_bytes):
            return StorageFullError(f"{action} failed: {where} is out of space (a full disk or the file size "
                                    "limit)")
        case sqlite3.SQLITE_IOERR:
            return StorageError(f"{action} failed: {where} gave an I/O error")
        case sqlite3.SQLITE_READONLY | sqlite3.SQLITE_PERM:
            return StorageError(f"{action} failed: {where} is read-only")
        case sqlite3.SQLITE_CANTOPEN:
            return StorageError(f"{action} failed: {where} cannot be opened")
        case sqlite3.SQLITE_BUSY | sqlite3.SQLITE_LOCKED:
            return StorageError(f"{action} failed: {where} is locked by another process; retry shortly")
        case sqlite3.SQLITE_CORRUPT | sqlite3.SQLITE_NOTADB:
            return StorageError(f"{action} failed: {where} is damaged (not a valid database)")
    return None


def _os_failure(exc: OSError, where: str, action: str) -> StorageError:
    match exc.errno:
        case errno.ENOSPC | errno.EDQUOT | errno.EFBIG:
            return StorageFullError(f"{action} failed: {where} is out of space ({exc.strerror})")
        case errno.EROFS | errno.EACCES | errno.EPERM:
            return StorageError(f"{action} failed: {where} is read-only ({exc.strerror})")
        case errno.ENOTDIR | errno.EEXIST:
            return StorageError(f"{action} failed: {where} cannot be made: a file is in the way")
    return StorageError(f"{action} failed: {where} is unavailable ({exc.strerror or exc})")


def _out_of_space(path: Path, more_bytes: int) -> bool:
    """Whether a failed write was out of room: the disk (nearly) full, or the file at the process's size limit
    (RLIMIT_FSIZE, where SQLite reports the EFBIG it gets as an I/O error)."""
    need = more_bytes + _ROOM_MARGIN
    try:
        if shutil.disk_usage(path.parent).free < need:
            return True
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        sizes = [os.path.getsize(p) for p in (path, path.with_name(path.name + "-wal")) if p.exists()]
    except OSError:
        return False
    return limit != resource.RLIM_INFINITY and max(sizes, default=0) + need > limit


def _setting(given: int | None, env: str, default: int) -> int:
    if given is not None:
        return given
    raw = os.environ.get(env)
    if raw is None or not raw.strip():
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{env} must be a whole number, not '{raw}'") from None
