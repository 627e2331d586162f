"""Audio that clients send: every container the docs name decodes to 24 kHz mono float32 with its pitch kept, and
each bad input is a 400 that names its field and says what to change."""

from __future__ import annotations

import base64
import io
import wave
from fractions import Fraction

import av
import numpy as np
import pytest
import soundfile as sf

from server.audio import decoder_process
from server.audio import input as audio_input
from server.errors import ApiError
from tests.conftest import FIXTURES

REF = FIXTURES / "voice-ref-a.wav"
TONE_HZ = 440.0


def tone(seconds: float, rate: int = 44100, peak: float = 0.3, channels: int = 2) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return np.repeat((peak * np.sin(2 * np.pi * TONE_HZ * t)).astype(np.float32)[None], channels, axis=0)


def encode(samples: np.ndarray, rate: int, fmt: str, codec: str) -> bytes:
    buf = io.BytesIO()
    layout = "stereo" if samples.shape[0] == 2 else "mono"
    with av.open(buf, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate, layout=layout)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples), format="fltp", layout=layout)
        frame.rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return buf.getvalue()


def wav(samples: np.ndarray, rate: int = 24000) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def refused(code: str, param: str, fn: object, *args: object) -> str:
    with pytest.raises(ApiError) as info:
        fn(*args)  # type: ignore[operator]
    err = info.value
    assert (err.status, err.detail.code, err.detail.param) == (400, code, param), err.detail
    assert err.detail.message.startswith(f"{param}: ")
    return err.detail.message


@pytest.mark.parametrize(("fmt", "codec"), [("wav", "pcm_s16le"), ("mp3", "libmp3lame"), ("flac", "flac"),
                                            ("ogg", "libopus"), ("webm", "libopus"), ("ipod", "aac"),
                                            ("adts", "aac"), ("aiff", "pcm_s16be")])
def test_every_container_decodes_to_24k_mono_with_its_pitch(fmt: str, codec: str) -> None:
    rate = 48000 if codec == "libopus" else 44100
    out = audio_input.decode(encode(tone(2.0, rate), rate, fmt, codec), "audio_sample")
    assert out.dtype == np.float32 and out.ndim == 1
    assert abs(out.size / audio_input.RATE - 2.0) < 0.1  # encoder padding at most
    spectrum = np.abs(np.fft.rfft(out))
    assert abs(np.argmax(spectrum) * audio_input.RATE / out.size - TONE_HZ) < 2.0
    assert 0.2 < np.abs(out).max() <= 1.0


def test_a_24k_mono_wav_is_its_samples() -> None:
    samples, rate = sf.read(REF, dtype="float32")
    out = audio_input.decode(REF.read_bytes(), "recording")
    assert rate == 24000 and out.shape == samples.shape
    np.testing.assert_allclose(out, samples, atol=1e-6)


def test_full_scale_float_and_nan_are_kept_in_range() -> None:
    samples = tone(1.5, 24000, peak=3.0, channels=1)[0]
    samples[100] = np.nan
    buf = io.BytesIO()
    sf.write(buf, samples, 24000, format="WAV", subtype="FLOAT")
    out = audio_input.decode(buf.getvalue(), "audio_sample")
    assert np.isfinite(out).all() and np.abs(out).max() <= 1.0


def test_silent_short_long_big_and_corrupt_audio_are_refused() -> None:
    assert "silent" in refused("audio_silent", "audio_sample", audio_input.decode,
                               wav(np.zeros(48000, np.float32)), "audio_sample")
    quiet = tone(2.0, 24000, peak=5e-4, channels=1)[0]
    refused("audio_silent", "audio_sample", audio_input.decode, wav(quiet), "audio_sample")
    assert audio_input.decode(wav(quiet * 4), "audio_sample").size == 48000  # -54 dBFS is a (quiet) voice
    assert "at least 1 s" in refused("audio_too_short", "recording", audio_input.decode,
                                     wav(tone(0.5, 24000, channels=1)[0]), "recording")
    assert "30 s" in refused("audio_too_long", "ref_audio", audio_input.decode,
                             wav(tone(31.0, 24000, channels=1)[0]), "ref_audio")
    assert "10 MiB" in refused("audio_too_large", "audio_sample", audio_input.decode,
                               b"\0" * (audio_input.MAX_BYTES + 1), "audio_sample")
    refused("invalid_audio", "audio_sample", audio_input.decode, b"", "audio_sample")
    good = wav(tone(2.0, 24000, channels=1)[0])
    for corrupt in (np.random.default_rng(0).bytes(5000), good[:30], b"RIFF" + bytes(100), b"not audio at all"):
        message = refused("invalid_audio", "audio_sample", audio_input.decode, corrupt, "audio_sample")
        assert "wav, mp3, flac" in message


def test_a_playlist_is_never_followed() -> None:
    """hls and concat demuxers would open the URLs or files named inside the bytes: they are not allowed."""
    playlist = b"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10,\nhttp://127.0.0.1:9/a.ts\n#EXT-X-ENDLIST\n"
    concat = b"ffconcat version 1.0\nfile '/etc/passwd'\n"
    for data in (playlist, concat):
        refused("invalid_audio", "ref_audio", audio_input.decode, data, "ref_audio")
    # the list is in force: FFmpeg reads Sun's .au, which is not on it
    au = encode(tone(2.0, 24000, channels=1), 24000, "au", "pcm_s16be")
    with av.open(io.BytesIO(au)) as container:
        assert container.format.name == "au"
    refused("invalid_audio", "ref_audio", audio_input.decode, au, "ref_audio")


def test_ref_audio_is_base64_or_a_data_url() -> None:
    data = REF.read_bytes()
    b64 = base64.b64encode(data).decode()
    assert audio_input.parse_ref_audio(b64) == data
    assert audio_input.parse_ref_audio("\n".join(b64[i:i + 76] for i in range(0, len(b64), 76))) == data
    assert audio_input.parse_ref_audio(f"data:audio/wav;base64,{b64}") == data
    assert audio_input.parse_ref_audio(f"data:audio/webm;codecs=opus;base64,{b64}") == data
    assert audio_input.parse_ref_audio(f"data:application/octet-stream;base64,{b64}") == data


def test_bad_ref_audio_is_refused_before_decoding() -> None:
    for url in ("https://example.com/voice.wav", "http://127.0.0.1/x.wav", "file:///etc/passwd", "ftp://h/x"):
        message = refused("unsupported_url", "ref_audio", audio_input.parse_ref_audio, url)
        assert "not fetched" in message and "base64" in message
    refused("invalid_value", "ref_audio", audio_input.parse_ref_audio, "data:audio/wav,RIFF")
    refused("invalid_value", "ref_audio", audio_input.parse_ref_audio, "data:image/png;base64,AAAA")
    refused("invalid_value", "ref_audio", audio_input.parse_ref_audio, "not base64!")
    refused("invalid_value", "ref_audio", audio_input.parse_ref_audio, "é" * 8)
    big = "A" * (-(-audio_input.MAX_BYTES // 3) * 4 + 4)
    refused("audio_too_large", "ref_audio", audio_input.parse_ref_audio, big)


def lying_wav(rate: int, channels: int = 1, data_bytes: int = 9600) -> bytes:
    """A few KB of PCM behind a header that claims `rate` and `channels` (the stdlib writes whatever it is told)."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.random.default_rng(0).integers(-3000, 3000, data_bytes // 2, dtype="<i2").tobytes())
    return buf.getvalue()


def flac_claiming(seconds: float, declared: float) -> bytes:
    """A 24 kHz FLAC of `seconds` whose STREAMINFO says it holds `declared` seconds."""
    data = bytearray(encode(tone(seconds, 24000, channels=1), 24000, "flac", "flac"))
    # STREAMINFO's data starts at byte 8; its total sample count is the low 36 bits of bytes 10..17 of it
    word = int.from_bytes(data[18:26], "big")
    data[18:26] = ((word & ~(2**36 - 1)) | int(declared * 24000)).to_bytes(8, "big")
    return bytes(data)


@pytest.mark.parametrize(("rate", "channels", "said"), [(380_000_007, 1, "380000007 Hz"), (50_000_017, 1, "Hz"),
                                                        (20_000_003, 2, "Hz"), (7999, 1, "7999 Hz"),
                                                        (384_001, 1, "8000 to 384000 Hz"),
                                                        (24000, 64, "64 channels"), (48000, 9, "1 to 8 are")])
def test_a_header_out_of_range_is_refused_before_decoding(rate: int, channels: int, said: str) -> None:
    """380 MHz took 10 s and 2 GiB (the resampler's filter, built holding the GIL) to end as 'could not be decoded'."""
    for param in ("recording", "audio_sample", "ref_audio"):
        message = refused("unsupported_audio", param, audio_input.decode, lying_wav(rate, channels), param)
        assert said in message


def test_files_within_the_limits_decode_and_one_declared_or_counted_longer_is_refused() -> None:
    for rate, channels in ((8000, 1), (384000, 1), (44100, 8)):  # the edges of the ranges
        assert audio_input.decode(lying_wav(rate, channels, 2 * rate * channels * 2), "audio_sample").size == 48000
    # a file that declares more than the limit is refused before anything is decoded
    assert "30 s" in refused("audio_too_long", "audio_sample", audio_input.decode, flac_claiming(1.5, 60.0),
                             "audio_sample")
    # the count of decoded samples stops a file that holds more than it declares
    refused("audio_too_long", "recording", audio_input.decode, flac_claiming(40.0, 1.0), "recording")
    assert audio_input.decode(flac_claiming(2.0, 1.0), "recording").size == 48000


def wav_with_bits(bits: int) -> bytes:
    """A 1 s PCM WAV whose header says `bits` bits per sample (0 and 65535 made PyAV raise AttributeError)."""
    data = bytearray(lying_wav(24000, 1, 48000))
    data[34:36] = bits.to_bytes(2, "little")  # the fmt chunk's bits_per_sample
    return bytes(data)


def one_sample_frames(frames: int, rate: int = 384000) -> bytes:
    """Matroska holding `frames` blocks of one PCM sample each: within every declared limit, yet each frame costs its
    decoder a call (1.25 M of them ran a decoder to its time budget)."""
    buf = io.BytesIO()
    samples = np.random.default_rng(0).integers(-3000, 3000, frames, dtype="<i2").tobytes()
    with av.open(buf, "w", format="matroska") as container:
        stream = container.add_stream("pcm_s16le", rate=rate, layout="mono")
        for i in range(frames):
            packet = av.Packet(samples[2 * i:2 * i + 2])
            packet.stream, packet.time_base, packet.pts = stream, Fraction(1, rate), i
            container.mux(packet)
    return buf.getvalue()


@pytest.mark.parametrize("bits", [0, 65535])
def test_a_header_that_breaks_the_decoder_is_invalid_audio(bits: int) -> None:
    message = refused("invalid_audio", "recording", audio_input.decode, wav_with_bits(bits), "recording")
    assert "could not be decoded" in message


def test_a_file_of_too_many_frames_is_refused_at_the_limit() -> None:
    limit = decoder_process.MAX_FRAMES
    message = refused("audio_too_complex", "audio_sample", audio_input.decode, one_sample_frames(limit + 1),
                      "audio_sample")
    assert f"more than {limit} frames" in message


def test_a_data_url_scheme_is_case_insensitive() -> None:
    data = REF.read_bytes()
    assert audio_input.parse_ref_audio("DATA:audio/wav;BASE64," + base64.b64encode(data).decode()) == data
