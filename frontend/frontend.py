"""Request validation and tokenization on the event loop, before any engine work."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from common.request import (
    MAX_INPUT_CHARS,
    ClonePrompt,
    RequestError,
    SamplingParams,
    SpeechRequest,
    StreamingSpeechRequest,
    TextLayout,
    VoiceKind,
)
from frontend.catalog import OPENAI_VOICES, Voice, build_voices, voice_kind
from frontend.language import LanguageDetector
from frontend.lexicon import Lexicon
from frontend.normalize import TextNormalizer
from frontend.pauses import split_pauses, spoken_form
from frontend.segmenter import split_text
from frontend.tokenizer import IM_START, TextTokenizer, load_tokenizer
from talker.models.qwen3_tts.config import GenerationDefaults, Qwen3TTSConfig
from talker.models.qwen3_tts.prompt import PromptIds, Reference, codec_prefix

__all__ = ["OPENAI_VOICES", "Frontend", "Prepared", "Voice", "load_tokenizer"]
# A slow speaker's codec frames per text token (an ordinary pace is ~3.5): a segment of max_frames // 8 tokens is
# spoken within max_frames, so a long text is split before the frame cap could cut it.
FRAMES_PER_TOKEN = 8
# No runaway audio: a segment's speech is capped at CAP_FLOOR_S seconds plus FRAMES_PER_TOKEN frames per token of its
# prompt's text (that slow speaker's pace, over twice an ordinary one), so a model that never says its end of speech
# stops there instead of talking on for a minute; the floor keeps a short text's slow reading whole.
CAP_FLOOR_S = 10.0
FRAME_RATE = 12.5  # frames a second of the 12 Hz codec (24 kHz, 1920 samples a frame)
MIN_SEGMENT_TOKENS = 16  # instructions must leave at least this much of the prompt to the text
MAX_FRAMES_LIMIT = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Prepared:
    """A validated request, ready for the worker: its text as one or more segments, spoken one after another
    with the same voice and settings, into one audio stream."""

    request: SpeechRequest
    segments: tuple[PromptIds, ...]
    params: SamplingParams
    seed: int
    caps: tuple[int, ...]  # frames of each segment at most: its text's cap (`Frontend.cap`), within the server's
    limit: int | None  # frames of the whole response at most (the client's max_frames)
    input_tokens: int
    spoken: str  # the text as it is spoken: its transcript
    pauses: tuple[float, ...] = ()  # seconds of silence before each segment, then after the last ([pause:N] tags)
    language: str | None = None  # the language it is spoken in: named, else detected (its first segment's)
    detected: tuple[str | None, ...] | None = None  # each segment's detected language (None: named, or no detection)
    texts: tuple[str, ...] = ()  # each segment's text as it is spoken

    @property
    def prompt(self) -> PromptIds:
        return self.segments[0]

    @property
    def max_frames(self) -> int:
        """The first segment's cap."""
        return self.caps[0]


@dataclass(frozen=True, slots=True)
class Settings:
    """What a request's prompt and generation take besides its text."""

    prefix: tuple[int, ...]  # the codec prefix: language, speaker
    instruct: tuple[int, ...] | None
    params: SamplingParams
    seed: int
    max_frames: int
    limit: int | None
    speaker_vector: tuple[float, ...] | None = None  # a cloned voice
    reference: Reference | None = None  # in-context cloning
    language: str | None = None  # the one named (None: auto)
    by_language: dict[str, tuple[int, ...]] | None = None  # language left to detection: the prefix of each it may be

    def prompt(self, text_ids: tuple[int, ...], streaming: bool, prefix: tuple[int, ...] | None = None) -> PromptIds:
        return PromptIds(text_ids, self.instruct, prefix or self.prefix, streaming, self.speaker_vector,
                         self.reference)

    @property
    def prefix_len(self) -> int:
        """The longest codec prefix a segment's prompt may have (a detected language's adds one)."""
        return max((len(p) for p in (self.by_language or {}).values()), default=len(self.prefix))


class Frontend:
    def __init__(
        self, cfg: Qwen3TTSConfig, gen: GenerationDefaults, tokenizer: TextTokenizer,
        max_frames: int, text_width: int, max_prompt: int, frame_rate: float = FRAME_RATE,
    ) -> None:
        self.cfg, self.gen, self.tokenizer = cfg, gen, tokenizer
        self.max_frames, self.text_width, self.max_prompt = max_frames, text_width, max_prompt
        self.frame_rate = frame_rate
        self.lexicon: Lexicon | None = None  # respellings (the engine's --lexicon; replaced whole on SIGHUP)
        self.detects = True  # a text whose language is not named is spoken in the one detected (engine/tuning.py)
        self.normalizer = TextNormalizer()
        self.cap_floor = round(CAP_FLOOR_S * frame_rate)
        self.kind = voice_kind(cfg)
        self.voices = build_voices(cfg)

    @property
    def default_voice(self) -> str | None:
        speakers = sorted(self.cfg.speakers)
        return speakers[0] if speakers else None

    def prepare(self, req: SpeechRequest) -> Prepared:
        text = req.text
        if not text or not text.strip():
            raise RequestError("input must not be empty", param="input")
        if len(text) > MAX_INPUT_CHARS:
            raise RequestError(f"input is {len(text)} characters long; at most {MAX_INPUT_CHARS} are accepted",
                               param="input")
        s = self.settings(req)
        streaming = self.streaming_layout(req.text_layout)
        parts, pauses = split_pauses(text)
        parts = [self.spoken(part, s, req.normalize) for part in parts]
        pieces = [self.split(part, s) for part in parts]  # each part's segments, then the silence after it
        languages = [self._detect(s, piece) for group in pieces for piece in group]
        segments = tuple(s.prompt(self.tokenizer.assistant(piece), streaming, s.by_language.get(lang) if lang and
                                  s.by_language else None)
                         for piece, lang in zip((p for g in pieces for p in g), languages, strict=True))
        silences = (*(before if i == 0 else 0.0 for group, before in zip(pieces, pauses, strict=False)
                      for i in range(len(group))), pauses[-1])
        ref = len(s.reference.text_ids) if s.reference else 0
        for prompt in segments:  # the budget keeps every segment within both; a last line of defence
            if ref + len(prompt.text) + 1 > self.text_width or prompt.token_bound > self.max_prompt:
                raise RequestError("input could not be split into pieces this model can speak", param="input")
        tokens = sum(len(p.text) for p in segments) + len(s.instruct or ())
        caps = tuple(min(s.max_frames, self.cap(len(p.text))) for p in segments)
        return Prepared(req, segments, s.params, s.seed, caps, s.limit, tokens, spoken_form(parts, pauses), silences,
                        s.language or languages[0], tuple(languages) if s.by_language else None,
                        tuple(p for group in pieces for p in group))

    def _detect(self, s: Settings, piece: str) -> str | None:
        return self.detector.detect(piece) if s.by_language else None

    @functools.cached_property
    def detector(self) -> LanguageDetector:
        """Built once (the engine builds it as it loads: Lingua's models take a second or two)."""
        return LanguageDetector(self.cfg.languages)

    def spoken(self, text: str, s: Settings, normalize: bool) -> str:
        """The text as it is spoken: respelled (the lexicon), then, if `normalize`, its numbers and symbols read out
        in its language (named, else detected)."""
        lexicon = self.lexicon
        text = lexicon.apply(text) if lexicon is not None else text
        if normalize:
            language = s.language or (self.detector.detect(text) if s.by_language else None)
            text = self.normalizer.normalize(text, language)
        return text

    def cap(self, tokens: int) -> int:
        """The frames a segment whose prompt holds `tokens` text tokens may speak at most (see CAP_FLOOR_S)."""
        return self.cap_floor + FRAMES_PER_TOKEN * tokens

    def settings(self, req: SpeechRequest) -> Settings:
        """Validates all but the text."""
        vector, reference = self._clone(req.clone)
        voice = None if req.clone is not None else self._voice(req.voice)
        speaker = voice.speaker if voice else None
        prefix = codec_prefix(self.cfg, req.language, speaker, vector=vector is not None)
        named = req.language.lower() if req.language and req.language.lower() != "auto" else None
        by_language = None
        if named is None and self.detects and not isinstance(req, StreamingSpeechRequest) and self.detector.languages:
            by_language = {lang: codec_prefix(self.cfg, lang, speaker, vector=vector is not None)
                           for lang in self.detector.languages}
        description = voice.description if voice else None
        if req.design:  # a description that leaves no room is the voice's fault, not the request's instructions'
            self.check_design(req.design, "voice", len(prefix))
        instructions = "\n".join(t for t in (description, req.design, req.instructions) if t) or None
        instruct = self._instruct_ids(instructions)
        params = self.sampling(req)
        limit = req.max_frames
        if limit is not None and not 1 <= limit <= MAX_FRAMES_LIMIT:
            raise RequestError(f"max_frames must be between 1 and {MAX_FRAMES_LIMIT}", param="max_frames")
        seed = req.seed if req.seed is not None else int.from_bytes(os.urandom(4), "little")
        if not 0 <= seed < 2**63:
            raise RequestError("seed must be a non-negative 63-bit integer", param="seed")
        # 31 bits, as since the first release, so that a seed's audio stays what it was (the sampler hashes 32-bit
        # words, talker/sampler.py): seeds that differ only above bit 30 give the same audio (README, `seed`)
        return Settings(prefix, instruct, params, seed & 0x7FFFFFFF, min(self.max_frames, limit or self.max_frames),
                        limit, vector, reference, named, by_language)

    def prepare_stream(self, req: SpeechRequest) -> Settings:
        """A request whose text arrives over time (its text is validated as it comes)."""
        if req.text_layout is not None and not self.streaming_layout(req.text_layout):
            raise RequestError("a text that arrives over time is fed one token per frame: text_layout must be "
                               "'streaming' (or left out)", param="text_layout")
        s = self.settings(req)
        if s.reference is not None:
            raise RequestError("a voice cloned in context (with a transcript) needs the whole text up front: send "
                               "the text at once, or use a voice made without a transcript", param="voice")
        self._budget(s)  # instructions that leave no room are refused as for any request
        return s

    def streaming_layout(self, layout: TextLayout | str | None) -> bool:
        if layout is None:  # generation_config's key, else the official default of the checkpoint's task
            full = self.gen.non_streaming_mode
            return not full if full is not None else self.kind is VoiceKind.BASE
        try:
            return TextLayout(layout) is TextLayout.STREAMING
        except ValueError:
            raise RequestError("text_layout must be 'full' or 'streaming'", param="text_layout") from None

    def stream_prompt(self, s: Settings, head: list[int]) -> PromptIds:
        """The prompt of a text that arrives over time, from the first tokens of `assistant\\n{text}`: the role's
        two and the text's first. The rest is fed one token per frame (`Seq.feed`)."""
        return s.prompt((self.tokenizer.ids[IM_START], *head[:3], *self.tokenizer.assistant_tail()), True)

    def split(self, text: str, s: Settings) -> list[str]:
        """The text's segments: each one's speech fits one generation."""
        return split_text(text, self._budget(s), self._count, self.tokenizer.cut)

    def _count(self, text: str) -> int:
        return len(self.tokenizer.plain(text))

    def _budget(self, s: Settings) -> int:
        """Text tokens per segment: its speech fits max_frames, and its prompt fits the slot beside the rest."""
        ref = s.reference
        held = (len(ref.text_ids), len(ref.codes)) if ref else None
        room, width = self._room(s.prefix_len, len(s.instruct or ()), held)
        if room < MIN_SEGMENT_TOKENS or (ref is not None and width < MIN_SEGMENT_TOKENS):
            raise self._no_room(len(s.instruct or ()), held)
        return max(1, min(self.max_frames // FRAMES_PER_TOKEN, width, room))

    def _room(self, prefix: int, instruct: int, reference: tuple[int, int] | None) -> tuple[int, int]:
        """Text tokens a segment's prompt has room for, and its text row's: beside the codec prefix, the
        instructions and an in-context reference (`reference`: its transcript's tokens and its frames)."""
        overhead = len(self.tokenizer.assistant("")) + prefix + instruct + 2
        if reference is None:
            return self.max_prompt - overhead, self.text_width - 1
        words, frames = reference  # each segment repeats the reference, and a trailing row holds its transcript too
        return self.max_prompt - overhead - words - frames - 2, self.text_width - 1 - words

    def _no_room(self, instruct: int, reference: tuple[int, int] | None) -> RequestError:
        """The error that names what takes the prompt's room: the instructions, the cloned voice's reference, or
        (neither) a model whose prompt is too small for any input."""
        if reference is not None and sum(reference) >= instruct:
            words, frames = reference
            return RequestError(
                f"the cloned voice's reference is too long for this model: its transcript ({words} tokens) and "
                f"recording ({frames} frames) leave fewer than {MIN_SEGMENT_TOKENS} of the {self.max_prompt} "
                "prompt tokens for the input; make the voice again with a shorter transcript or recording",
                param="voice")
        if instruct:
            return RequestError(
                f"instructions are too long for this model: they take {instruct} of the {self.max_prompt} prompt "
                f"tokens a request has, and at least {MIN_SEGMENT_TOKENS} must be left for the input; shorten them",
                param="instructions")
        return RequestError(f"this model's prompt ({self.max_prompt} tokens) leaves no room for an input",
                            param="input")

    def check_reference(self, transcript: str, frames: int, param: str) -> None:
        """Refuses a cloned voice's transcript (with its recording's `frames`) that leaves an input too little room:
        a voice made with it could never speak. `param`: the field that carries the transcript."""
        words = len(self.tokenizer.reference(transcript))
        prefix = len(codec_prefix(self.cfg, None, None, vector=True)) + 1  # + a language's token, when one is asked
        room, width = self._room(prefix, 0, (words, frames))
        if room >= MIN_SEGMENT_TOKENS and width >= MIN_SEGMENT_TOKENS:
            return
        limit = words - MIN_SEGMENT_TOKENS + min(room, width)
        recording = f" beside its recording's {frames} frames" if frames else ""
        raise RequestError(
            f"{param} is too long for this model: it is {words} tokens ({len(transcript)} characters), and at most "
            f"{max(0, limit)} tokens fit{recording} (the reference is repeated in every prompt of "
            f"{self.max_prompt} tokens, and at least {MIN_SEGMENT_TOKENS} must be left for the input); shorten it",
            param=param)

    def check_design(self, description: str, param: str, prefix: int | None = None) -> None:
        """Refuses a designed voice's description that leaves an input too little room: said as instructions in every
        prompt, it would make the voice unable to speak. `param`: the field that carries it (`prompt` as the voice is
        made; `voice` as it speaks, when it was stored before this check or the server's prompt is smaller now);
        `prefix`: the request's codec prefix, else the longest one a designed voice has."""
        instruct = self._instruct_ids(description)
        if not instruct:
            return
        if prefix is None:
            prefix = len(codec_prefix(self.cfg, None, None, vector=False)) + 1  # + a language's token, when asked
        room, _ = self._room(prefix, len(instruct), None)
        if room >= MIN_SEGMENT_TOKENS:
            return
        limit = max(0, len(instruct) - MIN_SEGMENT_TOKENS + room)
        what, fix = (("the voice's description", "make the voice again with a shorter one") if param == "voice"
                     else (param, "shorten it"))
        raise RequestError(
            f"{what} is too long for this model: it is {len(instruct)} tokens ({len(description)} characters), and "
            f"at most {limit} tokens fit (a designed voice's description is said in every prompt of {self.max_prompt} "
            f"tokens, and at least {MIN_SEGMENT_TOKENS} must be left for the input); {fix}", param=param)

    def speaker_for(self, voice: str | None) -> str | None:
        found = self._voice(voice)
        return found.speaker if found else None

    def _voice(self, voice: str | None) -> Voice | None:
        if voice is not None and not voice.strip():
            raise RequestError("voice must not be empty; leave it out for the default voice", param="voice")
        if self.kind is VoiceKind.BASE:
            raise RequestError(
                f"this model clones voices and has none built in{f' (no voice {voice!r})' if voice else ''}: create "
                "one from a recording with POST /v1/audio/voices and use its id, or send ref_audio", param="voice")
        name = (voice or self.default_voice or "").lower()
        if not name and (not self.voices or self.kind is VoiceKind.VOICE_DESIGN):
            return None  # VoiceDesign without a voice: the instructions alone describe it
        found = self.voices.get(name)
        if found is None:
            names = ", ".join(sorted(self.voices))
            raise RequestError(f"unknown voice '{voice}'; available voices: {names}", param="voice")
        return found

    def _clone(self, clone: ClonePrompt | None) -> tuple[tuple[float, ...] | None, Reference | None]:
        """A cloned voice's x-vector, and its reference (in-context cloning)."""
        if clone is None:
            return None, None
        if self.kind is not VoiceKind.BASE:
            raise RequestError(f"a cloned voice needs a Base (voice cloning) checkpoint; this one is {self.kind.value}",
                               param="voice")
        if len(clone.x_vector) != self.cfg.talker.hidden_size:
            raise RequestError(f"the cloned voice's x-vector has {len(clone.x_vector)} values; this model takes "
                               f"{self.cfg.talker.hidden_size} (was the voice made for another model?)", param="voice")
        if clone.ref_codes is None:
            return clone.x_vector, None
        groups = self.cfg.num_code_groups
        if not clone.ref_text or not clone.ref_codes or any(len(f) != groups for f in clone.ref_codes):
            raise RequestError(f"an in-context cloned voice needs its transcript and {groups} codes per frame",
                               param="voice")
        return clone.x_vector, Reference(self.tokenizer.reference(clone.ref_text), clone.ref_codes)

    def _instruct_ids(self, instructions: str | None) -> tuple[int, ...] | None:
        if not instructions:
            return None
        if self.kind is VoiceKind.BASE or self.cfg.model_size.lower() in ("0b6", "0.6b"):
            return None  # Base and the 0.6B CustomVoice model take no instruction, as in the official package
        return self.tokenizer.instruct(instructions)

    def sampling(self, req: SpeechRequest) -> SamplingParams:
        g = self.gen
        temperature = req.temperature if req.temperature is not None else (g.temperature if g.do_sample else 0.0)
        params = SamplingParams(
            temperature=temperature,
            top_k=req.top_k if req.top_k is not None else g.top_k,
            top_p=req.top_p if req.top_p is not None else g.top_p,
            repetition_penalty=req.repetition_penalty if req.repetition_penalty is not None else g.repetition_penalty,
            subtalker_temperature=g.subtalker_temperature if g.subtalker_dosample else 0.0,
            subtalker_top_k=g.subtalker_top_k,
            subtalker_top_p=g.subtalker_top_p,
        )
        params.validate()
        return params

