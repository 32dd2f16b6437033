"""A lab of real systemd hosts: Debian rootfs booted with systemd-nspawn on a Linux bridge.

Stdlib only (it runs before any venv exists). Root only. Used by the CLI
(`python3 -m lab ...`), pytest fixtures and Molecule create/destroy playbooks.
This module boots and tears down labs and their hosts (up, down, status, leftovers);
the parts it puts together are image.py (the rootfs), net.py (bridges, addresses),
apt.py (the apt proxy), procs.py (processes, cgroups, nsenter), state.py (Lab, Host,
state.json, the inventory) and base.py (errors, paths, the lock, bounded commands).

Layout (see README.md):
  cache  $OCRFLEET_LAB_CACHE (/var/cache/ocrfleet-lab): images/<name>/ + <name>.stamp, apt-cacher-ng/
  state  $OCRFLEET_LAB_STATE (/run/ocrfleet-lab): <lab>/state.json, inventory.ini, id_ed25519, logs
  cgroup /sys/fs/cgroup/{systemd,unified}/ocrlab/<lab>/<host>
  net    bridge ocrlab-<short> with 10.213.<n>.0/24 per lab; apt proxy on ocrlab-svc 10.213.0.1:3142
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
import re
import shutil
import signal
import time
from pathlib import Path

from .apt import SVC_BRIDGE, acng_pid, apt_proxy_url, ensure_acng, stop_acng
from .base import LabError, locked, require_root, run, say, state_dir, tail, umount_under, wait_until
from .image import build_image, image_path, image_ready
from .net import (
    allocate_subnet,
    bridge_name,
    delete_link,
    ensure_bridge,
    ip_json,
    link_exists,
    port_open,
    svc_address,
)
from .procs import (
    cgroup_dirs,
    cgroup_pids,
    comm,
    hierarchies,
    is_alive,
    kill_cgroup,
    leader_pid,
    nsenter_argv,
    remove_cgroup,
    spawn_detached,
)
from .state import Host, Lab, load, read_state, running_labs, write_inventory, write_state

# Bounded waits (seconds).
BOOT_TIMEOUT = float(os.environ.get("OCRFLEET_LAB_BOOT_TIMEOUT", "90"))
POWEROFF_TIMEOUT = 20.0
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")


def machine_name(lab: str, host: str) -> str:
    # nspawn names the host-side veth "vb-<machine>"; keep it short and unique across labs.
    return "l" + hashlib.sha256(f"{lab}/{host}".encode()).hexdigest()[:10]


def _check_name(kind: str, name: str) -> None:
    if not NAME_RE.match(name) or name.startswith("_"):
        raise LabError(f"invalid {kind} name {name!r}: use [a-z0-9-], max 32 chars")


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
    h.nspawn_pid = spawn_detached(
        argv, log=log, pidfile=state_dir() / lab.name / f"{h.name}.pid", cgroup=(lab.name, h.name)
    )


def _fail(lab: Lab, h: Host, msg: str) -> LabError:
    return LabError(
        f"host {h.name} of lab {lab.name}: {msg}\n--- {h.log_path(lab.name)} (tail) ---\n"
        f"{tail(h.log_path(lab.name))}"
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
        [*nsenter_argv(h.leader, (lab.name, h.name)), "systemctl", "is-system-running"],
        check=False,
        timeout=15,
    )
    return cp.stdout.strip()


def _ssh_ok(lab: Lab, h: Host) -> bool:
    if not port_open(h.address, 22, 0.5):
        return False
    return run(lab.ssh_argv(h.name, "true"), check=False, timeout=20).returncode == 0


def up(
    name: str, hosts: list[str] | None = None, count: int | None = None, *, keep_on_failure: bool = False
) -> Lab:
    """Boot a fresh lab (a stale one of the same name is torn down first). Returns the Lab."""
    require_root()
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
    with locked():
        _down_locked(name)  # after a crash or a killed run, start clean
        d = state_dir() / name
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)
        subnet = allocate_subnet(name)
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
        write_state(lab)
        try:
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"ocrfleet-lab-{name}", "-f", lab.key])
            ensure_bridge(lab.bridge, f"{lab.bridge_ip}/{subnet.prefixlen}")
            ensure_acng()
            for h in lab.hosts:
                _boot(lab, h, image, Path(lab.key + ".pub"))
            write_state(lab)
            for h in lab.hosts:

                def leader(h=h):
                    if not is_alive(h.nspawn_pid):
                        return -1
                    return leader_pid(h.nspawn_pid)

                try:
                    h.leader = wait_until(leader, 30, "the container's systemd")
                except LabError as exc:
                    raise _fail(lab, h, str(exc)) from None
                if h.leader == -1:
                    raise _fail(lab, h, "systemd-nspawn exited during start")
                _configure_net(lab, h)
                lab.exec(h.name, ["sh", "-c", "cat > /etc/hosts"], input=_hosts_file(lab))
            write_state(lab)
            write_inventory(lab)
            deadline = time.monotonic() + BOOT_TIMEOUT
            for h in lab.hosts:

                def booted(h=h):
                    if not is_alive(h.nspawn_pid):
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
                    state = _system_state(lab, h) if is_alive(h.nspawn_pid) else "dead"
                    raise _fail(lab, h, f"{exc} (is-system-running: {state})") from None
                if _system_state(lab, h) == "degraded":
                    failed = lab.exec(
                        h.name, ["systemctl", "--failed", "--no-legend", "--plain"], check=False
                    )
                    say(f"warning: {h.name} is degraded: {failed.stdout.strip()}")
        except BaseException:
            if not keep_on_failure:
                with contextlib.suppress(Exception):
                    _down_locked(name)
            raise
    say(f"lab {name} up: {len(lab.hosts)} host(s) in {time.monotonic() - t0:.1f}s")
    return lab


def _lab_hosts_on_system(lab: str) -> set[str]:
    names = set()
    for top in cgroup_dirs(lab):
        if top.is_dir():
            names.update(p.name for p in top.iterdir() if p.is_dir())
    return names


def _poweroff(lab: str, host: str, nspawn_pid: int | None) -> None:
    """Clean poweroff (SIGRTMIN+4 to the container's systemd), bounded; then SIGKILL the cgroup."""
    pids = cgroup_pids(lab, host)
    nspawn = [p for p in pids if comm(p) == "systemd-nspawn" and is_alive(p)]
    leaders = [lp for p in nspawn if (lp := leader_pid(p))]
    for lp in leaders:
        with contextlib.suppress(ProcessLookupError):
            os.kill(lp, signal.SIGRTMIN + 4)
    if leaders:
        with contextlib.suppress(LabError):
            wait_until(lambda: not any(is_alive(p) for p in nspawn), POWEROFF_TIMEOUT, f"{host} to power off")
    kill_cgroup(lab, host)


def _down_locked(name: str) -> None:
    st = None
    with contextlib.suppress(OSError, ValueError):
        st = read_state(name)
    hosts = _lab_hosts_on_system(name) | {h["name"] for h in (st or {}).get("hosts", [])}
    for host in sorted(hosts):
        _poweroff(name, host, None)
    kill_cgroup(name)
    remove_cgroup(name)
    br = bridge_name(name)
    # nspawn's veths vanish with the container's netns; sweep any left on the bridge or by name.
    veths = {f"vb-{machine_name(name, h)}" for h in hosts}
    if link_exists(br):
        veths |= {link["ifname"] for link in ip_json("link", "show", "master", br)}
    for v in veths:
        delete_link(v)
    delete_link(br)
    d = state_dir() / name
    if d.exists():
        umount_under(d)
        shutil.rmtree(d, ignore_errors=True)
    # Nothing of this lab may stay mounted (nspawn mounts in its own namespace, but check).
    umount_under(state_dir() / name)
    if not running_labs():
        stop_acng()


def down(name: str | None = None, *, all: bool = False) -> list[str]:
    """Tear down a lab (or every lab found: state, cgroups, bridges). Idempotent."""
    require_root()
    t0 = time.monotonic()
    with locked():
        if all:
            names = set(running_labs())
            for h in hierarchies():
                top = h / "ocrlab"
                if top.is_dir():
                    names.update(p.name for p in top.iterdir() if p.is_dir() and not p.name.startswith("_"))
            # Bridges of labs whose state is gone: their name may be a hash, so sweep by prefix.
            known = {bridge_name(n) for n in names}
            for link in ip_json("link", "show", "type", "bridge"):
                ifn = link["ifname"]
                if ifn.startswith("ocrlab-") and ifn != SVC_BRIDGE and ifn not in known:
                    for port in ip_json("link", "show", "master", ifn):
                        delete_link(port["ifname"])
                    delete_link(ifn)
            for n in sorted(names):
                _down_locked(n)
            stop_acng()
            remove_cgroup("_acng")
            for h in hierarchies():
                with contextlib.suppress(OSError):
                    (h / "ocrlab").rmdir()
            done = sorted(names)
        else:
            if not name:
                raise LabError("down needs a lab name or --all")
            _check_name("lab", name)
            _down_locked(name)
            done = [name]
    say(f"down {', '.join(done) or '(nothing)'} in {time.monotonic() - t0:.1f}s")
    return done


def status(name: str | None = None) -> list[dict]:
    out = []
    for n in [name] if name else running_labs():
        try:
            lab = load(n)
        except LabError:
            continue
        d = lab.to_dict()
        for h, hd in zip(lab.hosts, d["hosts"], strict=True):
            alive = bool(h.leader) and is_alive(h.leader) and is_alive(h.nspawn_pid)
            hd["running"] = alive
            hd["system_state"] = _system_state(lab, h) if alive else "down"
        out.append(d)
    return out


def leftovers() -> dict:
    """What the lab could have left on the machine (for tests and `status --leftovers`)."""
    procs = []
    for h in hierarchies():
        top = h / "ocrlab"
        if top.is_dir():
            for procs_file in top.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    procs += [p for p in map(int, procs_file.read_text().split()) if is_alive(p)]
    nspawn = [
        p
        for p in map(int, filter(str.isdigit, os.listdir("/proc")))
        if comm(p) == "systemd-nspawn" and is_alive(p)
    ]
    mounts = [
        line.split()[1]
        for line in Path("/proc/mounts").read_text().splitlines()
        if "ocrfleet-lab" in line.split()[1] or "ocrlab" in line.split()[1]
    ]
    return {
        "cgroups": [str(h / "ocrlab") for h in hierarchies() if (h / "ocrlab").exists()],
        "processes": sorted(set(procs) | set(nspawn)),
        "links": [
            link["ifname"]
            for link in ip_json("link", "show")
            if link["ifname"].startswith(("ocrlab-", "vb-l"))
        ],
        "mounts": mounts,
        "labs": running_labs(),
        "apt_cacher_ng": acng_pid(),
    }
