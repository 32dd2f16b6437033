"""Self-test of the nspawn lab: two real systemd hosts, then a teardown that leaves nothing.

Run as root:  .venv/bin/pytest tests/lab -m lab
Needs lab/install-deps.sh; builds the image on first use (a few minutes).
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from lab import lab as L
from lab.apt import SVC_BRIDGE
from lab.base import run, state_dir
from lab.image import image_path
from lab.net import bridge_name, port_open
from lab.procs import is_alive
from lab.state import instance_config

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

LAB = "selftest"


def poll(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (val := pred()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s: {what}")
        time.sleep(0.1)
    return val


def nft_controller() -> str:
    if not shutil.which("nft"):
        return "(nft not installed)"
    return run(["nft", "list", "ruleset"]).stdout


@pytest.fixture(scope="module")
def lab():
    if os.geteuid() != 0 or not shutil.which("systemd-nspawn") or not shutil.which("apt-cacher-ng"):
        # Fail, never skip: a lab test that did not run must not look like one that passed.
        pytest.fail("the lab needs root and lab/install-deps.sh (make test runs it)", pytrace=False)
    nft_before = nft_controller()
    lb = L.up(LAB, count=2)
    lb.nft_before = nft_before
    yield lb
    L.down(LAB)


@pytest.fixture(scope="module")
def hosts(lab):
    return [h.name for h in lab.hosts]


def test_systemd_running(lab, hosts):
    for h in hosts:
        state = lab.exec(h, ["systemctl", "is-system-running"], check=False).stdout.strip()
        failed = lab.exec(h, ["systemctl", "--failed", "--no-legend", "--plain"], check=False).stdout
        assert state == "running", f"{h}: {state}; failed units: {failed}"
        assert lab.exec(h, ["hostname"]).stdout.strip() == h


def test_hosts_are_distinct(lab, hosts):
    ids = {lab.exec(h, ["cat", "/etc/machine-id"]).stdout.strip() for h in hosts}
    assert len(ids) == len(hosts)


def test_ssh_with_key_only(lab, hosts):
    for h in hosts:
        assert lab.ssh(h, "id -u").stdout.strip() == "0"
    cfg = lab.ssh(hosts[0], "sshd -T").stdout
    assert "passwordauthentication no" in cfg
    assert "permitrootlogin without-password" in cfg
    # Without the key, no way in: the server itself refuses, and offers no method but public keys.
    argv = [a for a in lab.ssh_argv(hosts[0], "true") if a != lab.key]
    argv.remove("-i")
    r = run([*argv[:1], "-o", "PubkeyAuthentication=no", *argv[1:]], check=False)
    assert r.returncode == 255 and "Permission denied (publickey)." in r.stderr, r.stderr


def test_inventory_and_instance_config(lab, hosts):
    inv = Path(lab.inventory).read_text()
    for h in lab.hosts:
        assert f"{h.name} ansible_host={h.address}" in inv
    assert f"ansible_ssh_private_key_file={lab.key}" in inv
    cfg = instance_config(LAB)
    assert [c["instance"] for c in cfg] == hosts
    assert {"instance", "address", "user", "port", "identity_file"} <= set(cfg[0])


def test_connectivity(lab, hosts):
    a, b = lab.hosts
    # controller -> hosts
    for h in lab.hosts:
        assert port_open(h.address, 22)
    # host -> host (bash's /dev/tcp: no extra packages needed)
    banner = lab.exec(a.name, ["bash", "-c", f"exec 3<>/dev/tcp/{b.address}/22; head -c 4 <&3"], timeout=15)
    assert banner.stdout == "SSH-"
    # host -> a service the test runs on the controller's bridge address
    srv = socket.create_server((lab.bridge_ip, 0))
    port = srv.getsockname()[1]
    got: list[bytes] = []

    def serve():
        srv.settimeout(20)
        conn, _ = srv.accept()
        with conn:
            got.append(conn.recv(100))

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    lab.exec(b.name, ["bash", "-c", f"echo hello >/dev/tcp/{lab.bridge_ip}/{port}"], timeout=15)
    t.join(20)
    srv.close()
    assert got == [b"hello\n"]
    # No default route: nothing leaves the lab except through the apt proxy.
    for h in hosts:
        assert lab.exec(h, ["ip", "route", "show", "default"]).stdout.strip() == ""


def test_apt_through_proxy(lab, hosts):
    for h in hosts:
        lab.ssh(h, "apt-get update -q", timeout=180)
    lab.ssh(hosts[0], "DEBIAN_FRONTEND=noninteractive apt-get install -y -q nftables", timeout=180)


def test_nft_inside_host_only(lab, hosts):
    rules = (
        "table inet ocrlab_test {\n chain input {\n  type filter hook input priority 0; policy accept;\n"
        "  tcp dport 9 drop\n }\n}\n"
    )
    h = hosts[0]
    lab.exec(h, ["sh", "-c", "cat > /etc/nftables-test.conf"], input=rules)
    lab.exec(h, ["nft", "-c", "-f", "/etc/nftables-test.conf"])
    lab.exec(h, ["nft", "-f", "/etc/nftables-test.conf"])
    assert "ocrlab_test" in lab.exec(h, ["nft", "list", "ruleset"]).stdout
    assert nft_controller() == lab.nft_before, "the host's ruleset leaked into the controller's"
    assert lab.ssh(h, "true").returncode == 0  # and the host is still reachable


HARDENED_UNIT = """\
[Unit]
Description=ocrfleet lab: hardening directives a role's services use

[Service]
Type=notify
NotifyAccess=all
ExecStart=/bin/sh -c '\
  ! touch /usr/x 2>/dev/null && ! touch /etc/x 2>/dev/null && \
  touch /tmp/private-ok && test ! -e /tmp/outside-marker && \
  touch "$STATE_DIRECTORY/ok" && test ! -e /home/marker && \
  echo hardened-ok && systemd-notify --ready && exec sleep infinity'
DynamicUser=yes
StateDirectory=ocrlab-hardened
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
NoNewPrivileges=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
ProcSubset=pid
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
LockPersonality=yes
MemoryDenyWriteExecute=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service
CapabilityBoundingSet=
AmbientCapabilities=
UMask=0077
Restart=on-failure
RestartSec=1
WatchdogSec=0
"""


def test_hardened_unit_starts(lab, hosts):
    h = hosts[1]
    lab.exec(h, ["sh", "-c", "touch /tmp/outside-marker /home/marker"])
    lab.exec(h, ["sh", "-c", "cat > /etc/systemd/system/ocrlab-hardened.service"], input=HARDENED_UNIT)
    lab.exec(h, ["systemctl", "daemon-reload"])
    cp = lab.exec(h, ["systemctl", "start", "ocrlab-hardened.service"], check=False, timeout=30)
    status = lab.exec(
        h, ["systemctl", "status", "--no-pager", "-l", "ocrlab-hardened.service"], check=False
    ).stdout
    assert cp.returncode == 0, f"{cp.stderr}\n{status}"
    assert lab.exec(h, ["systemctl", "is-active", "ocrlab-hardened.service"]).stdout.strip() == "active"
    # journald has the service's output
    poll(
        lambda: "hardened-ok" in lab.exec(h, ["journalctl", "-u", "ocrlab-hardened", "--no-pager"]).stdout,
        15,
        "the unit's output in the journal",
    )
    # systemd-analyze security works and rates this unit well
    sec = lab.exec(h, ["systemd-analyze", "security", "--no-pager", "ocrlab-hardened.service"], check=False)
    assert sec.returncode == 0, sec.stderr
    assert "Overall exposure level" in sec.stdout
    # Restart=on-failure after a kill -9
    pid = lab.exec(h, ["systemctl", "show", "-P", "MainPID", "ocrlab-hardened.service"]).stdout.strip()
    lab.exec(h, ["kill", "-9", pid])
    poll(
        lambda: (
            lab.exec(h, ["systemctl", "show", "-P", "MainPID", "ocrlab-hardened.service"]).stdout.strip()
            not in ("0", pid)
            and lab.exec(h, ["systemctl", "is-active", "ocrlab-hardened.service"], check=False).stdout.strip()
            == "active"
        ),
        30,
        "the unit to be restarted after kill -9",
    )


def test_timer_fires(lab, hosts):
    h = hosts[0]
    lab.exec(
        h,
        [
            "systemd-run",
            "--on-active=1",
            "--timer-property=AccuracySec=100ms",
            "--unit=ocrlab-timer-test",
            "touch",
            "/run/timer-fired",
        ],
    )
    poll(
        lambda: lab.exec(h, ["test", "-e", "/run/timer-fired"], check=False).returncode == 0,
        20,
        "the transient timer to fire",
    )


def test_down_leaves_nothing(lab):
    machines = {h.machine for h in lab.hosts}
    L.down(LAB)
    left = L.leftovers()
    assert LAB not in left["labs"]
    assert not any((Path(c) / LAB).exists() for c in left["cgroups"])
    assert bridge_name(LAB) not in left["links"]
    assert not [link for link in left["links"] if link.removeprefix("vb-") in machines]
    assert not [m for m in left["mounts"] if LAB in m or image_path().as_posix() in m]
    assert not (state_dir() / LAB).exists()
    for h in lab.hosts:
        assert not is_alive(h.nspawn_pid)
        assert not is_alive(h.leader)
    if not left["labs"]:  # the last lab takes the proxy and the service bridge with it
        assert left["apt_cacher_ng"] is None
        assert SVC_BRIDGE not in left["links"]
        assert left["processes"] == []
        assert left["cgroups"] == []
