"""apt for the lab: the controller's own apt sources (the image's, and the proxy's upstreams) and the one
apt-cacher-ng proxy all labs share, on its own address (ocrlab-svc), started by the first `up` and stopped by
the last `down`."""

from __future__ import annotations

import contextlib
import os
import re
import signal
from pathlib import Path

from .base import LabError, cache_dir, state_dir, tail, wait_until
from .net import delete_link, ensure_bridge, port_open, svc_address
from .procs import comm, is_alive, kill_cgroup, remove_cgroup, spawn_detached

ACNG_PORT = 3142
SVC_BRIDGE = "ocrlab-svc"


def apt_proxy_url() -> str:
    return f"http://{svc_address()}:{ACNG_PORT}"


def apt_sources() -> list[dict]:
    """Parse the controller's apt sources: [{uris, suites, components}] (deb lines only)."""
    out = []
    d822 = Path("/etc/apt/sources.list.d")
    for f in sorted(d822.glob("*.sources")) if d822.is_dir() else []:
        for stanza in re.split(r"\n\s*\n", f.read_text()):
            fields: dict[str, str] = {}
            key = None
            for line in stanza.splitlines():
                if line.startswith("#") or not line.strip():
                    continue
                if line[0].isspace() and key:
                    fields[key] += " " + line.strip()
                    continue
                key, _, val = line.partition(":")
                key = key.strip().lower()
                fields[key] = val.strip()
            if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes") != "no":
                out.append(
                    {
                        "uris": fields.get("uris", "").split(),
                        "suites": fields.get("suites", "").split(),
                        "components": fields.get("components", "main").split(),
                    }
                )
    lists = (
        [Path("/etc/apt/sources.list"), *sorted(d822.glob("*.list"))]
        if d822.is_dir()
        else [Path("/etc/apt/sources.list")]
    )
    for f in lists:
        if not f.is_file():
            continue
        for line in f.read_text().splitlines():
            line = re.sub(r"\[[^\]]*\]", "", line.split("#", 1)[0]).split()
            if len(line) >= 3 and line[0] == "deb":
                out.append({"uris": [line[1]], "suites": [line[2]], "components": line[3:] or ["main"]})
    return out


def _acng_dir() -> Path:
    return state_dir() / "_acng"


def acng_pid() -> int | None:
    try:
        pid = int((_acng_dir() / "pid").read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if is_alive(pid) and comm(pid) == "apt-cacher-ng" else None


def ensure_acng() -> None:
    """One proxy for all labs, on its own address (ocrlab-svc), never on a public interface.

    A separate address (not each lab's bridge IP) lets labs come and go without
    restarting the proxy, and the image's apt config can name it statically.
    """
    ensure_bridge(SVC_BRIDGE, f"{svc_address()}/32")
    if acng_pid() and port_open(svc_address(), ACNG_PORT):
        return
    stop_acng(keep_bridge=True)
    d = _acng_dir()
    d.mkdir(parents=True, exist_ok=True)
    cache = cache_dir() / "apt-cacher-ng"
    cache.mkdir(parents=True, exist_ok=True)
    user = "apt-cacher-ng"
    try:
        import pwd

        pw = pwd.getpwnam(user)
        for p in (d, cache):
            os.chown(p, pw.pw_uid, pw.pw_gid)
        drop = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups"]
    except KeyError:
        drop = []
    argv = [
        *drop,
        "apt-cacher-ng",
        "-c",
        "/etc/apt-cacher-ng",
        "ForeGround=1",
        f"BindAddress={svc_address()}",
        f"Port={ACNG_PORT}",
        f"CacheDir={cache}",
        f"LogDir={d}",
        f"SocketPath={d}/socket",
        f"PidFile={d}/acng.pid",
        "ExThreshold=4",
        *_acng_backends(),
    ]
    spawn_detached(argv, log=d / "daemon.log", pidfile=d / "pid", cgroup=("_acng", "proxy"))
    try:
        wait_until(lambda: port_open(svc_address(), ACNG_PORT, 0.5), 20, "apt-cacher-ng to listen")
    except LabError as exc:
        raise LabError(f"{exc}\n{tail(d / 'daemon.log')}") from None


def _acng_backends() -> list[str]:
    """Send Debian traffic to the controller's own mirrors: the packaged remap picks
    mirrors from a world list, which a machine with registry-only egress cannot reach."""
    main = sec = None
    for e in apt_sources():
        for uri in e["uris"]:
            if uri.startswith("http://") and uri.rstrip("/").endswith("/debian-security"):
                sec = sec or uri
            elif uri.startswith("http://") and uri.rstrip("/").endswith("/debian"):
                main = main or uri
    out = []
    if main:
        out.append(f"Remap-debrep=file:deb_mirror*.gz /debian ; {main.rstrip('/')}/")
    if sec:
        out.append(
            "Remap-secdeb=security.debian.org security.debian.org/debian-security "
            f"deb.debian.org/debian-security /debian-security ; {sec.rstrip('/')}/"
        )
    return out


def stop_acng(keep_bridge: bool = False) -> None:
    pid = acng_pid()
    if pid:
        os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(LabError):
            wait_until(lambda: not is_alive(pid), 10, "apt-cacher-ng to stop")
    kill_cgroup("_acng", "proxy")
    remove_cgroup("_acng")
    (_acng_dir() / "pid").unlink(missing_ok=True)
    if not keep_bridge:
        delete_link(SVC_BRIDGE)
