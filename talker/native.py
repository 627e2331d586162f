"""Native CPU kernels from C sources in this repository, compiled with the system compiler on first use and cached.

Optional by design: callers fall back to torch when there is no C compiler or the build fails. A library is cached
under ``<cache_dir>/kernels``, named by a digest of its source, the flags and the compiler, so an edit or a new
compiler rebuilds it; concurrent builders agree on one file (atomic rename).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

# -ffast-math at compile time only: linked with it, gcc adds crtfastmath.o, whose constructor turns on flush-to-zero
# for the whole process that loads the library (a global change to everyone's floating point)
COMPILE = ("-O3", "-ffast-math", "-fopenmp-simd", "-fPIC", "-c")
LINK = ("-shared", "-lmvec", "-lm")  # libmvec: glibc's vector sinf, which the vectoriser calls
COMPILE_TIMEOUT_S = 120.0


def find_compiler() -> Path | None:
    """The system C compiler, or None where native kernels are not supported (not Linux, no compiler)."""
    found = shutil.which("cc") or shutil.which("gcc")
    return Path(found) if found is not None and platform.system() == "Linux" else None


def build_library(
    compiler: Path, source: Path, directory: Path, name: str,
    compile_flags: tuple[str, ...] = COMPILE, link_flags: tuple[str, ...] = LINK,
) -> Path:
    """The cached library for `source`, compiled now if needed. Raises OSError or SubprocessError on failure."""
    version = subprocess.run([str(compiler), "--version"], capture_output=True, text=True, check=True).stdout
    digest = hashlib.sha256("\0".join((source.read_text(), *compile_flags, *link_flags, version)).encode())
    library = directory / f"{name}-{digest.hexdigest()[:16]}.so"
    if library.is_file():
        return library
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=directory)
    os.close(fd)
    obj = tmp + ".o"
    try:
        for cmd in ([str(compiler), *compile_flags, str(source), "-o", obj], [str(compiler), obj, "-o", tmp,
                                                                              *link_flags]):
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
            if done.returncode != 0:
                raise OSError(f"{compiler.name} failed: {done.stderr.strip()[-400:]}")
        os.replace(tmp, library)
    finally:
        Path(tmp).unlink(missing_ok=True)
        Path(obj).unlink(missing_ok=True)
    return library
