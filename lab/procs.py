"""Processes and cgroups: what the lab starts (hosts, the apt proxy) runs detached in a cgroup of its own
under ocrlab/<lab>/<host>, so that whatever it leaves behind is found and killed; commands enter a host
through nsenter, into its namespaces and its cgroup."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shlex
import signal
import subprocess
from pathlib import Path

from .base import LabError, tail, wait_until

CGROUP_ROOT = Path("/sys/fs/cgroup")
KILL_TIMEOUT = 10.0
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def is_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def hierarchies() -> list[Path]:
    """cgroup hierarchies nspawn needs the caller placed in (--keep-unit uses the caller's cgroup)."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():  # pure cgroup v2
        return [CGROUP_ROOT]
    return [p for p in (CGROUP_ROOT / "systemd", CGROUP_ROOT / "unified") if p.is_dir()]


def cgroup_dirs(*parts: str) -> list[Path]:
    return [h.joinpath("ocrlab", *parts) for h in hierarchies()]


def cgroup_pids(*parts: str) -> set[int]:
    pids: set[int] = set()
    for top in cgroup_dirs(*parts):
        if not top.is_dir():
            continue
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(x) for x in procs.read_text().split())
    return {p for p in pids if is_alive(p)}


def kill_cgroup(*parts: str, timeout: float = KILL_TIMEOUT) -> None:
    def gone():
        pids = cgroup_pids(*parts)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return not pids

    wait_until(gone, timeout, f"processes in cgroup ocrlab/{'/'.join(parts)} to die")


def remove_cgroup(*parts: str) -> None:
    """rmdir a cgroup subtree depth-first (the container's systemd creates its own children)."""
    for top in cgroup_dirs(*parts):
        if not top.is_dir():
            continue
        dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        for d in [*dirs, top]:
            # A killed process stays in its cgroup (EBUSY) until its parent reaps it, and
            # PID 1 here reaps orphans in its own time: retry, bounded.
            def removed(d=d):
                try:
                    d.rmdir()
                except FileNotFoundError:
                    return True
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        raise LabError(f"cannot remove cgroup {d}: {exc}") from None
                    return False
                return True

            wait_until(removed, KILL_TIMEOUT, f"cgroup {d} to empty")
        parent = top.parent
        while parent.name != "ocrlab" and parent != parent.parent:
            parent = parent.parent
        for p in (top.parent, parent):
            with contextlib.suppress(OSError):
                p.rmdir()  # only succeeds when empty: other labs keep theirs


def spawn_detached(
    argv: list[str], *, log: Path, pidfile: Path, cgroup: tuple[str, str], env: dict | None = None
) -> int:
    """Start argv in its own session and cgroups, not as our child; return its pid.

    The shell moves itself into the cgroups and writes its pid before exec, so the
    pid and the cgroup membership are right from the first instruction of argv.
    """
    dirs = cgroup_dirs(*cgroup)
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    pidfile.unlink(missing_ok=True)
    script = (
        'for d in $OCRLAB_CGROUPS; do echo $$ > "$d/cgroup.procs" || exit 97; done; '
        'echo $$ > "$OCRLAB_PIDFILE"; exec "$@"'
    )
    e = {**(env or os.environ), "OCRLAB_CGROUPS": " ".join(map(str, dirs)), "OCRLAB_PIDFILE": str(pidfile)}
    with open(log, "ab") as fh:
        subprocess.run(
            ["setsid", "-f", "sh", "-c", script, "sh", *argv],
            env=e,
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            timeout=10,
        )

    def pid():
        with contextlib.suppress(OSError, ValueError):
            return int(pidfile.read_text())

    try:
        return wait_until(pid, 10, f"{argv[0]} to start")
    except LabError as exc:
        raise LabError(f"{exc}\n{tail(log)}") from None


def leader_pid(nspawn_pid: int) -> int | None:
    """The container's PID 1 (systemd), seen from here: nspawn's child whose NSpid ends in 1."""
    try:
        kids = Path(f"/proc/{nspawn_pid}/task/{nspawn_pid}/children").read_text().split()
    except OSError:
        return None
    for k in kids:
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{k}/status").read_text()
            nspid = re.search(r"^NSpid:\s+(.*)$", status, re.M).group(1).split()
            if len(nspid) >= 2 and nspid[-1] == "1" and comm(int(k)) == "systemd":
                return int(k)
    return None


def nsenter_argv(leader: int, cgroup: tuple[str, str] | None = None) -> list[str]:
    """argv prefix to run a command inside a host. With cgroup=(lab, host) the command
    first joins the host's cgroup, so `down` finds and kills whatever it leaves running."""
    prefix = []
    if cgroup:
        moves = " && ".join(f"echo $$ > {shlex.quote(str(d / 'cgroup.procs'))}" for d in cgroup_dirs(*cgroup))
        prefix = ["sh", "-c", f'{moves} && exec "$@"', "sh"]
    return [
        *prefix,
        "nsenter",
        "-t",
        str(leader),
        "-m",
        "-u",
        "-i",
        "-n",
        "-p",
        "-C",
        "-r",
        "-w",
        "env",
        "-i",
        f"PATH={CONTAINER_PATH}",
        "LANG=C.UTF-8",
        "TERM=dumb",
    ]
