"""Native CPU kernels: C libraries compiled when the package is installed (setup.py), loaded here with ctypes.

Optional by design: where the install could not build them (not Linux, no compiler) callers run their torch path,
which computes the same function. Nothing is compiled at run time.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def installed_library(module: str) -> Path | None:
    """The file of an installed kernel library (`talker._sampler_kernel`), or None when the install has none."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = spec.origin if spec is not None else None
    return Path(origin) if origin and Path(origin).is_file() else None
