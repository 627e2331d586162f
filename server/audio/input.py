"""Audio that clients send (a voice sample, a consent recording, a one-off `ref_audio`): decoded from any container
PyAV reads into what the voice encoders take, 24 kHz mono float32 in [-1, 1], in a decoder process with a time and
memory budget (server/audio/decoder.py; the decoding and its limits: server/audio/decoder_process.py). Every refusal
is a 400 whose message says what to change, with `param` naming the field."""

from __future__ import annotations

import base64
import binascii
import re

import numpy as np

from server import errors
from server.audio import decoder as audio_decoder
from server.audio import decoder_process
from server.audio.decoder_process import KINDS, MAX_SECONDS, MIN_SECONDS, RATE, Refusal

__all__ = ["KINDS", "MAX_BYTES", "MAX_SECONDS", "MIN_SECONDS", "RATE", "decode", "decode_async", "parse_ref_audio",
           "too_big"]
MAX_BYTES = 10 * 2**20  # encoded, as OpenAI's voice uploads
_DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(?:;[\w.+-]+=[^;,]*)*)(?P<b64>;base64)?,",
                       re.ASCII | re.IGNORECASE)  # schemes and MIME types are case-insensitive (RFC 3986, 2045)
_BINARY = ("application/octet-stream", "application/ogg")


def parse_ref_audio(value: str, param: str = "ref_audio") -> bytes:
    """The bytes of audio sent inline in JSON: base64, or a `data:audio/...;base64,` URL. URLs of other kinds are
    refused: the server fetches nothing on a client's behalf."""
    text = value.strip()
    scheme = re.match(r"([a-zA-Z][a-zA-Z0-9+.-]*):", text)
    if scheme and scheme.group(1).lower() != "data":
        raise errors.invalid(f"{param}: {scheme.group(1)} URLs are not fetched (this server makes no remote "
                             "requests); send the audio itself, as base64 or a 'data:audio/wav;base64,...' URL",
                             param, "unsupported_url")
    if scheme:
        url = _DATA_URL.match(text)
        if url is None or not url.group("b64"):
            raise errors.invalid(f"{param}: a data URL must be base64, as 'data:audio/wav;base64,...'", param,
                                 "invalid_value")
        mime = (url.group("mime") or "").lower()
        if mime and not mime.startswith(("audio/", "video/")) and mime not in _BINARY:
            raise errors.invalid(f"{param}: the data URL's type is {mime}, not audio", param, "invalid_value")
        text = text[url.end():]
    text = re.sub(r"\s+", "", text)
    if len(text) > -(-MAX_BYTES // 3) * 4:  # the base64 of MAX_BYTES
        raise too_big(param)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise errors.invalid(f"{param}: not valid base64 (send the audio file's bytes base64-encoded, or a "
                             "'data:audio/wav;base64,...' URL)", param, "invalid_value") from None


def decode(data: bytes, param: str) -> np.ndarray:
    """24 kHz mono float32 samples of an encoded audio file, checked against the limits, decoded in this process
    (tests and tools; what the server decodes goes through `decode_async`)."""
    _check_size(data, param)
    try:
        return decoder_process.decode(data)
    except Refusal as r:
        raise refused(r, param) from None


async def decode_async(data: bytes, param: str) -> np.ndarray:
    """`decode` in a decoder process (server/audio/decoder.py): no client's file can stall the event loop or other
    streams, and each has a time and memory budget. 429 when too many files wait."""
    _check_size(data, param)
    try:
        return await audio_decoder.POOL.decode(data)
    except Refusal as r:
        raise refused(r, param) from None


def refused(refusal: Refusal, param: str) -> errors.ApiError:
    return errors.invalid(f"{param}: {refusal.message}", param, refusal.code)


def too_big(param: str) -> errors.ApiError:
    return errors.invalid(f"{param}: the audio file is larger than {MAX_BYTES // 2**20} MiB", param,
                          "audio_too_large")


def _check_size(data: bytes, param: str) -> None:
    if not data:
        raise errors.invalid(f"{param}: the audio is empty", param, "invalid_audio")
    if len(data) > MAX_BYTES:
        raise too_big(param)
