"""What every part of the lab stands on: its error, where it keeps its cache and its state, the lock that
serialises up/down/image across processes, bounded commands and waits, and unmounting what it left.

Stdlib only (the lab runs before any venv exists)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


class LabError(RuntimeError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("OCRFLEET_LAB_CACHE", "/var/cache/ocrfleet-lab"))


def state_dir() -> Path:
    return Path(os.environ.get("OCRFLEET_LAB_STATE", "/run/ocrfleet-lab"))


def say(msg: str) -> None:
    print(f"lab: {msg}", file=sys.stderr, flush=True)


def run(argv, *, check=True, capture=True, timeout=60, input=None, env=None):
    try:
        cp = subprocess.run(
            argv,
            check=False,
            text=True,
            input=input,
            timeout=timeout,
            env=env,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.PIPE if capture else None,
        )
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"timed out after {timeout}s: {' '.join(map(str, argv))}") from exc
    if check and cp.returncode != 0:
        raise LabError(
            f"command failed (rc={cp.returncode}): {' '.join(map(str, argv))}\n{(cp.stderr or '').strip()}"
        )
    return cp


def wait_until(pred, timeout: float, what: str, interval: float = 0.1):
    """Poll pred() until truthy; bounded. Returns pred's value."""
    deadline = time.monotonic() + timeout
    while True:
        val = pred()
        if val:
            return val
        if time.monotonic() >= deadline:
            raise LabError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@contextlib.contextmanager
def locked():
    """Serialise up/down/image across processes (addresses, bridges, the proxy)."""
    state_dir().mkdir(parents=True, exist_ok=True)
    with open(state_dir() / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (nspawn, bridges, cgroups)")
    for tool in ("systemd-nspawn", "debootstrap", "apt-cacher-ng", "ip", "nsenter", "ssh-keygen"):
        if not shutil.which(tool):
            raise LabError(f"{tool} not found: run lab/install-deps.sh")


def tail(path: Path, lines: int = 40) -> str:
    try:
        data = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(data[-lines:])


def umount_under(path: Path) -> None:
    """Unmount everything mounted below path (deepest first), e.g. debootstrap's /proc after a crash."""
    prefix = str(path.resolve()).rstrip("/") + "/"
    for _ in range(3):
        mounts = [
            line.split()[1].replace("\\040", " ") for line in Path("/proc/mounts").read_text().splitlines()
        ]
        mine = sorted({m for m in mounts if (m + "/").startswith(prefix)}, key=len, reverse=True)
        if not mine:
            return
        for m in mine:
            run(["umount", "-l", m], check=False)
