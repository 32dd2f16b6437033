"""A lab of real systemd hosts: Debian rootfs booted with systemd-nspawn on a Linux bridge.

Stdlib only (it runs before any venv exists). Root only. Used by the CLI
(`python3 -m lab ...`), pytest fixtures and Molecule create/destroy playbooks.

Layout (see README.md):
  cache  $OCRFLEET_LAB_CACHE (/var/cache/ocrfleet-lab): images/<name>/ + <name>.stamp, apt-cacher-ng/
  state  $OCRFLEET_LAB_STATE (/run/ocrfleet-lab): <lab>/state.json, inventory.ini, id_ed25519, logs
  cgroup /sys/fs/cgroup/{systemd,unified}/ocrlab/<lab>/<host>
  net    bridge ocrlab-<short> with 10.213.<n>.0/24 per lab; apt proxy on ocrlab-svc 10.213.0.1:3142
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE = "bookworm"
# Everything Ansible and the roles' tests need on a bare host; the rest comes
# through the apt proxy at converge time, as on a real server.
INCLUDE = [
    "systemd",
    "systemd-sysv",
    "openssh-server",
    "python3",
    "sudo",
    "dbus",
    "iproute2",
    "python3-apt",
    "ca-certificates",
    "gnupg",
    "procps",
]
# Bump when the post-debootstrap steps change in a way the hash cannot see.
RECIPE_VERSION = 2

ACNG_PORT = 3142
SVC_BRIDGE = "ocrlab-svc"
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Bounded waits (seconds).
BOOT_TIMEOUT = float(os.environ.get("OCRFLEET_LAB_BOOT_TIMEOUT", "90"))
POWEROFF_TIMEOUT = 20.0
KILL_TIMEOUT = 10.0
SSH_OPTS = [
    "-F",
    "none",
    "-o",
    "StrictHostKeyChecking=no",
    "-o",
    "UserKnownHostsFile=/dev/null",
    "-o",
    "IdentitiesOnly=yes",
    "-o",
    "BatchMode=yes",
    "-o",
    "LogLevel=ERROR",
    "-o",
    "ConnectTimeout=5",
]
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class LabError(RuntimeError):
    pass


# ---------------------------------------------------------------- paths & helpers


def cache_dir() -> Path:
    return Path(os.environ.get("OCRFLEET_LAB_CACHE", "/var/cache/ocrfleet-lab"))


def state_dir() -> Path:
    return Path(os.environ.get("OCRFLEET_LAB_STATE", "/run/ocrfleet-lab"))


def lab_net() -> ipaddress.IPv4Network:
    net = ipaddress.ip_network(os.environ.get("OCRFLEET_LAB_NET", "10.213.0.0/16"))
    if net.prefixlen > 16:
        raise LabError(f"OCRFLEET_LAB_NET={net} must be a /16 or larger")
    return net


def svc_address() -> str:
    # First address of the lab range: never inside a lab /24 (those start at index 1).
    return str(lab_net().network_address + 1)


def apt_proxy_url() -> str:
    return f"http://{svc_address()}:{ACNG_PORT}"


def _log(msg: str) -> None:
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


def _short(name: str) -> str:
    # Interface names are limited to 15 chars: "ocrlab-" + 8.
    return name if len(name) <= 8 else hashlib.sha256(name.encode()).hexdigest()[:8]


def bridge_name(lab: str) -> str:
    return f"ocrlab-{_short(lab)}"


def machine_name(lab: str, host: str) -> str:
    # nspawn names the host-side veth "vb-<machine>"; keep it short and unique across labs.
    return "l" + hashlib.sha256(f"{lab}/{host}".encode()).hexdigest()[:10]


def _check_name(kind: str, name: str) -> None:
    if not NAME_RE.match(name) or name.startswith("_"):
        raise LabError(f"invalid {kind} name {name!r}: use [a-z0-9-], max 32 chars")


@contextlib.contextmanager
def _locked():
    """Serialise up/down/image across processes (addresses, bridges, the proxy)."""
    state_dir().mkdir(parents=True, exist_ok=True)
    with open(state_dir() / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (nspawn, bridges, cgroups)")
    for tool in ("systemd-nspawn", "debootstrap", "apt-cacher-ng", "ip", "nsenter", "ssh-keygen"):
        if not shutil.which(tool):
            raise LabError(f"{tool} not found: run lab/install-deps.sh")


def _tail(path: Path, lines: int = 40) -> str:
    try:
        data = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(data[-lines:])


# ---------------------------------------------------------------- image


def _apt_sources() -> list[dict]:
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


def image_sources(suite: str = SUITE) -> tuple[str, str]:
    """(debootstrap mirror, deb822 sources for the image) from the controller's own apt sources."""
    entries = []
    for e in _apt_sources():
        suites = [
            s for s in e["suites"] if s == suite or s.startswith(suite + "-") or s.startswith(suite + "/")
        ]
        if suites and e["uris"]:
            entries.append({**e, "suites": suites})
    mirror = next((e["uris"][0] for e in entries if suite in e["suites"]), None)
    if not mirror:
        raise LabError(f"no apt source for suite {suite!r} in /etc/apt (needed as the debootstrap mirror)")
    # http only: the apt proxy does plain http and hosts have no other way out.
    text = "\n".join(
        f"Types: deb\nURIs: {' '.join(e['uris'])}\nSuites: {' '.join(e['suites'])}\n"
        f"Components: {' '.join(e['components'])}\n"
        f"Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
        for e in entries
    )
    return mirror, text


def _image_files() -> dict[str, str]:
    """Files written into the image after debootstrap (path -> content)."""
    return {
        "/etc/apt/apt.conf.d/01ocrlab-proxy": (
            "// ocrfleet lab: hosts have no route out; all apt traffic goes through the lab proxy.\n"
            f'Acquire::http::Proxy "{apt_proxy_url()}";\n'
            '// Fail in seconds, not minutes, when the proxy is down.\nAcquire::http::Timeout "30";\n'
        ),
        "/etc/ssh/sshd_config.d/ocrlab.conf": (
            "# ocrfleet lab: root by key only (the key is bind-mounted per lab).\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUseDNS no\n"
        ),
        "/etc/hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    }


def recipe(suite: str = SUITE) -> dict:
    mirror, sources = image_sources(suite)
    return {
        "version": RECIPE_VERSION,
        "suite": suite,
        "variant": "minbase",
        "include": INCLUDE,
        "mirror": mirror,
        "sources": sources,
        "files": _image_files(),
    }


def recipe_hash(suite: str = SUITE) -> str:
    return hashlib.sha256(json.dumps(recipe(suite), sort_keys=True).encode()).hexdigest()[:16]


def image_path(suite: str = SUITE) -> Path:
    return cache_dir() / "images" / f"debian-{suite}"


def _stamp_path(suite: str = SUITE) -> Path:
    return cache_dir() / "images" / f"debian-{suite}.stamp"


def image_ready(suite: str = SUITE) -> bool:
    try:
        stamp = json.loads(_stamp_path(suite).read_text())
    except (OSError, ValueError):
        return False
    return (
        stamp.get("recipe_hash") == recipe_hash(suite)
        and (image_path(suite) / "usr/lib/systemd/systemd").exists()
    )


def _umount_under(path: Path) -> None:
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


def _rmtree(path: Path) -> None:
    if path.exists():
        _umount_under(path)
        run(["rm", "-rf", "--one-file-system", str(path)], timeout=300)


def build_image(suite: str = SUITE, force: bool = False) -> Path:
    """Build (or reuse) the cached rootfs. Atomic: a half-built image is never marked good."""
    _require_root()
    with _locked():
        if image_ready(suite) and not force:
            return image_path(suite)
        if _running_labs():
            raise LabError(
                f"labs are running on the image ({', '.join(_running_labs())}); "
                "run `down --all` before rebuilding it"
            )
        rec = recipe(suite)
        h = recipe_hash(suite)
        images = cache_dir() / "images"
        images.mkdir(parents=True, exist_ok=True)
        for stale in images.glob(f".debian-{suite}.*"):  # leftovers of interrupted builds
            _rmtree(stale)
        tmp = Path(tempfile.mkdtemp(prefix=f".debian-{suite}.build-", dir=images))
        root = tmp / "rootfs"
        t0 = time.monotonic()
        try:
            _log(f"debootstrap {suite} from {rec['mirror']} (a few minutes)...")
            cp = run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={','.join(INCLUDE)}",
                    suite,
                    str(root),
                    rec["mirror"],
                ],
                check=False,
                timeout=1800,
            )
            if cp.returncode != 0:
                log = root / "debootstrap/debootstrap.log"
                raise LabError(f"debootstrap failed (rc={cp.returncode}):\n{cp.stderr[-3000:]}\n{_tail(log)}")
            _customise(root, rec)
            elapsed = time.monotonic() - t0
            stamp = tmp / "stamp"
            stamp.write_text(
                json.dumps(
                    {
                        "recipe_hash": h,
                        "suite": suite,
                        "built_at": time.time(),
                        "build_seconds": round(elapsed, 1),
                    },
                    indent=2,
                )
                + "\n"
            )
            # Swap: drop the old stamp first, so a crash mid-swap leaves "not ready", never "ready+half".
            _stamp_path(suite).unlink(missing_ok=True)
            old = images / f".debian-{suite}.old"
            if image_path(suite).exists():
                image_path(suite).rename(old)
            root.rename(image_path(suite))
            stamp.rename(_stamp_path(suite))
            _rmtree(old)
            _log(f"image ready in {elapsed:.0f}s: {image_path(suite)}")
        finally:
            _rmtree(tmp)
        return image_path(suite)


def _customise(root: Path, rec: dict) -> None:
    """Post-debootstrap steps, done in a chroot-free way where possible."""
    (root / "etc/apt/sources.list").unlink(missing_ok=True)
    (root / "etc/apt/sources.list.d/debian.sources").write_text(rec["sources"])
    for path, content in rec["files"].items():
        p = root / path.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
    ssh = root / "root/.ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    (ssh / "authorized_keys").touch(mode=0o600)  # bind-mount target for the lab key
    # No /etc/hostname (debootstrap copies the controller's): systemd then keeps the
    # name nspawn's --hostname gave it, and Ansible's hostname module can still set one.
    (root / "etc/hostname").unlink(missing_ok=True)
    # Empty machine-id: each boot gets its own (from nspawn's --uuid), so hosts differ.
    (root / "etc/machine-id").write_text("")
    with contextlib.suppress(FileNotFoundError):
        (root / "var/lib/dbus/machine-id").unlink()
    # Units that only make sense on real hardware would leave the hosts "degraded".
    # apt-daily timers would take the dpkg lock in the middle of a converge.
    for unit in ("systemd-networkd-wait-online.service", "apt-daily.timer", "apt-daily-upgrade.timer"):
        link = root / "etc/systemd/system" / unit
        if not link.exists():
            link.symlink_to("/dev/null")
    run(["chroot", str(root), "apt-get", "clean"], timeout=120)


# ---------------------------------------------------------------- network


def _ip_json(*args) -> list:
    return json.loads(run(["ip", "-j", *args]).stdout or "[]")


def _link_exists(name: str) -> bool:
    return run(["ip", "link", "show", "dev", name], check=False).returncode == 0


def _taken_networks(exclude_dev: str | None = None) -> list[ipaddress.IPv4Network]:
    nets = []
    for r in _ip_json("-4", "route", "show", "table", "all"):
        dst = r.get("dst", "")
        if dst in ("default", "") or r.get("dev") == exclude_dev or r.get("type") == "broadcast":
            continue
        with contextlib.suppress(ValueError):
            net = ipaddress.ip_network(dst, strict=False)
            if net.prefixlen > 0:
                nets.append(net)
    for a in _ip_json("-4", "addr", "show"):
        if a.get("ifname") == exclude_dev:
            continue
        for ai in a.get("addr_info", []):
            nets.append(ipaddress.ip_network(f"{ai['local']}/{ai['prefixlen']}", strict=False))
    return nets


def _allocate_subnet(lab: str) -> ipaddress.IPv4Network:
    """Deterministic from the lab name; the next free /24 if that one is taken."""
    base = lab_net()
    subnets = list(base.subnets(new_prefix=24))[1:]  # index 0 holds the proxy address
    svc = ipaddress.ip_network(f"{svc_address()}/32")
    taken = [
        n
        for n in _taken_networks(exclude_dev=bridge_name(lab))
        if not (n.subnet_of(svc) if n.version == 4 else False)
    ]
    for other in _running_labs():
        if other != lab:
            with contextlib.suppress(Exception):
                taken.append(ipaddress.ip_network(_read_state(other)["subnet"]))
    start = int(hashlib.sha256(lab.encode()).hexdigest(), 16) % len(subnets)
    for i in range(len(subnets)):
        cand = subnets[(start + i) % len(subnets)]
        if not any(cand.overlaps(t) for t in taken):
            return cand
    raise LabError(f"no free /24 left in {base}")


def _ensure_bridge(name: str, addr: str) -> None:
    if not _link_exists(name):
        run(["ip", "link", "add", name, "type", "bridge", "stp_state", "0", "forward_delay", "0"])
    # No IPv6 on lab bridges: nothing needs it and it only adds DAD/RA noise.
    with contextlib.suppress(OSError):
        Path(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6").write_text("1")
    have = [
        f"{ai['local']}/{ai['prefixlen']}"
        for a in _ip_json("-4", "addr", "show", "dev", name)
        for ai in a.get("addr_info", [])
    ]
    for other in have:
        if other != addr:
            run(["ip", "addr", "del", other, "dev", name], check=False)
    if addr not in have:
        run(["ip", "addr", "add", addr, "dev", name])
    run(["ip", "link", "set", name, "up"])


def _delete_link(name: str) -> None:
    if _link_exists(name):
        run(["ip", "link", "del", name], check=False)


# ---------------------------------------------------------------- apt-cacher-ng


def _acng_dir() -> Path:
    return state_dir() / "_acng"


def _acng_pid() -> int | None:
    try:
        pid = int((_acng_dir() / "pid").read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) and _comm(pid) == "apt-cacher-ng" else None


def _port_open(addr: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return True
    except OSError:
        return False


def _ensure_acng() -> None:
    """One proxy for all labs, on its own address (ocrlab-svc), never on a public interface.

    A separate address (not each lab's bridge IP) lets labs come and go without
    restarting the proxy, and the image's apt config can name it statically.
    """
    _ensure_bridge(SVC_BRIDGE, f"{svc_address()}/32")
    if _acng_pid() and _port_open(svc_address(), ACNG_PORT):
        return
    _stop_acng(keep_bridge=True)
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
    _spawn_detached(argv, log=d / "daemon.log", pidfile=d / "pid", cgroup=("_acng", "proxy"))
    try:
        wait_until(lambda: _port_open(svc_address(), ACNG_PORT, 0.5), 20, "apt-cacher-ng to listen")
    except LabError as exc:
        raise LabError(f"{exc}\n{_tail(d / 'daemon.log')}") from None


def _acng_backends() -> list[str]:
    """Send Debian traffic to the controller's own mirrors: the packaged remap picks
    mirrors from a world list, which a machine with registry-only egress cannot reach."""
    main = sec = None
    for e in _apt_sources():
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


def _stop_acng(keep_bridge: bool = False) -> None:
    pid = _acng_pid()
    if pid:
        os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(LabError):
            wait_until(lambda: not _alive(pid), 10, "apt-cacher-ng to stop")
    _kill_cgroup("_acng", "proxy")
    _remove_cgroup("_acng")
    (_acng_dir() / "pid").unlink(missing_ok=True)
    if not keep_bridge:
        _delete_link(SVC_BRIDGE)


# ---------------------------------------------------------------- processes & cgroups


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _hierarchies() -> list[Path]:
    """cgroup hierarchies nspawn needs the caller placed in (--keep-unit uses the caller's cgroup)."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():  # pure cgroup v2
        return [CGROUP_ROOT]
    return [p for p in (CGROUP_ROOT / "systemd", CGROUP_ROOT / "unified") if p.is_dir()]


def _cgroup_dirs(*parts: str) -> list[Path]:
    return [h.joinpath("ocrlab", *parts) for h in _hierarchies()]


def _cgroup_pids(*parts: str) -> set[int]:
    pids: set[int] = set()
    for top in _cgroup_dirs(*parts):
        if not top.is_dir():
            continue
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(x) for x in procs.read_text().split())
    return {p for p in pids if _alive(p)}


def _kill_cgroup(*parts: str, timeout: float = KILL_TIMEOUT) -> None:
    def gone():
        pids = _cgroup_pids(*parts)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return not pids

    wait_until(gone, timeout, f"processes in cgroup ocrlab/{'/'.join(parts)} to die")


def _remove_cgroup(*parts: str) -> None:
    """rmdir a cgroup subtree depth-first (the container's systemd creates its own children)."""
    for top in _cgroup_dirs(*parts):
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


def _spawn_detached(
    argv: list[str], *, log: Path, pidfile: Path, cgroup: tuple[str, str], env: dict | None = None
) -> int:
    """Start argv in its own session and cgroups, not as our child; return its pid.

    The shell moves itself into the cgroups and writes its pid before exec, so the
    pid and the cgroup membership are right from the first instruction of argv.
    """
    dirs = _cgroup_dirs(*cgroup)
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
        raise LabError(f"{exc}\n{_tail(log)}") from None


# ---------------------------------------------------------------- hosts


def _leader(nspawn_pid: int) -> int | None:
    """The container's PID 1 (systemd), seen from here: nspawn's child whose NSpid ends in 1."""
    try:
        kids = Path(f"/proc/{nspawn_pid}/task/{nspawn_pid}/children").read_text().split()
    except OSError:
        return None
    for k in kids:
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{k}/status").read_text()
            nspid = re.search(r"^NSpid:\s+(.*)$", status, re.M).group(1).split()
            if len(nspid) >= 2 and nspid[-1] == "1" and _comm(int(k)) == "systemd":
                return int(k)
    return None


def _nsenter(leader: int, cgroup: tuple[str, str] | None = None) -> list[str]:
    """argv prefix to run a command inside a host. With cgroup=(lab, host) the command
    first joins the host's cgroup, so `down` finds and kills whatever it leaves running."""
    prefix = []
    if cgroup:
        moves = " && ".join(
            f"echo $$ > {shlex.quote(str(d / 'cgroup.procs'))}" for d in _cgroup_dirs(*cgroup)
        )
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


@dataclasses.dataclass
class Host:
    name: str
    address: str
    machine: str
    nspawn_pid: int = 0
    leader: int = 0

    def log_path(self, lab: str) -> Path:
        return state_dir() / lab / "logs" / f"{self.name}.log"


@dataclasses.dataclass
class Lab:
    name: str
    bridge: str
    subnet: str
    bridge_ip: str
    apt_proxy: str
    key: str
    inventory: str
    image: str
    hosts: list[Host]
    started_at: float = 0.0

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise LabError(
            f"lab {self.name} has no host {name!r} (hosts: {', '.join(h.name for h in self.hosts)})"
        )

    def instance_config(self) -> list[dict]:
        """Molecule's molecule_instance_config: a list of dicts (write it as a YAML list)."""
        return [
            {"instance": h.name, "address": h.address, "user": "root", "port": 22, "identity_file": self.key}
            for h in self.hosts
        ]

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["state"] = str(state_dir() / self.name / "state.json")
        d["instance_config"] = self.instance_config()
        return d

    def ssh_argv(self, host: str, *cmd: str) -> list[str]:
        return ["ssh", *SSH_OPTS, "-i", self.key, f"root@{self.host(host).address}", *cmd]

    def exec(
        self, host: str, cmd: list[str], *, check=True, timeout=120, input=None, capture=True
    ) -> subprocess.CompletedProcess:
        """Run cmd inside host via nsenter (needs no network, no ssh)."""
        h = self.host(host)
        if not h.leader or not _alive(h.leader):
            raise LabError(f"host {host} of lab {self.name} is not running")
        return run(
            [*_nsenter(h.leader, (self.name, h.name)), *cmd],
            check=check,
            timeout=timeout,
            input=input,
            capture=capture,
        )

    def ssh(self, host: str, cmd: str, *, check=True, timeout=120) -> subprocess.CompletedProcess:
        return run(self.ssh_argv(host, cmd), check=check, timeout=timeout)


def _read_state(lab: str) -> dict:
    return json.loads((state_dir() / lab / "state.json").read_text())


def load(lab: str) -> Lab:
    try:
        d = _read_state(lab)
    except (OSError, ValueError):
        raise LabError(f"lab {lab!r} is not up (no {state_dir() / lab / 'state.json'})") from None
    d.pop("state", None)
    d.pop("instance_config", None)
    d["hosts"] = [Host(**h) for h in d["hosts"]]
    return Lab(**d)


def _write_state(lab: Lab) -> None:
    d = state_dir() / lab.name
    tmp = d / "state.json.tmp"
    tmp.write_text(json.dumps(lab.to_dict(), indent=2) + "\n")
    tmp.rename(d / "state.json")


def _write_inventory(lab: Lab) -> None:
    lines = ["# Written by lab/ (ocrfleet). Regenerated on every `up`.", "[lab]"]
    lines += [f"{h.name} ansible_host={h.address}" for h in lab.hosts]
    common = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o IdentitiesOnly=yes"
    lines += [
        "",
        "[all:vars]",
        "ansible_user=root",
        f"ansible_ssh_private_key_file={lab.key}",
        f"ansible_ssh_common_args='{common}'",
        "ansible_python_interpreter=/usr/bin/python3",
        f"lab_name={lab.name}",
        f"lab_controller_address={lab.bridge_ip}",
        f"lab_apt_proxy={lab.apt_proxy}",
        "",
    ]
    Path(lab.inventory).write_text("\n".join(lines))


def _running_labs() -> list[str]:
    d = state_dir()
    return sorted(p.parent.name for p in d.glob("*/state.json")) if d.is_dir() else []


def _boot(lab: Lab, h: Host, image: Path, key_pub: Path) -> None:
    log = h.log_path(lab.name)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    uuid = hashlib.sha256(f"{lab.name}/{h.name}/{time.time()}".encode()).hexdigest()[:32]
    argv = [
        "systemd-nspawn",
        "-D",
        str(image),
        "--volatile=overlay",
        "-b",
        "--register=no",
        "--keep-unit",
        "-M",
        h.machine,
        f"--hostname={h.name}",
        f"--uuid={uuid}",
        f"--network-bridge={lab.bridge}",
        "--console=read-only",
        "--link-journal=no",
        "--resolv-conf=off",
        "--timezone=off",
        f"--bind-ro={key_pub}:/root/.ssh/authorized_keys",
    ]
    h.nspawn_pid = _spawn_detached(
        argv, log=log, pidfile=state_dir() / lab.name / f"{h.name}.pid", cgroup=(lab.name, h.name)
    )


def _fail(lab: Lab, h: Host, msg: str) -> LabError:
    return LabError(
        f"host {h.name} of lab {lab.name}: {msg}\n--- {h.log_path(lab.name)} (tail) ---\n"
        f"{_tail(h.log_path(lab.name))}"
    )


def _configure_net(lab: Lab, h: Host) -> None:
    """Address host0 from outside (no DHCP, no networkd); route only to the proxy, no default route."""
    ns = ["nsenter", "-t", str(h.leader), "-n", "ip"]
    prefix = ipaddress.ip_network(lab.subnet).prefixlen
    run([*ns, "addr", "replace", f"{h.address}/{prefix}", "dev", "host0"])
    run([*ns, "link", "set", "host0", "up"])
    run([*ns, "route", "replace", f"{svc_address()}/32", "via", lab.bridge_ip, "dev", "host0"])


def _hosts_file(lab: Lab) -> str:
    lines = [
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        f"{lab.bridge_ip}\tcontroller.lab controller",
    ]
    lines += [f"{h.address}\t{h.name}" for h in lab.hosts]
    return "\n".join(lines) + "\n"


def _system_state(lab: Lab, h: Host) -> str:
    cp = run(
        [*_nsenter(h.leader, (lab.name, h.name)), "systemctl", "is-system-running"], check=False, timeout=15
    )
    return cp.stdout.strip()


def _ssh_ok(lab: Lab, h: Host) -> bool:
    if not _port_open(h.address, 22, 0.5):
        return False
    return run(lab.ssh_argv(h.name, "true"), check=False, timeout=20).returncode == 0


def up(
    name: str, hosts: list[str] | None = None, count: int | None = None, *, keep_on_failure: bool = False
) -> Lab:
    """Boot a fresh lab (a stale one of the same name is torn down first). Returns the Lab."""
    _require_root()
    _check_name("lab", name)
    if hosts is None:
        hosts = [f"{name}-{i}" for i in range(1, (count or 1) + 1)]
    if not hosts or len(set(hosts)) != len(hosts):
        raise LabError(f"host names must be given and unique: {hosts}")
    for hn in hosts:
        _check_name("host", hn)
    if len(hosts) > 200:
        raise LabError("at most 200 hosts per lab")
    image = image_path()
    if not image_ready():
        build_image()
    t0 = time.monotonic()
    with _locked():
        _down_locked(name)  # after a crash or a killed run, start clean
        d = state_dir() / name
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)
        subnet = _allocate_subnet(name)
        addrs = list(subnet.hosts())
        lab = Lab(
            name=name,
            bridge=bridge_name(name),
            subnet=str(subnet),
            bridge_ip=str(addrs[0]),
            apt_proxy=apt_proxy_url(),
            key=str(d / "id_ed25519"),
            inventory=str(d / "inventory.ini"),
            image=str(image),
            started_at=time.time(),
            hosts=[
                Host(name=hn, address=str(addrs[9 + i]), machine=machine_name(name, hn))
                for i, hn in enumerate(hosts)
            ],
        )
        # Written first, so `down` finds what it must clean even if the rest fails.
        _write_state(lab)
        try:
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"ocrfleet-lab-{name}", "-f", lab.key])
            _ensure_bridge(lab.bridge, f"{lab.bridge_ip}/{subnet.prefixlen}")
            _ensure_acng()
            for h in lab.hosts:
                _boot(lab, h, image, Path(lab.key + ".pub"))
            _write_state(lab)
            for h in lab.hosts:

                def leader(h=h):
                    if not _alive(h.nspawn_pid):
                        return -1
                    return _leader(h.nspawn_pid)

                try:
                    h.leader = wait_until(leader, 30, "the container's systemd")
                except LabError as exc:
                    raise _fail(lab, h, str(exc)) from None
                if h.leader == -1:
                    raise _fail(lab, h, "systemd-nspawn exited during start")
                _configure_net(lab, h)
                lab.exec(h.name, ["sh", "-c", "cat > /etc/hosts"], input=_hosts_file(lab))
            _write_state(lab)
            _write_inventory(lab)
            deadline = time.monotonic() + BOOT_TIMEOUT
            for h in lab.hosts:

                def booted(h=h):
                    if not _alive(h.nspawn_pid):
                        raise _fail(lab, h, "systemd-nspawn exited while booting")
                    return _system_state(lab, h) in ("running", "degraded")

                try:
                    wait_until(
                        booted, max(1.0, deadline - time.monotonic()), "systemd to finish booting", 0.2
                    )
                    wait_until(
                        lambda h=h: _ssh_ok(lab, h), max(1.0, deadline - time.monotonic()), "sshd", 0.2
                    )
                except LabError as exc:
                    if "host " in str(exc):
                        raise
                    state = _system_state(lab, h) if _alive(h.nspawn_pid) else "dead"
                    raise _fail(lab, h, f"{exc} (is-system-running: {state})") from None
                if _system_state(lab, h) == "degraded":
                    failed = lab.exec(
                        h.name, ["systemctl", "--failed", "--no-legend", "--plain"], check=False
                    )
                    _log(f"warning: {h.name} is degraded: {failed.stdout.strip()}")
        except BaseException:
            if not keep_on_failure:
                with contextlib.suppress(Exception):
                    _down_locked(name)
            raise
    _log(f"lab {name} up: {len(lab.hosts)} host(s) in {time.monotonic() - t0:.1f}s")
    return lab


def _lab_hosts_on_system(lab: str) -> set[str]:
    names = set()
    for top in _cgroup_dirs(lab):
        if top.is_dir():
            names.update(p.name for p in top.iterdir() if p.is_dir())
    return names


def _poweroff(lab: str, host: str, nspawn_pid: int | None) -> None:
    """Clean poweroff (SIGRTMIN+4 to the container's systemd), bounded; then SIGKILL the cgroup."""
    pids = _cgroup_pids(lab, host)
    nspawn = [p for p in pids if _comm(p) == "systemd-nspawn" and _alive(p)]
    leaders = [lp for p in nspawn if (lp := _leader(p))]
    for lp in leaders:
        with contextlib.suppress(ProcessLookupError):
            os.kill(lp, signal.SIGRTMIN + 4)
    if leaders:
        with contextlib.suppress(LabError):
            wait_until(lambda: not any(_alive(p) for p in nspawn), POWEROFF_TIMEOUT, f"{host} to power off")
    _kill_cgroup(lab, host)


def _down_locked(name: str) -> None:
    st = None
    with contextlib.suppress(OSError, ValueError):
        st = _read_state(name)
    hosts = _lab_hosts_on_system(name) | {h["name"] for h in (st or {}).get("hosts", [])}
    for host in sorted(hosts):
        _poweroff(name, host, None)
    _kill_cgroup(name)
    _remove_cgroup(name)
    br = bridge_name(name)
    # nspawn's veths vanish with the container's netns; sweep any left on the bridge or by name.
    veths = {f"vb-{machine_name(name, h)}" for h in hosts}
    if _link_exists(br):
        veths |= {link["ifname"] for link in _ip_json("link", "show", "master", br)}
    for v in veths:
        _delete_link(v)
    _delete_link(br)
    d = state_dir() / name
    if d.exists():
        _umount_under(d)
        shutil.rmtree(d, ignore_errors=True)
    # Nothing of this lab may stay mounted (nspawn mounts in its own namespace, but check).
    _umount_under(state_dir() / name)
    if not _running_labs():
        _stop_acng()


def down(name: str | None = None, *, all: bool = False) -> list[str]:
    """Tear down a lab (or every lab found: state, cgroups, bridges). Idempotent."""
    _require_root()
    t0 = time.monotonic()
    with _locked():
        if all:
            names = set(_running_labs())
            for h in _hierarchies():
                top = h / "ocrlab"
                if top.is_dir():
                    names.update(p.name for p in top.iterdir() if p.is_dir() and not p.name.startswith("_"))
            # Bridges of labs whose state is gone: their name may be a hash, so sweep by prefix.
            known = {bridge_name(n) for n in names}
            for link in _ip_json("link", "show", "type", "bridge"):
                ifn = link["ifname"]
                if ifn.startswith("ocrlab-") and ifn != SVC_BRIDGE and ifn not in known:
                    for port in _ip_json("link", "show", "master", ifn):
                        _delete_link(port["ifname"])
                    _delete_link(ifn)
            for n in sorted(names):
                _down_locked(n)
            _stop_acng()
            _remove_cgroup("_acng")
            for h in _hierarchies():
                with contextlib.suppress(OSError):
                    (h / "ocrlab").rmdir()
            done = sorted(names)
        else:
            if not name:
                raise LabError("down needs a lab name or --all")
            _check_name("lab", name)
            _down_locked(name)
            done = [name]
    _log(f"down {', '.join(done) or '(nothing)'} in {time.monotonic() - t0:.1f}s")
    return done


def status(name: str | None = None) -> list[dict]:
    out = []
    for n in [name] if name else _running_labs():
        try:
            lab = load(n)
        except LabError:
            continue
        d = lab.to_dict()
        for h, hd in zip(lab.hosts, d["hosts"], strict=True):
            alive = bool(h.leader) and _alive(h.leader) and _alive(h.nspawn_pid)
            hd["running"] = alive
            hd["system_state"] = _system_state(lab, h) if alive else "down"
        out.append(d)
    return out


def leftovers() -> dict:
    """What the lab could have left on the machine (for tests and `status --leftovers`)."""
    procs = []
    for h in _hierarchies():
        top = h / "ocrlab"
        if top.is_dir():
            for procs_file in top.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    procs += [p for p in map(int, procs_file.read_text().split()) if _alive(p)]
    nspawn = [
        p
        for p in map(int, filter(str.isdigit, os.listdir("/proc")))
        if _comm(p) == "systemd-nspawn" and _alive(p)
    ]
    mounts = [
        line.split()[1]
        for line in Path("/proc/mounts").read_text().splitlines()
        if "ocrfleet-lab" in line.split()[1] or "ocrlab" in line.split()[1]
    ]
    return {
        "cgroups": [str(h / "ocrlab") for h in _hierarchies() if (h / "ocrlab").exists()],
        "processes": sorted(set(procs) | set(nspawn)),
        "links": [
            link["ifname"]
            for link in _ip_json("link", "show")
            if link["ifname"].startswith(("ocrlab-", "vb-l"))
        ],
        "mounts": mounts,
        "labs": _running_labs(),
        "apt_cacher_ng": _acng_pid(),
    }


def instance_config(name: str) -> list[dict]:
    return load(name).instance_config()
