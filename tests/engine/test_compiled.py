"""`compile=on` end to end on the tiny model (tests/engine/compiled_child.py, in a process of its own): the step
compiles at start (buckets 1, 2 and 4), then serves batches of 1 and 3 with no new graph and no graph break
(torch._dynamo's counters); a request's codes are the same alone and in those batches; sync and async give the same
codes and audio. (The audio of a request alone and in a batch can differ by a rounding: the codec decodes several
requests' chunks in one call.)

Inductor's generated code is cached across runs of the suite (the engine's cache would be a fresh temporary
directory each session): the first run on a machine compiles for minutes, later ones reuse it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.config import default_cache_dir

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(1500)  # a cold cache compiles for minutes
def test_the_compiled_step_serves_any_batch_without_new_graphs(tiny_cache: Path) -> None:
    inductor = os.environ.get("TALKSTREAM_TEST_INDUCTOR_CACHE", str(default_cache_dir() / "tests-inductor"))
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": inductor}
    done = subprocess.run([sys.executable, "-m", "tests.engine.compiled_child", str(tiny_cache)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1400, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for mode in ("async", "sync"):
        run = result[mode]
        assert run["runner"] == "StaticRunner", f"{mode}: the step was not compiled"
        assert run["after"] == run["before"], f"{mode}: a batch made a new graph or a graph break after the warm-up"
    codes, audio = result["async"]["codes"], result["async"]["audio"]
    assert len(codes["1-0"]) > 2 and codes["1-0"] == codes["3-0"]  # alone, and in 3 rows padded to 4
    assert codes == result["sync"]["codes"] and audio == result["sync"]["audio"]
    assert len({audio[f"3-{i}"] for i in range(3)}) == 3  # the requests did not all say the same thing
