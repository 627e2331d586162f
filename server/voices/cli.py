"""`talkstream voices`: the voice library of a running server (add, design, list, rm), as an HTTP client of its
custom voices API. `talkstream say --voice NAME` then speaks a created voice by its name."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from engine import api_key_from_env

TIMEOUT_S = 120.0  # cloning decodes and encodes the recording before the server answers


def add_parser(sub: Any) -> None:
    voices = sub.add_parser("voices", help="create, list and delete the voices of a running server")
    commands = voices.add_subparsers(dest="voices_command", required=True)
    add = commands.add_parser(
        "add", help="clone a voice from a recording (Base checkpoints)",
        description="Clone a voice from FILE (wav, mp3, flac, ogg, webm or m4a; 1 to 30 s). FILE is also uploaded as "
                    "the voice's consent recording (a consent named NAME): OpenAI's API makes a voice only under a "
                    "consent, so record the speaker agreeing to have their voice cloned.")
    add.add_argument("name")
    add.add_argument("file", type=Path)
    add.add_argument("--transcript", default=None,
                     help="the recording's words: in-context cloning, closer to the voice (without: x-vector only)")
    add.add_argument("--language", default="en", help="the consent's BCP 47 language tag (default en)")
    design = commands.add_parser("design", help="a voice made from a description (VoiceDesign checkpoints)")
    design.add_argument("name")
    design.add_argument("description", help='e.g. "A calm, deep male voice, speaking slowly."')
    commands.add_parser("list", help="the model's built-in and created voices")
    rm = commands.add_parser("rm", help="delete a created voice (its consent recording stays)")
    rm.add_argument("voice", metavar="ID_OR_NAME")
    for command in commands.choices.values():
        command.add_argument("--url", default="http://127.0.0.1:8000")
        command.add_argument("--api-key", default=None, help="default: TALKSTREAM_API_KEY")
        command.add_argument("--model", default=None, help="the served model (default: the server's first)")


def main(args: argparse.Namespace) -> int:
    import httpx

    key = args.api_key or api_key_from_env()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with httpx.Client(base_url=args.url.rstrip("/") + "/v1", headers=headers, timeout=TIMEOUT_S) as client:
            match args.voices_command:
                case "add":
                    _add(client, args)
                case "design":
                    voice = _call(client, "POST", "/audio/voices", json=_fields(
                        type="prompt", name=args.name, prompt=args.description, model=args.model))
                    print(f"{voice['id']}  {voice['name']}")
                case "list":
                    _list(client, args.model)
                case _:
                    voice_id = _find(client, args.voice, args.model)
                    _call(client, "DELETE", f"/audio/voices/{voice_id}")
                    print(f"deleted {voice_id}")
    except httpx.TransportError as exc:
        raise OSError(f"cannot reach the server at {args.url}: {exc}") from None
    return 0


def _add(client: Any, args: argparse.Namespace) -> None:
    data = args.file.read_bytes()
    consent = _call(client, "POST", "/audio/voice_consents", data={"name": args.name, "language": args.language},
                    files={"recording": (args.file.name, data)})
    try:
        voice = _call(client, "POST", "/audio/voices", files={"audio_sample": (args.file.name, data)},
                      data=_fields(name=args.name, consent=consent["id"], transcript=args.transcript,
                                   model=args.model))
    except OSError:
        _call(client, "DELETE", f"/audio/voice_consents/{consent['id']}")  # made for this voice alone
        raise
    print(f"{voice['id']}  {voice['name']}")


def _list(client: Any, model: str | None) -> None:
    listing = _call(client, "GET", "/audio/voices", params=_fields(model=model))
    builtin = [v["id"] for v in listing["data"] if v.get("object") != "audio.voice"]
    print(f"model {listing['model']}; built-in voices: {', '.join(builtin) or 'none'}")
    for v in listing["data"]:
        if v.get("object") == "audio.voice":
            print(f"{v['id']}  {v['type']:<12}  {v['name']}" + (f"  ({v['prompt']})" if v.get("prompt") else ""))


def _find(client: Any, voice: str, model: str | None) -> str:
    if voice.startswith("voice_"):
        return voice
    listing = _call(client, "GET", "/audio/voices", params=_fields(model=model))
    for v in listing["data"]:
        if v.get("object") == "audio.voice" and v["name"].lower() == voice.lower():
            return str(v["id"])
    raise ValueError(f"model {listing['model']} has no created voice named '{voice}' (talkstream voices list)")


def _call(client: Any, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
    resp = client.request(method, path, **kwargs)
    if resp.status_code >= 400:
        try:
            message = resp.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = resp.text
        raise OSError(f"the server answered {resp.status_code}: {message}")
    body: dict[str, Any] = resp.json()
    return body


def _fields(**values: str | None) -> dict[str, str]:
    return {k: v for k, v in values.items() if v is not None}
