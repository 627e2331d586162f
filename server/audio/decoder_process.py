"""Decoding a client's audio file, and the child process that does it for the server (`python -m
server.audio.decoder_process`; its parent side is server/audio/decoder.py).

Why a process: PyAV builds a resampler's filter and decodes while holding the GIL, so a hostile header (a WAV claiming
380 MHz) stalled every stream of the server for seconds; a child's GIL is its own, its memory has a ceiling
(`limit_memory`) and the parent kills it past a time budget. The checks below run before anything is allocated
from what a header declares: the sample rate, the channels, the duration, then the running count of decoded
samples, so a lying header cannot make it decode or allocate more than a real 30 s clip would.

Light on purpose: the stdlib, numpy, av and the engine package's torch-free part (never torch, nor the server's web
stack), so a child starts in a fraction of a second. Protocol on stdin/stdout: the child writes a header once it is
ready; then per job the parent writes a 4-byte big-endian length and the file's bytes, and the child answers a
4-byte length and a JSON header, followed by `samples` float32 samples when the header says ok.
"""

from __future__ import annotations

import io
import json
import os
import resource
import select
import struct
import sys

import av
import numpy as np

from engine import die_with_parent  # light: no torch (engine/__init__.py loads the heavy parts lazily)

RATE = 24000
MIN_SECONDS = 1.0
MAX_SECONDS = 30.0
# A peak below -60 dBFS is silence (or a gain mistake) to a speaker encoder: it would make a voice of noise.
SILENT_PEAK = 1e-3
# Sample rates and channels decoded. Past 384 kHz the resampler's filter grows with the rate ratio (380 MHz took
# 10 s and 2 GiB to build); below 8 kHz a frame would grow up to 3000-fold when resampled to 24 kHz.
MIN_RATE, MAX_RATE = 8000, 384000
MAX_CHANNELS = 8
# Decoded input is counted per frame, before it is resampled: past MAX_SECONDS plus this, the file is too long.
MARGIN_SECONDS = 1.0
# Frames (packets) decoded at most. A real 31 s clip has a few thousand (mp3: 1,300; opus at 2.5 ms: 12,400; PCM
# at 384 kHz: ~12,000); a file of one-sample frames costs its decoder per frame and would run to the time budget.
MAX_FRAMES = 20000
# Below the codec process's 5: an upload's decode takes what the streams leave (a budget-long decode slowed a
# stream 4x at 0).
NICE = 10
# Demuxers that hold audio files. Playlist and concat demuxers (hls, concat...) open other URLs or files named inside
# the data: never from a client's bytes.
FORMATS = "wav,w64,mp3,flac,ogg,matroska,webm,mov,mp4,m4a,3gp,3g2,mj2,aac,aiff,caf"
KINDS = "wav, mp3, flac, ogg/opus, webm, m4a or aac"
HEADER = struct.Struct(">I")
PARENT_POLL_S = 1.0
# One-thread BLAS: OpenBLAS reserves memory per core, which a memory ceiling would count; a decode needs no BLAS.
ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class Refusal(Exception):
    """Audio that is not decoded; `message` is the client's, without the field's name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def decode(data: bytes) -> np.ndarray:
    """24 kHz mono float32 samples in [-1, 1] of an encoded audio file, checked against the limits."""
    try:
        wav = _decode(data)
    except (Refusal, MemoryError):  # av's ENOMEM is a MemoryError too: past the ceiling, not a corrupt file
        raise
    except Exception:  # hostile bytes fail PyAV anywhere (IndexError: no audio stream; AttributeError: no rate)
        wav = None
    if wav is None or wav.size == 0:
        raise Refusal("invalid_audio", f"could not be decoded as audio; send a {KINDS} file")
    seconds = wav.size / RATE
    if seconds < MIN_SECONDS:
        raise Refusal("audio_too_short", f"the audio is {seconds:.2f} s long; at least {MIN_SECONDS:g} s is needed")
    if seconds > MAX_SECONDS:
        raise _too_long()
    if float(np.abs(wav).max()) < SILENT_PEAK:
        raise Refusal("audio_silent", f"the audio is silent (its peak is below {SILENT_PEAK:g}, -60 dBFS); send a "
                      "recording of the voice")
    return wav


def _too_long() -> Refusal:
    return Refusal("audio_too_long", f"the audio is longer than {MAX_SECONDS:g} s; send {MAX_SECONDS:g} s at most "
                   "(5 to 15 s of clear speech is best)")


def _check_format(rate: int, channels: int) -> None:
    if not MIN_RATE <= rate <= MAX_RATE:
        raise Refusal("unsupported_audio", f"the audio's sample rate is {rate} Hz; {MIN_RATE} to {MAX_RATE} Hz is "
                      "supported (resample it, e.g. to 24000 Hz)")
    if not 1 <= channels <= MAX_CHANNELS:
        raise Refusal("unsupported_audio", f"the audio has {channels} channels; 1 to {MAX_CHANNELS} are supported "
                      "(send mono or stereo)")


def _decode(data: bytes) -> np.ndarray:
    """The first audio stream, resampled, refused as soon as it runs past MAX_SECONDS (a small file can hold hours
    of audio, or a header can claim them: only what a 30 s clip holds is ever decoded)."""
    budget = MAX_SECONDS + MARGIN_SECONDS
    pieces: list[np.ndarray] = []
    with av.open(io.BytesIO(data), "r", options={"format_whitelist": FORMATS}) as container:
        stream = container.streams.audio[0]
        # as declared (0: not declared; then each frame says); a frame can differ (HE-AAC doubles its rate)
        _check_format(stream.sample_rate or MIN_RATE, stream.channels or 1)
        if container.duration is not None and container.duration / av.time_base > budget:
            raise _too_long()
        resampler = av.AudioResampler(format="flt", layout="mono", rate=RATE)
        seconds = 0.0
        for frames, frame in enumerate(container.decode(stream), 1):
            if frames > MAX_FRAMES:
                raise Refusal("audio_too_complex", f"the audio has more than {MAX_FRAMES} frames; send a plain "
                              "wav, mp3 or flac")
            _check_format(frame.sample_rate, len(frame.layout.channels))
            seconds += frame.samples / frame.sample_rate
            if seconds > budget:
                raise _too_long()
            pieces += [out.to_ndarray().reshape(-1) for out in resampler.resample(frame)]
        pieces += [out.to_ndarray().reshape(-1) for out in resampler.resample(None)]
    wav = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    # float formats can carry values past full scale, or NaN: the encoders take [-1, 1]
    return np.clip(np.nan_to_num(wav, nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0).astype(np.float32, copy=False)


def limit_memory(limit: int) -> None:
    """A ceiling on the child's writable private memory (RLIMIT_DATA: the heap and anonymous maps). Not its address
    space: the libraries' mapped code and reserved but untouched regions are not what a hostile file can grow."""
    if limit > 0:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def _read(n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = os.read(0, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _write(header: dict[str, object], payload: bytes = b"") -> None:
    head = json.dumps(header).encode()
    out = sys.stdout.buffer
    out.write(HEADER.pack(len(head)) + head)
    out.write(payload)
    out.flush()


def _next_job(parent: int) -> bytes | None:
    """The next file, or None when the parent is gone (stdin's EOF, or a new parent: re-parented to init)."""
    while not select.select([0], [], [], PARENT_POLL_S)[0]:
        if os.getppid() != parent:
            return None
    head = _read(HEADER.size)
    return None if head is None else _read(HEADER.unpack(head)[0])


def serve(parent: int) -> None:
    _write({"ready": True})
    while (data := _next_job(parent)) is not None:
        try:
            wav = decode(data)
        except Refusal as r:
            _write({"ok": False, "code": r.code, "message": r.message})
        except MemoryError:
            _write({"ok": False, "code": "audio_too_complex", "message": "decoding it needs more memory than "
                    f"{MAX_SECONDS:g} s of audio do; send a plain wav, mp3 or flac"})
        else:
            _write({"ok": True, "samples": int(wav.size)}, wav.tobytes())


if __name__ == "__main__":
    die_with_parent(int(sys.argv[1]))
    limit_memory(int(sys.argv[2]))
    os.nice(NICE)
    serve(int(sys.argv[1]))
