"""Prompt embeddings: one batched call gives each prompt what it gets alone, in the official layout."""

from dataclasses import replace
from pathlib import Path

import torch

from talker.models.loader import load_talker
from talker.models.qwen3_tts.prompt import NO_CODEC, PromptIds, prompt_embeds, prompt_layout


def test_a_batch_of_prompts_embeds_as_each_alone(tiny_dir: Path) -> None:
    loaded = load_talker(tiny_dir, torch.device("cpu"), torch.float32)
    talker, cfg = loaded.model.talker, loaded.cfg
    c = cfg.codec
    base = PromptIds((1, 2, 3, 40, 41, 42, 4, 5, 6, 7, 8), None, (c.nothink, c.think_bos, c.think_eos, c.pad, c.bos))
    prompts = [base, replace(base, streaming_text=True), replace(base, instruct_ids=(9, 10, 11)),
               replace(base, text_ids=(1, 2, 3, 40, 4, 5, 6, 7, 8))]
    batch, lengths = prompt_embeds(talker, cfg, prompts, torch.device("cpu"))
    assert batch.shape == (4, max(lengths), cfg.talker.hidden_size)
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
