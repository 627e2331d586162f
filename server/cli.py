"""`talkstream`: serve, say, voices (server/voices/cli.py), export-tiny and bench."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from engine import EngineConfig, api_key_from_env, resolve_checkpoint
from server.ray import cli as cli_ray
from server.voices import cli as cli_voices
from server.voices.db import Quota

if TYPE_CHECKING:
    from server.guard import SitePolicy

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
EXTENSIONS = {".wav": "wav", ".mp3": "mp3", ".opus": "opus", ".ogg": "opus", ".aac": "aac", ".flac": "flac",
              ".pcm": "pcm", ".raw": "pcm"}
PCM_BYTES_PER_S = 24000 * 2
UVICORN_SHUTDOWN_S = 5


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="talkstream", description="Streaming text-to-speech server.")
    sub = p.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTP/WebSocket server")
    _engine_flags(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (or TALKSTREAM_API_KEY)")
    serve.add_argument("--shutdown-timeout", type=float, default=10.0, help="seconds to let streams finish on exit")
    serve.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    serve.add_argument("--cors-origins", default=None, help="comma-separated allowed origins (CORS is off without)")
    serve.add_argument("--allowed-hosts", default=None,
                       help="comma-separated Host names served besides the bind address's own ('*': any; default "
                            "TALKSTREAM_ALLOWED_HOSTS; README: Security)")
    serve.add_argument("--allowed-origins", default=None,
                       help="comma-separated origins of pages that may POST, DELETE and open the WebSocket besides "
                            "the server's own and --cors-origins ('*': any; default TALKSTREAM_ALLOWED_ORIGINS)")
    serve.add_argument("--log-input", action="store_true", help="log request input text (off by default)")
    serve.add_argument("--codec-timeout", type=float, default=None,
                       help="seconds a codec decode may take before the engine is marked dead (default 30)")
    serve.add_argument("--max-connections", type=int, default=None,
                       help="open connections past which requests get 503 (default: half the open-file limit)")
    serve.add_argument("--data-dir", type=Path, default=None,
                       help="where created voices are kept (default: TALKSTREAM_DATA_DIR, else "
                            "$XDG_DATA_HOME/talkstream, else ~/.local/share/talkstream)")
    serve.add_argument("--voice-storage-quota", type=int, default=None, metavar="BYTES",
                       help="bytes of consent recordings and voice data the voice library may hold (default "
                            "TALKSTREAM_VOICE_STORAGE_QUOTA, else 1 GiB)")
    serve.add_argument("--max-voices", type=int, default=None,
                       help="created voices the library may hold (default TALKSTREAM_MAX_VOICES, else 1000)")
    cli_ray.add_flags(serve)

    say = sub.add_parser("say", help="synthesize TEXT into a file, streaming")
    say.add_argument("text")
    say.add_argument("-o", "--output", required=True, type=Path)
    say.add_argument("--url", default="http://127.0.0.1:8000")
    say.add_argument("--voice", default="alloy", help="a built-in voice, or a created one's name or id")
    say.add_argument("--format", choices=sorted(set(EXTENSIONS.values())), help="default: from the extension")
    say.add_argument("--speed", type=float, default=1.0)
    say.add_argument("--seed", type=int, default=None)
    say.add_argument("--instructions", default=None)
    say.add_argument("--api-key", default=None)
    say.add_argument("--local", action="store_true", help="run an in-process engine instead of calling a server")
    say.add_argument("--timestamps", action="store_true",
                     help="print each word's start and end (seconds, tab-separated) on stdout; the server (or "
                          "--local with --aligner) needs an aligner")
    _engine_flags(say)
    cli_voices.add_parser(sub)

    download = sub.add_parser("download", help="fetch a Hub model into the cache ahead of time (e.g. in an image)")
    download.add_argument("model", help="a Hugging Face Hub repository id, e.g. Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice")
    download.add_argument("--revision", default=None, help="a branch, tag or commit (default main)")

    export = sub.add_parser("export-tiny", help="write the embedded tiny checkpoint to DIR")
    export.add_argument("dir", type=Path)
    export.add_argument("--size", default="tiny", choices=("tiny", "0.6b", "1.7b"),
                        help="0.6b, 1.7b: random weights at Qwen3-TTS-12Hz-0.6B's or -1.7B's layer sizes "
                             "(for benchmarks at real sizes)")
    export.add_argument("--kind", default="custom_voice", choices=("custom_voice", "base", "voice_design"),
                        help="the checkpoint's kind: base (voice cloning: random speaker and Mimi encoders too), "
                             "voice_design (voices described in instructions); neither has speakers")

    # `python -m benchmarks`, which lives with them: the server never loads them (they load the server)
    bench = sub.add_parser("bench", add_help=False,
                           help="benchmarks that print figures (serve, step-gap, ...; `talkstream bench --help`)")
    bench.add_argument("args", nargs=argparse.REMAINDER)
    return p


def _engine_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", action="append", default=None,
                   help="'tiny' (default), a checkpoint directory, or a Hugging Face Hub id (downloaded, then cached); "
                        "serve takes several (a request's model picks one; OpenAI's model names mean the first)")
    p.add_argument("--revision", default=None, help="of a Hub model: a branch, tag or commit (default main)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None)
    p.add_argument("--output-mode", choices=("async", "sync"), default=None)
    p.add_argument("--quantize", choices=("int8",), default=None,
                   help="int8 weights for the Talker's linear layers: ~3x faster on a CPU at real sizes, "
                        "a quarter of the memory; the audio differs from full precision (docs/benchmarks-reference.md)")
    p.add_argument("--compile", choices=("auto", "on", "off"), default=None,
                   help="the decode step compiled by torch.compile (Inductor; on a CPU it needs a C compiler): "
                        "auto (default) where measured faster (real checkpoints on a CPU), on, or off (eager)")
    p.add_argument("--max-batch", type=int, default=None)
    p.add_argument("--max-queue", type=int, default=None)
    p.add_argument("--lexicon", type=Path, default=None, metavar="FILE",
                   help="respellings: a JSON object of word → spelling the model says right, applied to whole words "
                        "(case-insensitive) before a text is spoken; SIGHUP reloads it (default TALKSTREAM_LEXICON)")
    p.add_argument("--aligner", default=None, metavar="MODEL",
                   help="a Qwen3-ForcedAligner checkpoint (directory or Hub id, e.g. Qwen/Qwen3-ForcedAligner-0.6B): "
                        "word timestamps for requests that ask (default TALKSTREAM_ALIGNER)")


def engine_configs(args: argparse.Namespace) -> list[EngineConfig]:
    """One engine config per --model (one for the default model when none is given)."""
    return [EngineConfig.from_env(model=model, revision=args.revision, device=args.device,
                                  output_mode=args.output_mode, quantize=args.quantize, max_batch=args.max_batch,
                                  max_queue=args.max_queue, compile=args.compile, lexicon=args.lexicon,
                                  aligner=args.aligner)
            for model in args.model or [None]]


def engine_config(args: argparse.Namespace) -> EngineConfig:
    configs = engine_configs(args)
    if len(configs) > 1:
        raise ValueError("only `serve` takes more than one --model")
    return configs[0]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # its options are the benchmark's own, `--help` among them
        return subprocess.call([sys.executable, "-m", "benchmarks", *argv[1:]])
    args = parser().parse_args(argv)
    try:
        match args.command:
            case "serve":
                return serve(args)
            case "say":
                return say(args)
            case "voices":
                return cli_voices.main(args)
            case "download":
                print(resolve_checkpoint(args.model, args.revision, refresh=True))
                return 0
            case "export-tiny":
                from engine.tiny import export_tiny

                print(export_tiny(args.dir, args.size, args.kind))
                return 0
            case _:
                raise AssertionError(f"unhandled command {args.command}")
    except (ValueError, OSError) as exc:
        print(f"talkstream: error: {exc}", file=sys.stderr)
        return 2


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from server.app import create_app
    from server.drain import DrainingServer
    from server.http_protocol import raise_open_file_limit, uvicorn_options
    from server.state import state_of

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.max_connections is not None and args.max_connections < 1:
        raise ValueError("--max-connections must be at least 1")
    raise_open_file_limit()  # before the options: the default connection limit is derived from it
    origins = [o.strip() for o in args.cors_origins.split(",") if o.strip()] if args.cors_origins else None
    quota = Quota.from_env(args.voice_storage_quota, args.max_voices)
    configs = engine_configs(args)
    for config in configs:
        if config.model != "tiny":  # fetched (with progress bars) or found in the cache now, so that a bad id or an
            resolve_checkpoint(config.model, config.revision)  # unreachable Hub is one line, not an engine failing
    if args.codec_timeout is not None:
        configs = [c.tuned(codec_timeout_s=args.codec_timeout) for c in configs]
    if args.ray:  # replicas on Ray Serve, behind its proxy (server/ray/cli.py)
        return cli_ray.serve(args, configs, args.api_key or api_key_from_env(), origins)
    app = create_app(configs, args.api_key or api_key_from_env(), shutdown_timeout=args.shutdown_timeout,
                     exit_on_dead=True, cors_origins=origins, log_input=args.log_input, data_dir=args.data_dir,
                     voice_quota=quota, site=site_policy(args))
    # the drain (SIGTERM) already let streams finish within --shutdown-timeout: uvicorn's own wait is a backstop
    uv = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                        timeout_graceful_shutdown=UVICORN_SHUTDOWN_S,
                        **uvicorn_options(max_connections=args.max_connections))
    DrainingServer(uv, state_of(app), args.shutdown_timeout).run()
    return 0  # after a signal too: a graceful shutdown (a dead engine exits 3, a failed start 3 from uvicorn)


def site_policy(args: argparse.Namespace) -> SitePolicy:
    """The Hosts and origins `serve` answers (server/guard.py), from its flags and TALKSTREAM_ALLOWED_*."""
    from server.guard import SitePolicy

    return SitePolicy.from_settings(args.host, args.allowed_hosts, args.allowed_origins)


# say ------------------------------------------------------------------------------------------------------
def say(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    fmt = args.format or EXTENSIONS.get(args.output.suffix.lower())
    if fmt is None:
        raise ValueError(f"cannot tell the format from '{args.output.suffix}'; pass --format")
    said: dict[str, Any] = {"words": []}  # how it ended: the transcript (the text as read out), the language, the
    # status; and the words' times
    source = _local(args, fmt, said) if args.local else _remote(args, fmt, said)
    with args.output.open("wb") as f, tqdm(unit="B", unit_scale=True, desc=args.output.name) as bar:
        asyncio.run(_write(source, f, bar, fmt))
    if fmt == "wav":
        _patch_wav_sizes(args.output)
    elif fmt == "flac":
        _patch_flac_length(args.output)
    language = f" ({said['language']})" if said.get("language") else ""
    print(f"said{language}: {said.get('transcript') or args.text}", file=sys.stderr)
    if (details := said.get("status_details")) is not None:
        print(f"incomplete: {details.get('reason')}", file=sys.stderr)
    for word in said["words"]:
        print(f"{word['start']:.3f}\t{word['end']:.3f}\t{word['word']}")
    return 0


async def _write(source: AsyncIterator[bytes], f: BinaryIO, bar: Any, fmt: str) -> None:
    total = 0
    async for data in source:
        f.write(data)
        total += len(data)
        bar.update(len(data))
        if fmt in ("pcm", "wav"):
            bar.set_postfix(audio=f"{total / PCM_BYTES_PER_S:.1f}s")


async def _remote(args: argparse.Namespace, fmt: str, said: dict[str, Any]) -> AsyncIterator[bytes]:
    """The audio over SSE: its events carry the audio, then how it ended (`said`)."""
    import httpx

    key = args.api_key or api_key_from_env()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": "tts-1", "input": args.text, "voice": args.voice, "response_format": fmt, "speed": args.speed,
            "seed": args.seed, "instructions": args.instructions, "stream_format": "sse",
            "timestamps": "word" if args.timestamps else None}
    body = {k: v for k, v in body.items() if v is not None}
    async with (httpx.AsyncClient(base_url=args.url, timeout=httpx.Timeout(30.0, read=120.0)) as client,
                client.stream("POST", "/v1/audio/speech", json=body, headers=headers) as resp):
        if resp.status_code != 200:
            await resp.aread()
            raise OSError(f"the server answered {resp.status_code}: {resp.text}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "speech.audio.delta":
                yield base64.b64decode(event["audio"])
            elif event["type"] == "speech.audio.timestamps":
                said["words"] += event["words"]
            elif event["type"] == "speech.audio.done":
                said.update(event)
            else:
                raise OSError(f"the speech failed: {event.get('error', {}).get('message', event)}")


async def _local(args: argparse.Namespace, fmt: str, said: dict[str, Any]) -> AsyncIterator[bytes]:
    from engine import Engine, SpeechRequest, Timestamps
    from server.audio.transcode import AudioFormat, Transcoder

    engine = Engine(engine_config(args))
    await engine.start()
    transcoder = Transcoder(AudioFormat(fmt), engine.sample_rate, None, args.speed)
    try:
        stream = engine.submit(SpeechRequest(text=args.text, voice=args.voice, seed=args.seed,
                                             instructions=args.instructions, timestamps=args.timestamps))
        async for item in stream.events():
            if isinstance(item, Timestamps):
                said["words"] += [{"word": w, "start": a / args.speed, "end": b / args.speed} for w, a, b in item.words]
            else:
                yield await asyncio.to_thread(transcoder.encode, item)
        yield transcoder.flush()
        said.update(transcript=stream.transcript, language=stream.language)
    finally:
        transcoder.close()
        await engine.stop()


def _patch_wav_sizes(path: Path) -> None:
    """A streamed WAV header says 'unknown length'; a finished file can say its real sizes."""
    size = path.stat().st_size
    if size < 44:
        return
    with path.open("r+b") as f:
        f.seek(4)
        f.write((size - 8).to_bytes(4, "little"))
        f.seek(40)
        f.write((size - 44).to_bytes(4, "little"))


FLAC_STREAMINFO_END = 26  # "fLaC", a block header, then STREAMINFO, whose bytes 10-17 end in the sample count
FLAC_SAMPLES_BITS = 36


def _patch_flac_length(path: Path) -> None:
    """A streamed FLAC's STREAMINFO says 'total samples unknown' (0), which some readers (libsndfile) cannot take;
    a finished file can say its real count. Its MD5 stays zero, which the format defines as 'not computed'."""
    import av

    with path.open("r+b") as f:
        head = f.read(FLAC_STREAMINFO_END)
        if len(head) < FLAC_STREAMINFO_END or head[:4] != b"fLaC" or head[4] & 0x7F != 0:
            return  # not a FLAC stream that starts with its STREAMINFO block
        with av.open(str(path)) as container:  # decoding is the one count that cannot misread a frame header
            samples = sum(frame.samples for frame in container.decode(audio=0))
        mask = (1 << FLAC_SAMPLES_BITS) - 1
        packed = int.from_bytes(head[18:26], "big") & ~mask | min(samples, mask)
        f.seek(18)
        f.write(packed.to_bytes(8, "big"))


if __name__ == "__main__":
    raise SystemExit(main())
