"""The decode step with static shapes (`compile` on): the Runner's state and boundary work, its forward and sampling
as the programs of talker/compiled.py.

A step runs over slots [0, B) for the smallest bucket B that holds its rows (the scheduler hands out the lowest
free slot, so a batch stays packed at the bottom). What it reads per slot lives in the Runner's persistent buffers;
what changes only with the batch (which slots step, their sampling parameters) is uploaded once per composition.
`forward` returns hidden states in slot order over the bucket; `sample_stages` pauses twice between the code
predictor's sub-steps and returns the codes in batch order, as the eager Runner does.
"""

from __future__ import annotations

import gc
import logging
import time
import warnings
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from talker.compiled import Programs, bucket_for, buckets_for
from talker.models.qwen3_tts.prompt import prompt_embeds
from talker.models.qwen3_tts.static import CANDIDATES, Draw, StaticTalker, prefill
from talker.runner import Runner, drive
from talker.scheduler import Seq, StepPlan

log = logging.getLogger("talkstream.compile")


def build_runner(args: tuple[Any, ...], compiled: bool, threads: int) -> Runner:
    """The eager Runner(*args), or (`compiled`) a StaticRunner whose programs are compiled now for every bucket, on
    this thread with the Talker's `threads`. A compile that fails leaves the eager Runner, with one warning."""
    if not compiled:
        return Runner(*args)
    torch.set_num_threads(threads)
    talker, cfg, max_batch, max_len = args[:4]
    started = time.perf_counter()
    try:
        programs = Programs(StaticTalker(talker, cfg, max_len), buckets_for(max_batch), compiled=True)
        runner = StaticRunner(args, programs)
        log.info("compiling the decode step for batch buckets %s (the first start takes minutes; the generated "
                 "code is cached)", ", ".join(map(str, programs.buckets)))
        with warnings.catch_warnings():  # what torch's compiler says of torch's own deprecated parts
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch(\.|$)")
            runner.warm_up()
    except Exception as exc:  # e.g. no C compiler: the eager step serves the same requests
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
        log.warning("compiling the decode step failed, so it runs eagerly (as --compile off): %s",
                    " ".join(lines[:2])[:400])
        log.debug("the compile's failure", exc_info=exc)
        gc.collect()
        return Runner(*args)
    log.info("decode step compiled in %.1f s", time.perf_counter() - started)
    return runner


@dataclass(slots=True)
class StaticBatch:
    """What one batch composition uploads, per slot of its bucket (idle slots: neutral values)."""

    version: int
    bucket: int
    decode: Tensor  # [B] bool: the slots this step decodes
    seeds: Tensor  # [B] int64
    penalty: Tensor  # [B] float32
    talker: Draw
    predictor: Draw
    candidates: tuple[int, int]  # per draw of the Talker and of the code predictor: CANDIDATES, or the vocabulary


class StaticRunner(Runner):
    """A Runner whose forward and sampling are the static programs (compiled or not: `programs`)."""

    def __init__(self, runner_args: tuple[Any, ...], programs: Programs) -> None:
        super().__init__(*runner_args)
        self.programs = programs
        self._static: StaticBatch | None = None
        self._positions = [torch.tensor(g, device=self.device) for g in range(self.groups)]  # the sub-steps'
        self._pauses = {2, 2 + (self.groups - 2) // 2}  # before sub-steps 2 and 9 (of 16)

    def warm_up(self, buckets: tuple[int, ...] | None = None) -> None:
        """Runs every bucket's programs (or `buckets`') once, compiling them, on idle rows: nothing a request holds
        changes."""
        with torch.inference_mode():
            for bucket in buckets or self.programs.buckets:
                sb = self._neutral(bucket)
                hidden = self.programs.decode(bucket, self.next_embed, self.lengths, sb.decode, self.kv.k, self.kv.v)
                drive(self._sample(sb, hidden))
                self.programs.done(bucket)

    # 1. forward
    @torch.inference_mode()
    def forward(self, plan: StepPlan, step: int) -> Tensor:
        """-> hidden [B, H] for slots 0..B-1 of the plan's bucket (rows not in the plan: meaningless)."""
        if not self._aside:
            self._settle()
        self._batch_tensors(plan)
        sb = self._static_batch(plan)
        b = sb.bucket
        if plan.decode:
            hidden = self.programs.decode(b, self.next_embed, self.lengths, sb.decode, self.kv.k, self.kv.v)
        else:
            hidden = self.next_embed.new_zeros(b, self.next_embed.shape[1])
        if plan.prefill:
            slots = torch.tensor([s.slot for s in plan.prefill], dtype=torch.long, device=self.device)
            hidden = hidden.index_copy(0, slots, self._prefill(plan.prefill))
        return hidden

    def _embed_text(self, ids: Tensor) -> Tensor:
        return self.programs.static.embed_text(ids)

    def _prefill(self, seqs: list[Seq]) -> Tensor:
        # each prompt embedded alone: a library GEMM's rows would round with the other prompts' rows
        alone = [prompt_embeds(self.talker, self.cfg, [seq.prompt], self.device) for seq in seqs]
        lengths = [n for _, (n,) in alone]
        x = torch.nn.utils.rnn.pad_sequence([e[0, :n] for e, (n,) in alone], batch_first=True)  # [n, T, H]
        for seq, t in zip(seqs, lengths, strict=True):
            seq.prefill_len = t
        slots = torch.tensor([s.slot for s in seqs], dtype=torch.long, device=self.device)
        self._reset_slots(seqs, slots, lengths)
        return prefill(self.programs.static, x, lengths, slots, self.kv.k, self.kv.v)

    # 2. sample codebook 0, then the residual codebooks
    @torch.inference_mode()
    def sample_stages(self, plan: StepPlan, hidden: Tensor) -> Generator[None, None, Tensor]:
        bt = self._batch_tensors(plan)
        sb = self._static_batch(plan)
        codes, emb_sum = yield from self._sample(sb, hidden)
        codes, emb_sum = codes[bt.slots], emb_sum[bt.slots]  # [n, G], [n, H] in batch order
        self._feedback.append((bt, codes[:, 0].long(), emb_sum, self.frames[bt.slots]))
        return codes

    def _sample(self, sb: StaticBatch, hidden: Tensor) -> Generator[None, None, tuple[Tensor, Tensor]]:
        """-> codes [B, G] int32, summed embeddings [B, H] in slot order; pauses between the sub-steps."""
        fused = self.predictor  # kept: an aside step in a pause swaps the runner's for its own
        p = self.programs
        first, u, emb, emb_sum = p.first(sb.bucket, sb.candidates, hidden, self.frames, self.seen, sb.penalty,
                                         sb.seeds, sb.talker, sb.predictor, fused.k, fused.v)
        codes = [first]
        for g in range(2, self.groups):
            if g in self._pauses:
                yield  # a mid-step prefill may run here
            code, emb, emb_sum = p.next(self._positions[g], emb, emb_sum, u, sb.predictor, fused.k, fused.v,
                                        sb.candidates[1])
            codes.append(code[:, None])
        return torch.cat(codes, dim=1).to(torch.int32), emb_sum

    def _static_batch(self, plan: StepPlan) -> StaticBatch:
        sb = self._static
        if sb is not None and sb.version == plan.version:
            return sb
        bucket = bucket_for(max(s.slot for s in plan.batch) + 1, self.programs.buckets)
        self._static = sb = self._neutral(bucket, plan)
        return sb

    def _neutral(self, bucket: int, plan: StepPlan | None = None) -> StaticBatch:
        """The bucket's per-slot uploads: the plan's rows' parameters at their slots, neutral values elsewhere."""
        vocab_t, vocab_p = self.cfg.talker.vocab_size, self.cfg.predictor.vocab_size
        cols = {name: [default] * bucket for name, default in (
            ("decode", False), ("seed", 0), ("penalty", 1.0), ("t", 1.0), ("k", vocab_t), ("p", 1.0), ("g", True),
            ("pt", 1.0), ("pk", vocab_p), ("pp", 1.0), ("pg", True))}
        batch = () if plan is None else plan.batch
        decode = set() if plan is None else {s.slot for s in plan.decode}
        for seq in batch:
            p, i = seq.params, seq.slot
            sub_t = 0.0 if p.greedy else p.subtalker_temperature
            row = {"decode": i in decode, "seed": seq.seed, "penalty": p.repetition_penalty,
                   "t": max(p.temperature, 1e-5), "k": _top_k(p.top_k, vocab_t), "p": p.top_p,
                   "g": p.temperature == 0.0, "pt": max(sub_t, 1e-5), "pk": _top_k(p.subtalker_top_k, vocab_p),
                   "pp": p.subtalker_top_p, "pg": sub_t == 0.0}
            for name, value in row.items():
                cols[name][i] = value
        dev = self.device

        def floats(name: str) -> Tensor:
            return torch.tensor(cols[name], dtype=torch.float32, device=dev)

        def longs(name: str) -> Tensor:
            return torch.tensor(cols[name], dtype=torch.long, device=dev)

        def bools(name: str) -> Tensor:
            return torch.tensor(cols[name], dtype=torch.bool, device=dev)

        def candidates(top_k: str, greedy: str, vocab: int) -> int:
            fits = all(cols[greedy][s.slot] or cols[top_k][s.slot] <= CANDIDATES for s in batch)
            return min(CANDIDATES, vocab) if fits else vocab

        return StaticBatch(
            version=-1 if plan is None else plan.version, bucket=bucket, decode=bools("decode"), seeds=longs("seed"),
            penalty=floats("penalty"),
            talker=Draw(floats("t"), longs("k"), floats("p"), bools("g")),
            predictor=Draw(floats("pt"), longs("pk"), floats("pp"), bools("pg")),
            candidates=(candidates("k", "g", vocab_t), candidates("pk", "pg", vocab_p)),
        )


def _top_k(k: int, vocab: int) -> int:
    return k if 0 < k < vocab else vocab
