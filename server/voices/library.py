"""What a request's voice names, and what the engine's request carries for it: a checkpoint's built-in voice (by
name), a created voice from the library (server/voices/store.py; by id or name), or a voice cloned for this request
alone (`ref_audio`). Shared by the speech route and the Realtime session."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from engine import ClonePrompt, Engine, EngineState, VoiceKind
from server import errors
from server.audio import input as audio_input
from server.state import ServerState
from server.voices import names as voice_names
from server.voices.db import StorageError
from server.voices.store import StoredVoice, VoiceStore

ID_PREFIX = "voice_"
CANDIDATE_POOL = 200  # the latest created names an unknown one is compared with: a bounded query, a bounded match
MAX_BUILTIN_LISTED = 32  # a checkpoint's voices (speakers and OpenAI's names) named in an unknown voice's error
SHOWN_CHARS = 64  # of an unknown name, quoted back
MAX_NAME_CHARS = 256
_KINDS = {  # what each kind of checkpoint is called in messages, with an example of one
    VoiceKind.BASE: "a Base checkpoint (voice cloning, such as Qwen/Qwen3-TTS-12Hz-0.6B-Base)",
    VoiceKind.VOICE_DESIGN: "a VoiceDesign checkpoint (such as Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign)",
    VoiceKind.CUSTOM_VOICE: "a CustomVoice checkpoint (named speakers)",
}


@dataclass(frozen=True, slots=True)
class VoiceChoice:
    builtin: str | None = None  # a checkpoint voice's name (None with the rest unset: the default voice)
    clone: ClonePrompt | None = None  # a cloned voice: created, or one-off
    description: str | None = None  # a designed voice's words

    def fields(self, instructions: str | None) -> dict[str, Any]:
        """The engine request's `voice`, `clone`, `design` and `instructions`. A designed voice is its description,
        said as instructions ahead of the request's own (kept apart, so that one too long is the voice's error)."""
        return {"voice": self.builtin, "clone": self.clone, "design": self.description, "instructions": instructions}


async def resolve(state: ServerState, engine: Engine, voice: str | None, param: str = "voice") -> VoiceChoice:
    """A built-in name as it is (the engine checks it, as before the library); else a created voice of this model,
    by id or name (one row); else a 400 that names a few close matches and how to list them all."""
    if voice is None or (not voice.startswith(ID_PREFIX) and voice.lower() in engine.voices):
        return VoiceChoice(builtin=voice)
    store = state.library
    try:
        if voice.startswith(ID_PREFIX):
            stored = await asyncio.to_thread(store.voice, voice)
        else:
            stored = await asyncio.to_thread(store.voice_named, engine.model_id, voice)
        if stored is None:
            raise await _unknown(store, engine, voice, param)
    except StorageError as exc:  # the Realtime session answers ApiErrors only
        raise errors.from_exception(exc) from exc
    return choice_of(stored, engine, param)


async def _unknown(store: VoiceStore, engine: Engine, voice: str, param: str) -> errors.ApiError:
    """The error for a voice that is not there: small however many voices the library holds."""
    created = await asyncio.to_thread(store.names, engine.model_id, CANDIDATE_POOL)
    near = voice_names.close(voice, [*engine.voices, *created])
    shown = voice if len(voice) <= SHOWN_CHARS else voice[:SHOWN_CHARS] + "..."
    hint = f"; did you mean {', '.join(repr(n) for n in near)}?" if near else ""
    builtin = sorted(engine.voices)  # a checkpoint's few: named in full, unlike the library's
    if 0 < len(builtin) <= MAX_BUILTIN_LISTED:
        hint += f"; built-in voices: {', '.join(builtin)}"
    return errors.invalid(f"unknown voice '{shown}'{hint}; GET /v1/audio/voices?model={engine.model_id} lists every "
                          "voice of this model, built-in and created", param, "invalid_value")


def choice_of(stored: StoredVoice, engine: Engine, param: str) -> VoiceChoice:
    if stored.model != engine.model_id:  # an x-vector belongs to the speaker encoder that made it
        raise errors.invalid(f"voice '{stored.name}' ({stored.id}) was made for model '{stored.model}'; ask for that "
                             f"model, or create the voice again for '{engine.model_id}'", param, "invalid_value")
    if stored.clone is not None:
        return VoiceChoice(clone=stored.clone)
    return VoiceChoice(description=stored.prompt)


async def one_off(engine: Engine, ref_audio: str, ref_text: str | None) -> VoiceChoice:
    """A voice cloned from `ref_audio` for one request; nothing is stored."""
    require_kind(engine, VoiceKind.BASE, "ref_audio")
    engine.check_clone_text(ref_text, "ref_text")
    wav = await audio_input.decode_async(audio_input.parse_ref_audio(ref_audio), "ref_audio")
    return VoiceChoice(clone=await engine.clone_prompt(wav, ref_text, "ref_text", kind="one_off"))


def require_kind(engine: Engine, kind: VoiceKind, param: str) -> None:
    """A 400 unless `engine`'s checkpoint is of `kind`, saying which kind is needed (503 while it loads)."""
    if engine.state is not EngineState.READY:
        raise errors.unavailable(f"model '{engine.model_id}' is not ready yet; retry shortly")
    if engine.voice_kind is not kind:
        what = "cloning a voice" if kind is VoiceKind.BASE else "a voice made from a description"
        raise errors.invalid(f"{what} needs {_KINDS[kind]}; model '{engine.model_id}' is "
                             f"{_KINDS[engine.voice_kind]}", param, "unsupported_model")


def check_name(engine: Engine, name: str) -> str:
    """A created voice's name as it will be stored (`shown_name`). Refused also: an id, and a name that is, or looks
    like, a built-in voice of the model (those win)."""
    shown = shown_name(name)
    skeleton = voice_names.skeleton(shown)
    if voice_names.key(shown).startswith(ID_PREFIX) or skeleton.startswith(voice_names.skeleton(ID_PREFIX)):
        raise errors.invalid(f"name must not start with '{ID_PREFIX}', nor look like it (voice ids do)", "name",
                             "invalid_value")
    if builtin := next((b for b in engine.voices if voice_names.skeleton(b) == skeleton), None):
        raise errors.invalid(f"'{shown}' is, or looks like, the built-in voice '{builtin}' of model "
                             f"'{engine.model_id}'; pick another name", "name", "invalid_value")
    return shown


def shown_name(name: str) -> str:
    """A voice's or consent's name as it will be stored (voice_names.display), which must show something."""
    shown = voice_names.display(name)
    if voice_names.has_control(name):  # as sent: trimming must not hide an escape sequence's ESC
        raise errors.invalid("name must not hold control characters (such as a NUL, an escape, a newline, a tab or "
                             "U+2028) nor private-use ones", "name", "invalid_value")
    if not voice_names.visible(shown):
        raise errors.invalid("name must have a visible character (it is blank, or only invisible characters)",
                             "name", "invalid_value")
    if len(shown) > MAX_NAME_CHARS:
        raise errors.invalid(f"name is longer than {MAX_NAME_CHARS} characters once normalised", "name",
                             "invalid_value")
    return shown
