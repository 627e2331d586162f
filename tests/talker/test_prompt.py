"""Prompt embeddings: one batched call gives each prompt what it gets alone, in the official layout."""

from dataclasses import replace
from pathlib import Path

import torch

from talker.models.loader import load_talker
from talker.models.qwen3_tts.prompt import (
    NO_CODEC,
    REF_FRAME,
    SPEAKER_VECTOR,
    PromptIds,
    Reference,
    prompt_embeds,
    prompt_layout,
    trailing_text,
)


def test_a_batch_of_prompts_embeds_as_each_alone(tiny_dir: Path) -> None:
    loaded = load_talker(tiny_dir, torch.device("cpu"), torch.float32)
    talker, cfg = loaded.model.talker, loaded.cfg
    c = cfg.codec
    base = PromptIds((1, 2, 3, 40, 41, 42, 4, 5, 6, 7, 8), None, (c.nothink, c.think_bos, c.think_eos, c.pad, c.bos))
    cloned = replace(base, codec_prefix=(c.nothink, c.think_bos, c.think_eos, SPEAKER_VECTOR, c.pad, c.bos),
                     speaker_vector=tuple(float(i) for i in range(cfg.talker.hidden_size)))
    g = cfg.num_code_groups
    in_context = replace(cloned, reference=Reference((50, 51), ((1,) * g, (2,) * g)))
    prompts = [base, replace(base, streaming_text=True), replace(base, instruct_ids=(9, 10, 11)),
               replace(base, text_ids=(1, 2, 3, 40, 4, 5, 6, 7, 8)), cloned, in_context,
               replace(in_context, streaming_text=True)]
    batch, lengths = prompt_embeds(talker, cfg, prompts, torch.device("cpu"))
    assert batch.shape == (len(prompts), max(lengths), cfg.talker.hidden_size)
    for i, prompt in enumerate(prompts):
        alone, (n,) = prompt_embeds(talker, cfg, [prompt], torch.device("cpu"))
        assert n == lengths[i] <= prompt.token_bound
        assert torch.allclose(batch[i, :n], alone[0], atol=1e-6)
        assert torch.equal(batch[i, n:], torch.zeros_like(batch[i, n:]))  # right padding


def test_layout_follows_the_official_order(tiny_dir: Path) -> None:
    loaded = load_talker(tiny_dir, torch.device("cpu"), torch.float32)
    cfg = loaded.cfg
    c, x = cfg.codec, cfg.text
    prefix = (c.nothink, c.think_bos, c.think_eos, c.pad, c.bos)
    ids = PromptIds((1, 2, 3, 40, 41, 4, 5, 6, 7, 8), (9, 10), prefix)
    text, codec = prompt_layout(cfg, ids)
    # instruct, role tokens, then pads over the codec prefix, then the text over codec pads, then tts_pad + bos
    assert text == [9, 10, 1, 2, 3, x.tts_pad, x.tts_pad, x.tts_pad, x.tts_bos, 40, 41, x.tts_eos, x.tts_pad]
    assert codec == [NO_CODEC] * 5 + list(prefix[:-1]) + [c.pad] * 3 + [c.bos]
    streaming_text, streaming_codec = prompt_layout(cfg, replace(ids, streaming_text=True))
    assert streaming_text[-1] == 40 and streaming_codec[-1] == c.bos and len(streaming_text) == 10


def test_in_context_cloning_follows_the_official_layouts(tiny_dir: Path) -> None:
    """The reference's words and the text over codec pads then its frames over tts_pad (full text), or words and
    frames side by side with the words left over fed one per frame (streaming text); the x-vector where a speaker
    id would go."""
    cfg = load_talker(tiny_dir, torch.device("cpu"), torch.float32).cfg
    c, x = cfg.codec, cfg.text
    prefix = (c.nothink, c.think_bos, c.think_eos, SPEAKER_VECTOR, c.pad, c.bos)
    frames = ((7,) * cfg.num_code_groups,) * 3
    ids = PromptIds((1, 2, 3, 40, 41, 4, 5, 6, 7, 8), None, prefix, speaker_vector=(0.0,) * cfg.talker.hidden_size,
                    reference=Reference((50, 51), frames))
    text, codec = prompt_layout(cfg, ids)
    head = [1, 2, 3, x.tts_pad, x.tts_pad, x.tts_pad, x.tts_pad, x.tts_bos]
    assert codec[:8] == [NO_CODEC] * 3 + list(prefix[:-1])
    words = [50, 51, 40, 41, x.tts_eos]
    assert text == head + words + [x.tts_pad] * 4
    assert codec[8:] == [c.pad] * 5 + [c.bos] + [REF_FRAME] * 3
    assert trailing_text(cfg, ids) == []
    streaming = replace(ids, streaming_text=True)
    text, codec = prompt_layout(cfg, streaming)
    assert text == head + words[:4] and codec[8:] == [c.bos] + [REF_FRAME] * 3
    assert trailing_text(cfg, streaming) == [x.tts_eos]  # one word more than frames
    short = replace(streaming, reference=Reference((50,), frames * 3))  # more frames than words: tts_pad after
    text, codec = prompt_layout(cfg, short)
    assert text == head + [50, 40, 41, x.tts_eos] + [x.tts_pad] * 6 and trailing_text(cfg, short) == []
    assert all(len(prompt_layout(cfg, p)[0]) <= p.token_bound for p in (ids, streaming, short))
