"""One Talker decode step on the device: forward, sample codebook 0, run the code predictor, feed back.

Everything that changes per step stays on the device (input embeds, lengths, frame counters, repetition state);
what the host sends is rebuilt only when the batch composition changes.

A request whose text arrives over time (`Seq.feed`) has its slot's text row written as tokens come. When it has
made every frame its text allows, the input of its next frame is missing its text token: the feedback of its last
step sums in whatever the row holds there. So the codec part of that input is kept, and once the token arrives the
input is summed again from the same two parts, as the feedback would have summed it (`keep`, `refresh`). Such a
request's slot may go to queued work meanwhile: `park` copies out what the slot holds for it, `unpark` copies it
back into any slot (talker/parking.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from talker.kv_cache import SlotKVCache
from talker.models.qwen3_tts.config import Qwen3TTSConfig
from talker.models.qwen3_tts.fused_predictor import FusedPredictor
from talker.models.qwen3_tts.model import Talker
from talker.models.qwen3_tts.prompt import prompt_embeds, trailing_text
from talker.parking import ParkedSlot, to_host
from talker.sampler import RowParams, apply_repetition_penalty, sample, step_uniforms
from talker.sampler_native import SamplingKernel
from talker.scheduler import Seq, StepPlan

MIN_FRAMES_BEFORE_EOS = 2
SLOT_BUFFERS = ("next_embed", "text_ids", "lengths", "frames", "seen")  # the runner's per-slot state, a row each
log = logging.getLogger("talkstream.worker")
T = TypeVar("T")


@dataclass(slots=True)
class BatchTensors:
    """Per-batch tensors, stacked once per batch composition."""

    version: int
    rows: dict[int, int]  # slot -> row
    slots: Tensor  # [B]
    decode_slots: Tensor  # [Bd]
    decode_span: tuple[int, int] | None  # (first, count) when the decode slots are consecutive, in order
    talker: RowParams
    predictor: RowParams
    penalty: Tensor  # [B, 1]
    use_penalty: bool


class Runner:
    def __init__(
        self, talker: Talker, cfg: Qwen3TTSConfig, max_batch: int, max_len: int, text_width: int,
        device: torch.device, dtype: torch.dtype, kernel: SamplingKernel | None = None,
    ) -> None:
        self.talker, self.cfg, self.device = talker, cfg, device
        self.kernel = kernel
        t = cfg.talker
        self.groups = cfg.num_code_groups
        self.text_width = text_width
        self.kv = SlotKVCache(t.num_layers, max_batch, t.num_kv_heads, max_len, t.head_dim, dtype, device)
        self.predictor = FusedPredictor(talker.code_predictor, max_batch, self.groups + 1)
        self._aside_predictor = FusedPredictor(talker.code_predictor, max_batch, self.groups + 1)
        self.next_embed = torch.zeros(max_batch, t.hidden_size, dtype=dtype, device=device)
        self.text_ids = torch.full((max_batch, text_width), cfg.text.tts_pad, dtype=torch.long, device=device)
        self.lengths = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.frames = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.seen = torch.zeros(max_batch, t.vocab_size, dtype=torch.bool, device=device)
        self.suppress = torch.zeros(t.vocab_size, dtype=torch.float32, device=device)
        self.suppress[t.vocab_size - 1024 :] = float("-inf")
        self.suppress[cfg.codec.eos] = 0.0
        self._batch: BatchTensors | None = None
        self._feedback: list[tuple[BatchTensors, Tensor, Tensor, Tensor]] = []  # applied by the next forward
        self._aside = False
        self._kept: dict[int, Tensor] = {}  # slot -> the codec part [H] of its next input, whose text is missing
        self._refresh: list[int] = []  # slots whose missing text token has arrived

    @property
    def bytes_per_slot(self) -> int:
        per = self.kv.bytes_per_slot() + 2 * self.predictor.nbytes // self.predictor.k.shape[1]
        for name in SLOT_BUFFERS:
            buf = getattr(self, name)
            per += buf.nbytes // buf.shape[0]
        return per

    def prepare(self, plan: StepPlan) -> None:
        """Host-to-device work of a new batch composition (nothing when it did not change)."""
        self._batch_tensors(plan)

    @property
    def in_aside(self) -> bool:
        return self._aside

    @contextmanager
    def aside(self) -> Iterator[None]:
        """A prefill-only step run between the sub-steps of another (`sample_stages`): its own code predictor
        cache, its feedback queued behind the outer step's."""
        outer = self.predictor
        self.predictor, self._aside = self._aside_predictor, True
        try:
            yield
        finally:
            self.predictor, self._aside = outer, False

    # 1. forward
    @torch.inference_mode()
    def forward(self, plan: StepPlan, step: int) -> Tensor:
        """-> hidden [B, H] in batch order (decode rows, then prefill rows)."""
        if not self._aside:
            self._settle()
        bt = self._batch_tensors(plan)
        rows: list[Tensor] = []
        if plan.decode:
            slots = bt.decode_slots
            positions = self.lengths[slots]
            kv_len = plan.kv_offset + step
            x = self.next_embed[slots][:, None]
            kv = self.kv.for_decode(slots, positions, kv_len, bt.decode_span)
            rows.append(self.talker.backbone(x, positions[:, None], kv, kv_len - 1)[:, 0])
        if plan.prefill:
            rows.append(self._prefill(plan.prefill))
        return rows[0] if len(rows) == 1 else torch.cat(rows, dim=0)

    def _settle(self) -> None:
        """What a forward does first: the last steps' feedback, then the inputs whose missing text token came."""
        if self._feedback:
            for feedback in self._feedback:
                self._feed_back(*feedback)
            self._feedback.clear()
        if self._refresh:
            self._refresh_inputs()

    def _prefill(self, seqs: list[Seq]) -> Tensor:
        """All new requests of a step in one forward, right-padded to the longest prompt. -> last hidden [n, H]"""
        x, lengths = prompt_embeds(self.talker, self.cfg, [seq.prompt for seq in seqs], self.device)  # [n, T, H]
        for seq, t in zip(seqs, lengths, strict=True):
            seq.prefill_len = t
        slots = torch.tensor([s.slot for s in seqs], dtype=torch.long, device=self.device)
        self._reset_slots(seqs, slots, lengths)
        positions = torch.arange(x.shape[1], device=self.device).expand(len(seqs), -1)
        hidden = self.talker.backbone(x, positions, self.kv.for_prefill(slots), x.shape[1] - 1)
        last = torch.tensor(lengths, device=self.device) - 1
        return hidden[torch.arange(len(seqs), device=self.device), last]

    def _reset_slots(self, seqs: list[Seq], slots: Tensor, lengths: list[int]) -> None:
        """New requests' slot state in one write per buffer: trailing text, KV length, frame count, seen codes."""
        text = np.full((len(seqs), self.text_width), self.cfg.text.tts_pad, dtype=np.int64)
        for i, seq in enumerate(seqs):
            if seq.feed is not None:
                row = seq.feed.row(self.cfg.text.tts_eos)
                seq.feed.written = len(row)
            else:
                row = trailing_text(self.cfg, seq.prompt)
            row = row[: self.text_width]
            text[i, : len(row)] = row
        self.text_ids[slots] = torch.from_numpy(text).to(self.device)
        self.lengths[slots] = torch.tensor(lengths, device=self.device)
        self.frames[slots] = 0
        self.seen[slots] = False

    # Text that arrives over time (worker thread, at step boundaries)
    def write_text(self, seq: Seq) -> None:
        """The positions of `seq`'s text row that arrived since the last write."""
        assert seq.feed is not None
        row = seq.feed.row(self.cfg.text.tts_eos)
        start, end = seq.feed.written, min(len(row), self.text_width)
        if end > start:
            self.text_ids[seq.slot, start:end] = torch.tensor(row[start:end], dtype=torch.long, device=self.device)
        seq.feed.written = len(row)

    def keep(self, slots: list[int]) -> None:
        """These slots made their last frame the text allows in the step just run, whose feedback is pending:
        keep the codec part of their next input."""
        for slot in slots:
            for bt, _, emb_sum, _ in reversed(self._feedback):
                if (row := bt.rows.get(slot)) is not None:
                    self._kept[slot] = emb_sum[row].clone()  # [H]; not the whole batch's tensor
                    break
            else:  # a bug, not a reason to stop every request: this one would hear tts_pad where a token belongs
                log.error("no pending frame for slot %d: its next input keeps tts_pad for its missing token", slot)

    def refresh(self, slot: int) -> None:
        """The text token `slot`'s next input was missing has been written: the next forward sums it in."""
        self._refresh.append(slot)

    def _refresh_inputs(self) -> None:
        """After the feedback: kept codec part + the text token at the frame's position, as `_feed_back` sums."""
        slots = [s for s in dict.fromkeys(self._refresh) if s in self._kept]
        self._refresh.clear()
        if not slots:
            return
        index = torch.tensor(slots, dtype=torch.long, device=self.device)
        text = self.text_ids[index, (self.frames[index] - 1).clamp(max=self.text_width - 1)]
        self.next_embed[index] = torch.stack([self._kept.pop(s) for s in slots]) + self._embed_text(text)

    @torch.inference_mode()
    def park(self, slot: int, length: int) -> ParkedSlot:
        """A copy of what `slot` holds for its request (held, its text run out; `length`: its KV positions), so
        that the slot can serve another. At a step boundary, after the feedback that the next forward would apply."""
        self._settle()
        k, v = self.kv.slot_rows(slot, length)
        rows = {name: to_host(getattr(self, name)[slot]) for name in SLOT_BUFFERS}
        return ParkedSlot(to_host(k), to_host(v), rows, self._kept.pop(slot, None))

    @torch.inference_mode()
    def unpark(self, slot: int, parked: ParkedSlot) -> None:
        """`park`'s copy back, into `slot` (any free one). Then `write_text` and `refresh` as for a held request."""
        self._settle()  # the slot's last occupant's feedback first, as a prefill's reset follows it
        self.kv.load_slot(slot, parked.k, parked.v)
        for name, row in parked.rows.items():
            getattr(self, name)[slot].copy_(row, non_blocking=True)
        if parked.kept is not None:
            self._kept[slot] = parked.kept

    # 2. sample codebook 0, then the residual codebooks
    def sample(self, plan: StepPlan, hidden: Tensor) -> Tensor:
        """hidden: [B, H] -> codes [B, G] (int32). The frame is fed back as the next step's input."""
        return drive(self.sample_stages(plan, hidden))

    @torch.inference_mode()
    def sample_stages(self, plan: StepPlan, hidden: Tensor) -> Generator[None, None, Tensor]:
        """`sample`, pausing between the code predictor's sub-steps: its driver (the worker) may run a prefill
        there (`aside`). The runner never calls back into its driver."""
        bt = self._batch_tensors(plan)
        frames = self.frames[bt.slots]
        logits = self.talker.codec_head(hidden).float() + self.suppress
        logits[:, self.cfg.codec.eos] = logits[:, self.cfg.codec.eos].masked_fill(
            frames < MIN_FRAMES_BEFORE_EOS, float("-inf")
        )
        u = step_uniforms(bt.talker.seeds, frames, self.groups)  # [B, G]
        seen = self.seen[bt.slots] if bt.use_penalty else None
        code0 = self._draw(logits, bt.talker, u[:, 0], seen, bt.penalty)
        codes, emb_sum = yield from self._predict(hidden, code0, bt, u)
        self._feedback.append((bt, code0, emb_sum, frames))  # applied on the device by the next forward
        return codes

    def _predict(self, hidden: Tensor, code0: Tensor, bt: BatchTensors, u: Tensor
                 ) -> Generator[None, None, tuple[Tensor, Tensor]]:
        fused = self.predictor  # kept: an aside step in a pause swaps the runner's for its own
        emb = self.talker.embed_codec(code0)  # [B, H]
        emb_sum = emb.clone()
        codes = [code0]
        h = fused.step(torch.stack((hidden, emb), dim=1), 0)
        for g in range(1, self.groups):
            yield  # a pause between sub-steps
            code = self._draw(fused.heads[g - 1](h).float(), bt.predictor, u[:, g])
            codes.append(code)
            emb = F.embedding(code, fused.embeddings[g - 1])
            emb_sum += emb
            if g < self.groups - 1:
                h = fused.step(emb[:, None], g + 1)
        return torch.stack(codes, dim=1).to(torch.int32), emb_sum  # a new tensor each step

    def _draw(self, logits: Tensor, p: RowParams, u: Tensor, seen: Tensor | None = None,
              penalty: Tensor | None = None) -> Tensor:
        """logits: [B, V] float32, u: [B]; seen: [B, V] bool to apply penalty [B, 1] -> tokens: [B] int64"""
        if self.kernel is not None and self.kernel.accepts(logits):
            return self.kernel.sample(logits, p, u, seen, penalty if seen is not None else None)
        if seen is not None and penalty is not None:
            logits = apply_repetition_penalty(logits, seen, penalty)
        return sample(logits, p, u)

    def _feed_back(self, bt: BatchTensors, code0: Tensor, emb_sum: Tensor, frames: Tensor) -> None:
        text = self.text_ids[bt.slots, frames.clamp(max=self.text_width - 1)]
        self.next_embed[bt.slots] = emb_sum + self._embed_text(text)
        self.seen[bt.slots, code0] = True
        self.frames[bt.slots] = frames + 1
        if bt.decode_slots.numel():
            self.lengths[bt.decode_slots] += 1

    def _embed_text(self, ids: Tensor) -> Tensor:
        return self.talker.embed_text(ids)

    def _batch_tensors(self, plan: StepPlan) -> BatchTensors:
        bt = self._batch
        if bt is not None and bt.version == plan.version:
            return bt
        batch = plan.batch
        dev = self.device
        vocab_t, vocab_p = self.cfg.talker.vocab_size, self.cfg.predictor.vocab_size
        ps = [s.params for s in batch]
        seeds = [s.seed for s in batch]
        sub_t = [0.0 if p.greedy else p.subtalker_temperature for p in ps]
        self._batch = bt = BatchTensors(
            version=plan.version,
            rows={s.slot: i for i, s in enumerate(batch)},
            slots=torch.tensor([s.slot for s in batch], dtype=torch.long, device=dev),
            decode_slots=torch.tensor([s.slot for s in plan.decode], dtype=torch.long, device=dev),
            decode_span=consecutive([s.slot for s in plan.decode]),
            talker=RowParams.stack(
                [p.temperature for p in ps], [p.top_k for p in ps], [p.top_p for p in ps], seeds, vocab_t, dev
            ),
            predictor=RowParams.stack(
                sub_t, [p.subtalker_top_k for p in ps], [p.subtalker_top_p for p in ps],
                seeds, vocab_p, dev,
            ),
            penalty=torch.tensor([p.repetition_penalty for p in ps], device=dev)[:, None],
            use_penalty=any(p.repetition_penalty != 1.0 for p in ps),
        )
        return bt


def consecutive(slots: list[int]) -> tuple[int, int] | None:
    """(first, count) when `slots` are first, first + 1, ...: the rows' KV is then a view of the cache."""
    if slots and slots == list(range(slots[0], slots[0] + len(slots))):
        return slots[0], len(slots)
    return None


def drive(stages: Generator[None, None, T], pause: Callable[[], None] | None = None) -> T:
    """Runs `sample_stages` to its codes, calling `pause` (if any) at each of its pauses."""
    while True:
        try:
            next(stages)
        except StopIteration as done:
            result: T = done.value
            return result
        if pause is not None:
            pause()
