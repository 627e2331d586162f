"""How many torch calls a decode step makes, and how many of them would make the host wait for the device.

On a GPU a step is launch-bound when it makes thousands of small calls, and it cannot be captured in a CUDA graph
while it reads device values on the host. Both are counted with a dispatch mode, so they are measured on any
device, the CPU included: every aten call counts once; a *host sync* is a call that returns a device value to the
host (`.item()`, `bool(t)`, `.tolist()`, `.cpu()`) or whose output shape depends on device data (`nonzero`,
`masked_select`, ...), and a *host upload* is a tensor made from Python data (`torch.tensor([...])`), which on CUDA
is a blocking copy from pageable memory.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from common.request import SpeechRequest
from frontend.frontend import Frontend
from talker.models.loader import LoadedTalker
from talker.runner import Runner
from talker.scheduler import Scheduler, Seq

aten = torch.ops.aten
DATA_DEPENDENT = {aten.nonzero, aten.masked_select, aten.unique_consecutive, aten._unique2, aten.unique_dim,
                  aten.repeat_interleave, aten.bincount}
TO_HOST = {aten._local_scalar_dense, aten.equal, aten.is_nonzero}
UPLOAD = {aten.lift_fresh, aten.lift_fresh_copy}


class OpCount(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.syncs: Counter[str] = Counter()
        self.uploads = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops += 1
        packet = func.overloadpacket
        if packet in TO_HOST or packet in DATA_DEPENDENT or _copies_to_host(func, args, kwargs or {}):
            self.syncs[packet.__name__] += 1
        elif packet in UPLOAD and args[0].dim() > 0:  # a Python scalar goes to a kernel by value
            self.uploads += 1
        return func(*args, **(kwargs or {}))


def _copies_to_host(func: Any, args: Any, kwargs: dict[str, Any]) -> bool:
    """A device tensor copied into host memory (`.cpu()`, `.to("cpu")`, `cpu_tensor.copy_(device_tensor)`)."""
    if func.overloadpacket is aten._to_copy:
        device = kwargs.get("device")
        return device is not None and torch.device(device).type == "cpu" and args[0].device.type != "cpu"
    if func.overloadpacket is aten.copy_:
        return bool(args[0].device.type == "cpu" and args[1].device.type != "cpu")
    return False


def step_ops(loaded: LoadedTalker, frontend: Frontend, device: torch.device, batch: int, warm: int = 8,
             steps: int = 8, max_len: int = 1024) -> dict[str, Any]:
    """Per steady step of `batch` requests (schedule, forward, sample, commit), after `warm` steps: torch calls,
    host syncs (by op) and host uploads. A runner of its own, on this thread."""
    dtype = next(loaded.model.parameters()).dtype
    runner = Runner(loaded.model.talker, loaded.cfg, batch, max_len, frontend.text_width, device, dtype)
    sched = Scheduler(batch, batch, max_len)
    text = "hello world this is the talkstream op count " * 8
    for i in range(batch):
        p = frontend.prepare(SpeechRequest(text=text, seed=i, request_id=f"ops-{i}"))
        sched.add(Seq(f"ops-{i}", p.prompt, dataclasses.replace(p.params), p.seed, warm + steps + 1, []))
    count = OpCount()
    for step in range(warm + steps):
        if step == warm:
            count.__enter__()
        plan = sched.schedule()
        codes = runner.sample(plan, runner.forward(plan, step))
        sched.commit(plan, step)
        sched.expire(step)
        del codes
    count.__exit__(None, None, None)
    return {"ops_per_step": round(count.ops / steps, 1),
            "host_syncs_per_step": round(sum(count.syncs.values()) / steps, 2),
            "host_syncs_by_op": {k: round(v / steps, 2) for k, v in count.syncs.most_common()},
            "host_uploads_per_step": round(count.uploads / steps, 2), "batch": batch}

