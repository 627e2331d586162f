"""Where the compiled step's code is kept (talker/compiled.py): apart per CPU instruction set, since torch's cache
gives code made for one to another (garbage, or a crash)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from talker.compiled import inductor_dir


def test_each_cpu_capability_keeps_its_code_apart(tmp_path: Path) -> None:
    here = inductor_dir(tmp_path)
    assert here.parent == tmp_path / "inductor" and here.name == torch.backends.cpu.get_cpu_capability().lower()
    code = ("import sys; from pathlib import Path; from talker.compiled import inductor_dir; "
            "print(inductor_dir(Path(sys.argv[1])))")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    other = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True,
                           check=True).stdout.strip()
    assert Path(other) == tmp_path / "inductor" / "default"
