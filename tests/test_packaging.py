"""The wheel carries the native kernels, compiled when it is built (setup.py), and they load from a fresh install:
they need no compiler at run time (the image's g++ is torch.compile's, for --compile). It also carries the web
page's files (server/web/, package data), found where the installed server looks for them."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECK = """
import sys, torch
from output_builder.codecs.native import load_native
from talker.sampler_native import load_sampling_kernel
codec, sampler = load_native(), load_sampling_kernel()
assert codec is not None and sampler is not None, "a kernel did not load"
for lib in (codec.path, sampler.path):
    assert str(lib).startswith(sys.argv[1]), f"{lib} is not the installed one"
x, w = torch.randn(1, 2, 40), torch.randn(3, 2, 3)
assert torch.allclose(codec.conv(x, w, None, 1, None), torch.nn.functional.conv1d(x, w), atol=1e-5)
from server.web_page import PAGE_DIR
assert str(PAGE_DIR).startswith(sys.argv[1]), f"{PAGE_DIR} is not the installed one"
for name in sys.argv[2:]:
    assert (PAGE_DIR / name).is_file(), f"the installed page has no {name}"
import benchmarks.serve, engine, server.app, server.cli  # every layer imports from the install
assert engine.__file__.startswith(sys.argv[1]), engine.__file__
print("ok", codec.path.name, sampler.path.name)
"""
PAGE_FILES = sorted(p.name for p in (ROOT / "server" / "web").iterdir())


def docker_copies() -> list[str]:
    """The folders the Dockerfile's build stage copies (`COPY name ./name`)."""
    return re.findall(r"^COPY (\w+) \./\1$", (ROOT / "Dockerfile").read_text(), flags=re.M)


def test_the_image_builds_every_package_the_project_declares() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert sorted(docker_copies()) == sorted(p.rstrip("*") for p in declared["include"])


def source_tree(to: Path) -> Path:
    """What the Dockerfile copies into its build stage (no build/ left over from an earlier build here)."""
    to.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, to / name)
    for package in docker_copies():
        shutil.copytree(ROOT / package, to / package, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return to


def test_the_wheel_installs_with_every_kernel_built(tmp_path: Path) -> None:
    wheels, src = tmp_path / "wheels", source_tree(tmp_path / "src")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(wheels), str(src)], check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("talkstream-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("output_builder/codecs/_kernels") and n.endswith(".so") for n in names), names
    assert any(n.startswith("talker/_sampler_kernel") and n.endswith(".so") for n in names), names
    assert {"index.html", "app.js", "style.css"} <= set(PAGE_FILES)
    assert {f"server/web/{name}" for name in PAGE_FILES} <= set(names), names
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True, timeout=300)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # the package from the fresh install; its dependencies (torch, ...) from this environment's site-packages
    env = {"PYTHONPATH": f"{site}:{sysconfig.get_paths()['purelib']}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([str(python), "-c", CHECK, site, *PAGE_FILES], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("ok")
