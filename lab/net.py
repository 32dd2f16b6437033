"""The lab's network: one /24 per lab from OCRFLEET_LAB_NET on a bridge of its own, the service address for
the apt proxy, and the `ip` calls that make and remove bridges and links."""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import socket
from pathlib import Path

from .base import LabError, run
from .state import read_state, running_labs


def lab_net() -> ipaddress.IPv4Network:
    net = ipaddress.ip_network(os.environ.get("OCRFLEET_LAB_NET", "10.213.0.0/16"))
    if net.prefixlen > 16:
        raise LabError(f"OCRFLEET_LAB_NET={net} must be a /16 or larger")
    return net


def svc_address() -> str:
    # First address of the lab range: never inside a lab /24 (those start at index 1).
    return str(lab_net().network_address + 1)


def lb_service_address(subnet: str) -> str:
    """The address two or more LBs of a lab share (keepalived): .200 of its /24 (hosts are from .10)."""
    return str(ipaddress.ip_network(subnet)[200])


def _short(name: str) -> str:
    # Interface names are limited to 15 chars: "ocrlab-" + 8.
    return name if len(name) <= 8 else hashlib.sha256(name.encode()).hexdigest()[:8]


def bridge_name(lab: str) -> str:
    return f"ocrlab-{_short(lab)}"


def ip_json(*args) -> list:
    return json.loads(run(["ip", "-j", *args]).stdout or "[]")


def link_exists(name: str) -> bool:
    return run(["ip", "link", "show", "dev", name], check=False).returncode == 0


def _taken_networks(exclude_dev: str | None = None) -> list[ipaddress.IPv4Network]:
    nets = []
    for r in ip_json("-4", "route", "show", "table", "all"):
        dst = r.get("dst", "")
        if dst in ("default", "") or r.get("dev") == exclude_dev or r.get("type") == "broadcast":
            continue
        with contextlib.suppress(ValueError):
            net = ipaddress.ip_network(dst, strict=False)
            if net.prefixlen > 0:
                nets.append(net)
    for a in ip_json("-4", "addr", "show"):
        if a.get("ifname") == exclude_dev:
            continue
        for ai in a.get("addr_info", []):
            nets.append(ipaddress.ip_network(f"{ai['local']}/{ai['prefixlen']}", strict=False))
    return nets


def allocate_subnet(lab: str) -> ipaddress.IPv4Network:
    """Deterministic from the lab name; the next free /24 if that one is taken."""
    base = lab_net()
    subnets = list(base.subnets(new_prefix=24))[1:]  # index 0 holds the proxy address
    svc = ipaddress.ip_network(f"{svc_address()}/32")
    taken = [
        n
        for n in _taken_networks(exclude_dev=bridge_name(lab))
        if not (n.subnet_of(svc) if n.version == 4 else False)
    ]
    for other in running_labs():
        if other != lab:
            with contextlib.suppress(Exception):
                taken.append(ipaddress.ip_network(read_state(other)["subnet"]))
    start = int(hashlib.sha256(lab.encode()).hexdigest(), 16) % len(subnets)
    for i in range(len(subnets)):
        cand = subnets[(start + i) % len(subnets)]
        if not any(cand.overlaps(t) for t in taken):
            return cand
    raise LabError(f"no free /24 left in {base}")


def ensure_bridge(name: str, addr: str) -> None:
    if not link_exists(name):
        run(["ip", "link", "add", name, "type", "bridge", "stp_state", "0", "forward_delay", "0"])
    # No IPv6 on lab bridges: nothing needs it and it only adds DAD/RA noise.
    with contextlib.suppress(OSError):
        Path(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6").write_text("1")
    have = [
        f"{ai['local']}/{ai['prefixlen']}"
        for a in ip_json("-4", "addr", "show", "dev", name)
        for ai in a.get("addr_info", [])
    ]
    for other in have:
        if other != addr:
            run(["ip", "addr", "del", other, "dev", name], check=False)
    if addr not in have:
        run(["ip", "addr", "add", addr, "dev", name])
    run(["ip", "link", "set", name, "up"])


def delete_link(name: str) -> None:
    if link_exists(name):
        run(["ip", "link", "del", name], check=False)


def port_open(addr: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return True
    except OSError:
        return False
