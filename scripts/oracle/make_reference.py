"""Write the official package's reference outputs for a tiny checkpoint that Talkstream's generator wrote.

Runs in the oracle environment (scripts/oracle/setup), never in Talkstream's. Use the wrapper, which also exports
the checkpoint and records where it came from:

    scripts/oracle/make_reference            # -> tests/fixtures/oracle_tiny.npz + oracle_tiny_config.json

It drives the official `Qwen3TTSModel` (the `qwen_tts` wrapper users call) the way `generate_custom_voice` does:
the wrapper's tokenization and prompt text, then `model.generate(...)` with that request's speaker, language,
instruction and text mode, one request at a time; it keeps the codes (which `generate_custom_voice` decodes and drops)
and decodes one of them with the official speech tokenizer.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Each greedy case: text, voice as a Talkstream client names it, the checkpoint speaker the official package gets
# (OpenAI aliases are mapped by Talkstream; the official package only knows the checkpoint's speakers), language,
# instructions, text mode (non_streaming_mode=True is the official generate_custom_voice default; False feeds the
# text one token per frame, which is what the tiny model's EOS wiring needs) and the frame cap.
CASES: list[dict[str, Any]] = [
    dict(text="hello world this is a tiny test", voice="aria", speaker="aria", language="auto",
         instructions=None, non_streaming_mode=False, max_new_tokens=96),
    dict(text="the quick brown fox jumps over the lazy dog", voice="ben", speaker="ben", language="english",
         instructions=None, non_streaming_mode=False, max_new_tokens=96),
    dict(text="speech", voice="ballad", speaker="cleo", language="auto",
         instructions=None, non_streaming_mode=False, max_new_tokens=96),
    dict(text="we can talk about the water and the day", voice="dev", speaker="dev", language="chinese",
         instructions="say it like a fox", non_streaming_mode=False, max_new_tokens=96),
    # full-text mode: every frame is fed tts_pad, which the tiny model's EOS wiring reads as "text done", so it
    # stops at the earliest frame the official package allows (min_new_tokens=2); the cap is there in case it does not
    dict(text="hello world this is a tiny test", voice="dev", speaker="dev", language="auto",
         instructions=None, non_streaming_mode=True, max_new_tokens=40),
    dict(text="the quick brown fox", voice="coral", speaker="dev", language="english",
         instructions=None, non_streaming_mode=True, max_new_tokens=40),
]
WAVE_CASE = 0
SAMPLED_CASE = 0
SAMPLED_SEEDS = (0, 1, 2, 3, 4, 5, 6, 7)


def patched_copy(src: Path, dst: Path) -> Path:
    """A copy of the checkpoint whose configs reload in transformers 4.57.3: a sub-config saved with
    `"model_type": ""` (e.g. the speaker encoder's) fails to reload unless that key is dropped."""
    shutil.copytree(src, dst)
    for cfg_path in dst.rglob("config.json"):
        data = json.loads(cfg_path.read_text())
        if _drop_empty_model_type(data):
            cfg_path.write_text(json.dumps(data, indent=2))
    return dst


def _drop_empty_model_type(node: Any) -> bool:
    changed = False
    if isinstance(node, dict):
        if node.get("model_type") == "":
            del node["model_type"]
            changed = True
        for value in node.values():
            changed |= _drop_empty_model_type(value)
    return changed


def generate(tts: Any, case: dict[str, Any], **sampling: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> (codes [T, 16], input ids, first-frame codebook-0 logits) of one request, as generate_custom_voice makes
    them. The logits (before suppression and sampling) depend on every prompt token, the speaker included, which the
    tiny model's greedy codes alone may not reveal."""
    calls: list[torch.Tensor] = []
    hook = tts.model.talker.codec_head.register_forward_hook(lambda _m, _i, out: calls.append(out[0, -1].float()))
    ids = tts._tokenize_texts([tts._build_assistant_text(case["text"])])
    instruct = case["instructions"]
    instruct_ids = [tts._tokenize_texts([tts._build_instruct_text(instruct)])[0] if instruct else None]
    with torch.inference_mode():
        codes, _ = tts.model.generate(
            input_ids=ids, instruct_ids=instruct_ids, languages=[case["language"]], speakers=[case["speaker"]],
            non_streaming_mode=case["non_streaming_mode"], max_new_tokens=case["max_new_tokens"], **sampling,
        )
    hook.remove()
    return (codes[0].cpu().numpy().astype(np.int16), ids[0][0].cpu().numpy().astype(np.int32),
            calls[0].cpu().numpy().astype(np.float32))


GREEDY = dict(do_sample=False, subtalker_dosample=False, repetition_penalty=1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", type=Path, help="a tiny checkpoint written by `talkstream export-tiny DIR`")
    ap.add_argument("--out", type=Path, default=Path("tests/fixtures/oracle_tiny.npz"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    from qwen_tts import Qwen3TTSModel

    with tempfile.TemporaryDirectory() as tmp:
        tts = Qwen3TTSModel.from_pretrained(str(patched_copy(args.checkpoint, Path(tmp) / "ckpt")),
                                            dtype=torch.float32)
    arrays: dict[str, np.ndarray] = {}
    for i, case in enumerate(CASES):
        codes, ids, logits = generate(tts, case, **GREEDY)
        arrays[f"codes_{i}"], arrays[f"ids_{i}"], arrays[f"logits_{i}"] = codes, ids, logits
        case["frames"] = int(codes.shape[0])
        case["eos"] = bool(codes.shape[0] < case["max_new_tokens"])
        print(f"case {i}: {case['frames']} frames, eos={case['eos']}: {case['text']!r} ({case['voice']})")
    wavs, sr = tts.model.speech_tokenizer.decode([{"audio_codes": torch.from_numpy(arrays[f"codes_{WAVE_CASE}"])
                                                   .long()}])
    arrays["wave"] = np.asarray(wavs[0], dtype=np.float32)
    sampling = {k: v for k, v in tts.generate_defaults.items() if k not in ("max_new_tokens", "non_streaming_mode")}
    for seed in SAMPLED_SEEDS:
        torch.manual_seed(seed)
        arrays[f"sampled_{seed}"], _, _ = generate(tts, CASES[SAMPLED_CASE], **sampling)
        print(f"sampled seed {seed}: {arrays[f'sampled_{seed}'].shape[0]} frames")
    meta = dict(cases=CASES, wave_case=WAVE_CASE, sample_rate=int(sr), sampled_case=SAMPLED_CASE,
                sampled_seeds=list(SAMPLED_SEEDS), sampling=sampling, versions=_versions())
    arrays["meta"] = np.array(json.dumps(meta))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    return {name: md.version(name) for name in ("qwen-tts", "transformers", "torch")}


if __name__ == "__main__":
    main()
