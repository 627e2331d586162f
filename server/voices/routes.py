"""OpenAI's custom voices API: consent recordings (`/v1/audio/voice_consents`) and the voices made under them, or
from a description (`/v1/audio/voices`), kept in the voice library (server/voices/store.py). A request speaks a
created voice by its id or name (server/voices/library.py)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from pydantic import ValidationError
from starlette.datastructures import FormData
from starlette.datastructures import UploadFile as FormFile

from engine import Engine, VoiceKind
from server import errors
from server.audio import input as audio_input
from server.protocol import (
    MAX_INPUT_CHARS,
    ErrorEnvelope,
    VoiceCard,
    VoiceConsentDeleted,
    VoiceConsentList,
    VoiceConsentObject,
    VoiceConsentUpdate,
    VoiceCreate,
    VoiceDeleted,
    VoiceList,
    VoiceObject,
)
from server.state import ServerState, server_state
from server.voices import names as voice_names
from server.voices.library import check_name, require_kind, shown_name
from server.voices.store import Consent, ConsentInUseError, NameTakenError, StoredVoice, VoiceStore

router = APIRouter()
T = TypeVar("T")
_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorEnvelope} for code in (400, 401, 404, 409, 503,
                                                                                          507)}
_LANGUAGE = re.compile(r"[A-Za-z]{2,3}(-[A-Za-z0-9]{1,8})*")  # a BCP 47 tag, loosely
_FORMS = ("multipart/form-data", "application/x-www-form-urlencoded")
_VOICE_FORM = {"requestBody": {"required": True, "content": {
    "multipart/form-data": {"schema": {**VoiceCreate.model_json_schema(), "properties": {
        **VoiceCreate.model_json_schema()["properties"], "audio_sample": {"type": "string", "format": "binary"}}}},
    "application/json": {"schema": VoiceCreate.model_json_schema()},
}}}


# Consents ---------------------------------------------------------------------------------------------------------
@router.post("/audio/voice_consents", response_model=VoiceConsentObject, responses=_ERRORS)
async def create_consent(
    request: Request, name: Annotated[str, Form(min_length=1, max_length=256)],
    language: Annotated[str, Form(min_length=1, max_length=64)], recording: Annotated[UploadFile, File()],
) -> VoiceConsentObject:
    """Stores a consent recording (the file as sent, with its hash and duration)."""
    _form_fields(await request.form(), "recording")  # FastAPI keeps one of a field given twice: refused here
    name = shown_name(name)
    if not _LANGUAGE.fullmatch(language):
        raise errors.invalid(f"language: '{language}' is not a BCP 47 language tag, such as en-US", "language",
                             "invalid_value")
    data = await read_upload(recording, "recording")
    store = _store(request)
    await asyncio.to_thread(store.check_room, len(data), 0)  # before decoding; the insert checks again
    wav = await audio_input.decode_async(data, "recording")
    return _consent(await asyncio.to_thread(store.add_consent, name, language, data, wav.size / audio_input.RATE))


@router.get("/audio/voice_consents", response_model=VoiceConsentList, responses=_ERRORS)
async def list_consents(request: Request, after: str | None = None,
                        limit: Annotated[int, Query(ge=1, le=100)] = 20) -> VoiceConsentList:
    """Oldest first; `after` is the last id of the previous page."""
    consents, more = await asyncio.to_thread(_store(request).consents, after, limit)
    data = [_consent(c) for c in consents]
    return VoiceConsentList(data=data, has_more=more, first_id=data[0].id if data else None,
                            last_id=data[-1].id if data else None)


@router.get("/audio/voice_consents/{consent_id}", response_model=VoiceConsentObject, responses=_ERRORS)
async def get_consent(request: Request, consent_id: str) -> VoiceConsentObject:
    return _consent(_found(await asyncio.to_thread(_store(request).consent, consent_id), "consent", consent_id))


@router.post("/audio/voice_consents/{consent_id}", response_model=VoiceConsentObject, responses=_ERRORS)
async def update_consent(request: Request, consent_id: str, body: VoiceConsentUpdate) -> VoiceConsentObject:
    """Renames it (its recording cannot change)."""
    consent = await asyncio.to_thread(_store(request).rename_consent, consent_id, shown_name(body.name))
    return _consent(_found(consent, "consent", consent_id))


@router.delete("/audio/voice_consents/{consent_id}", response_model=VoiceConsentDeleted, responses=_ERRORS)
async def delete_consent(request: Request, consent_id: str) -> VoiceConsentDeleted:
    """Refused (409) while voices made under it exist."""
    try:
        deleted = await asyncio.to_thread(_store(request).delete_consent, consent_id)
    except ConsentInUseError as exc:
        raise errors.conflict(f"consent '{consent_id}' is in use by {', '.join(exc.voices)}; delete those voices "
                              "first", "consent_id", "consent_in_use") from None
    if not deleted:
        raise _missing("consent", consent_id)
    return VoiceConsentDeleted(id=consent_id)


# Voices -----------------------------------------------------------------------------------------------------------
@router.get("/audio/voices", response_model=VoiceList, responses=_ERRORS)
async def list_voices(request: Request, model: str | None = None) -> VoiceList:
    """The voices of `model` (the default model when not given): its built-in ones, then those created for it."""
    state = server_state(request)
    engine = state.engine_for(model)
    cards: list[VoiceCard | VoiceObject] = [VoiceCard(id=v.name, name=v.name, speaker=v.speaker, alias_of=v.alias_of)
                                            for v in engine.voices.values()]
    cards += [_voice(v) for v in await asyncio.to_thread(state.library.voices, engine.model_id)]
    return VoiceList(model=engine.model_id, data=cards, languages=engine.languages)


@router.post("/audio/voices", response_model=VoiceObject, response_model_exclude_none=True, responses=_ERRORS,
             openapi_extra=_VOICE_FORM)
async def create_voice(request: Request) -> VoiceObject:
    """A voice cloned from `audio_sample` under a `consent` (multipart; Base checkpoints), with `transcript` for
    in-context cloning; or, with `type: prompt`, a voice made from its description (VoiceDesign checkpoints)."""
    state = server_state(request)
    async with _voice_body(request) as (body, sample):
        engine = state.engine_for(None if body.model == "auto" else body.model)
        body = body.model_copy(update={"name": check_name(engine, body.name)})
        if body.type == "prompt":
            return await _design(state, engine, body, sample)
        return await _clone(state, engine, body, sample)


@router.get("/audio/voices/{voice_id}", response_model=VoiceObject, response_model_exclude_none=True,
            responses=_ERRORS)
async def get_voice(request: Request, voice_id: str) -> VoiceObject:
    return _voice(_found(await asyncio.to_thread(_store(request).voice, voice_id), "voice", voice_id))


@router.delete("/audio/voices/{voice_id}", response_model=VoiceDeleted, responses=_ERRORS)
async def delete_voice(request: Request, voice_id: str) -> VoiceDeleted:
    if not await asyncio.to_thread(_store(request).delete_voice, voice_id):
        raise _missing("voice", voice_id)
    return VoiceDeleted(id=voice_id)


async def _clone(state: ServerState, engine: Engine, body: VoiceCreate, sample: FormFile | None) -> VoiceObject:
    _refuse(body.prompt, "prompt", "type=prompt")
    if sample is None:
        raise errors.invalid("audio_sample: a recording of the voice is required, as a file of the multipart form",
                             "audio_sample", "missing_field")
    if body.consent is None:
        raise errors.invalid("consent: the id of a consent recording is required (POST /v1/audio/voice_consents "
                             "makes one)", "consent", "missing_field")
    require_kind(engine, VoiceKind.BASE, "model")
    engine.check_clone_text(body.transcript, "transcript")
    if await asyncio.to_thread(state.library.consent, body.consent) is None:
        raise _no_consent(body.consent)
    await _can_store(state.library, engine, body.name)
    wav = await audio_input.decode_async(await read_upload(sample, "audio_sample"), "audio_sample")
    clone = await engine.clone_prompt(wav, body.transcript, kind="creation")  # a failed clone stores nothing
    return await _insert(state.library, body, engine, clone=clone, consent_id=body.consent)


async def _design(state: ServerState, engine: Engine, body: VoiceCreate, sample: FormFile | None) -> VoiceObject:
    for value, field in ((sample, "audio_sample"), (body.consent, "consent"), (body.transcript, "transcript")):
        _refuse(value, field, "type=audio_sample")
    if body.prompt is None or not voice_names.visible(body.prompt):  # blank, or only invisible characters
        raise errors.invalid("prompt: a description of the voice is required for type=prompt", "prompt",
                             "missing_field")
    require_kind(engine, VoiceKind.VOICE_DESIGN, "model")
    engine.check_design(body.prompt, "prompt")
    await _can_store(state.library, engine, body.name)
    return await _insert(state.library, body, engine, prompt=body.prompt)


async def _insert(store: VoiceStore, body: VoiceCreate, engine: Engine, **what: Any) -> VoiceObject:
    try:
        return _voice(await asyncio.to_thread(store.add_voice, body.name, engine.model_id, **what))
    except NameTakenError:  # created meanwhile by a concurrent request
        raise _taken(body.name, engine) from None
    except KeyError:  # deleted meanwhile
        raise _no_consent(body.consent or "") from None


@asynccontextmanager
async def _voice_body(request: Request) -> AsyncIterator[tuple[VoiceCreate, FormFile | None]]:
    """The fields of a multipart form (with its `audio_sample` file, closed when the block ends) or of a JSON
    object, validated."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/json":
        yield _validated(_json_fields(await request.body())), None
    elif kind in _FORMS:
        async with request.form(max_files=2, max_fields=20, max_part_size=4 * MAX_INPUT_CHARS) as form:
            fields = _form_fields(form)
            sample = fields.pop("audio_sample", None)
            yield _validated(fields), sample
    else:
        raise errors.invalid("send multipart/form-data (with the audio_sample file), or JSON for type=prompt",
                             code="invalid_body")


def _validated(fields: dict[str, Any]) -> VoiceCreate:
    try:
        return VoiceCreate.model_validate(fields)
    except ValidationError as exc:
        raise errors.from_validation(exc.errors(include_url=False)) from None


def _form_fields(form: FormData, file_field: str = "audio_sample") -> dict[str, Any]:
    """Each field once; `file_field` the one file."""
    fields: dict[str, Any] = {}
    for key, value in form.multi_items():
        if key in fields:
            raise errors.invalid(f"{key}: given more than once", key, "invalid_value")
        if isinstance(value, FormFile) != (key == file_field):
            what = "a file" if key == file_field else "a text field, not a file"
            raise errors.invalid(f"{key}: must be {what}", key, "invalid_value")
        fields[key] = value
    return fields


def _json_fields(raw: bytes) -> dict[str, Any]:
    try:
        fields = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise errors.invalid("the request body is not valid JSON", code="invalid_json") from None
    if not isinstance(fields, dict):
        raise errors.invalid("the request body must be a JSON object", code="invalid_body")
    if "audio_sample" in fields:
        raise errors.invalid("audio_sample: send the recording as a file of a multipart/form-data request",
                             "audio_sample", "invalid_value")
    return fields


async def read_upload(file: FormFile, param: str) -> bytes:
    data = await file.read(audio_input.MAX_BYTES + 1)
    if len(data) > audio_input.MAX_BYTES:
        raise audio_input.too_big(param)
    return data


async def _can_store(store: VoiceStore, engine: Engine, name: str) -> None:
    """That the name is free and the quota has room for a voice: checked before the slow part (decoding, cloning);
    the insert checks again."""
    await asyncio.to_thread(store.check_room, 0, 1)
    if await asyncio.to_thread(store.voice_named, engine.model_id, name) is not None:
        raise _taken(name, engine)


def _taken(name: str, engine: Engine) -> errors.ApiError:
    return errors.conflict(f"model '{engine.model_id}' already has a voice named '{name}'; delete it or pick "
                           "another name", "name", "voice_name_taken")


def _no_consent(consent_id: str) -> errors.ApiError:
    return errors.invalid(f"consent: there is no consent recording '{consent_id}'; POST /v1/audio/voice_consents "
                          "makes one", "consent", "consent_not_found")


def _refuse(value: object, field: str, kind: str) -> None:
    if value is not None:
        raise errors.invalid(f"{field}: only for {kind} voices", field, "invalid_value")


def _found(found: T | None, what: str, given: str) -> T:
    if found is None:
        raise _missing(what, given)
    return found


def _missing(what: str, given: str) -> errors.ApiError:
    return errors.not_found(f"there is no {what} '{given}'", f"{what}_id", f"{what}_not_found")


def _store(request: Request) -> VoiceStore:
    return server_state(request).library


def _consent(c: Consent) -> VoiceConsentObject:
    return VoiceConsentObject(id=c.id, name=c.name, language=c.language, created_at=c.created_at)


def _voice(v: StoredVoice) -> VoiceObject:
    return VoiceObject(id=v.id, name=v.name, type=v.type, created_at=v.created_at, prompt=v.prompt, model=v.model)
