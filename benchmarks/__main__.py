"""`python -m benchmarks NAME [ARGS]`: the benchmarks that print figures, one module each (`talkstream bench NAME`
hands over to this command, so the server never loads them)."""

from __future__ import annotations

import argparse
import importlib
import sys

NAMES = ("serve", "step-gap", "text-stream", "codec", "models", "engine-ttfa", "int8-agreement", "profile-step",
         "voice-creation", "slow-writers", "compiled-step", "text-front", "aligner")
MODULES = {name: "benchmarks." + name.replace("-", "_") for name in NAMES} | {"step_gap": "benchmarks.step_gap"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="talkstream bench", description="Benchmarks that print figures "
                                "(docs/benchmarks.md); `talkstream bench NAME --help` lists a benchmark's options.")
    p.add_argument("name", choices=sorted(MODULES))
    p.add_argument("args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    code: int = importlib.import_module(MODULES[args.name]).main(args.args)
    return code


if __name__ == "__main__":
    sys.exit(main())
