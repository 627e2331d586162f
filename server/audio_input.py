"""Audio that clients send (a voice sample, a consent recording, a one-off `ref_audio`): decoded from any container
PyAV reads into what the voice encoders take, 24 kHz mono float32 in [-1, 1]. Every refusal is a 400 whose message
says what to change, with `param` naming the field."""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import re

import av
import numpy as np

from server import errors

RATE = 24000
MAX_BYTES = 10 * 2**20  # encoded, as OpenAI's voice uploads
MIN_SECONDS = 1.0
MAX_SECONDS = 30.0
# A peak below -60 dBFS is silence (or a gain mistake) to a speaker encoder: it would make a voice of noise.
SILENT_PEAK = 1e-3
# Demuxers that hold audio files. Playlist and concat demuxers (hls, concat...) open other URLs or files named inside
# the data: never from a client's bytes.
FORMATS = "wav,w64,mp3,flac,ogg,matroska,webm,mov,mp4,m4a,3gp,3g2,mj2,aac,aiff,caf"
KINDS = "wav, mp3, flac, ogg/opus, webm, m4a or aac"
_DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(?:;[\w.+-]+=[^;,]*)*)(?P<b64>;base64)?,",
                       re.ASCII)
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
    """24 kHz mono float32 samples of an encoded audio file, checked against the limits. Blocking: run it off the
    event loop (`decode_async`)."""
    if not data:
        raise errors.invalid(f"{param}: the audio is empty", param, "invalid_audio")
    if len(data) > MAX_BYTES:
        raise too_big(param)
    try:
        wav = _decode(data)
    except (av.FFmpegError, IndexError, ValueError):  # IndexError: no audio stream
        wav = None
    if wav is None or wav.size == 0:
        raise errors.invalid(f"{param}: could not be decoded as audio; send a {KINDS} file", param, "invalid_audio")
    seconds = wav.size / RATE
    if seconds < MIN_SECONDS:
        raise errors.invalid(f"{param}: the audio is {seconds:.2f} s long; at least {MIN_SECONDS:g} s is needed",
                             param, "audio_too_short")
    if seconds > MAX_SECONDS:
        raise errors.invalid(f"{param}: the audio is longer than {MAX_SECONDS:g} s; send {MAX_SECONDS:g} s at most "
                             "(5 to 15 s of clear speech is best)", param, "audio_too_long")
    if float(np.abs(wav).max()) < SILENT_PEAK:
        raise errors.invalid(f"{param}: the audio is silent (its peak is below {SILENT_PEAK:g}, -60 dBFS); send a "
                             "recording of the voice", param, "audio_silent")
    return wav


async def decode_async(data: bytes, param: str) -> np.ndarray:
    """`decode` on a worker thread: a long file takes tens of milliseconds, which the event loop must not wait."""
    return await asyncio.to_thread(decode, data, param)


def too_big(param: str) -> errors.ApiError:
    return errors.invalid(f"{param}: the audio file is larger than {MAX_BYTES // 2**20} MiB", param,
                          "audio_too_large")


def _decode(data: bytes) -> np.ndarray:
    """The first audio stream, resampled, up to just past MAX_SECONDS (a small file can hold hours of audio: the
    rest is not decoded, only noticed)."""
    limit = int(MAX_SECONDS * RATE) + RATE
    pieces: list[np.ndarray] = []
    total = 0
    with av.open(io.BytesIO(data), "r", options={"format_whitelist": FORMATS}) as container:
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format="flt", layout="mono", rate=RATE)
        for frame in container.decode(stream):
            for out in resampler.resample(frame):
                pieces.append(out.to_ndarray().reshape(-1))
                total += pieces[-1].size
            if total > limit:
                break
        else:
            pieces += [out.to_ndarray().reshape(-1) for out in resampler.resample(None)]
    wav = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    # float formats can carry values past full scale, or NaN: the encoders take [-1, 1]
    return np.clip(np.nan_to_num(wav, nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0).astype(np.float32, copy=False)
