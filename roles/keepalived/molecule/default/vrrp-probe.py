#!/usr/bin/env python3
"""Probe for the keepalived scenario's verify (runs on the controller, from the repository root): prints JSON.

Usage: vrrp-probe.py LAB VIP HOSTS MODE [ARGS]   (HOSTS comma-separated, VIP without prefix)
  snapshot                       per host: holds the VIP, keepalived's last state, how often it became MASTER,
                                 joined VRRP's multicast group; and which host answers HTTP on VIP:443
  wait-holder HOST BOUND_S [ACTION]
                                 poll (every 0.1 s) until HOST alone holds the VIP and answers on it; counts
                                 the samples where two hosts held it. rc 1 when BOUND_S passes first. ACTION,
                                 done first (the time counts from it): stop-haproxy:H (systemctl stop haproxy
                                 on H) or unplug:H (H's link down: to the others, H fell silent, as if dead)
  plug HOST                      HOST's link up again
  wait-state HOST STATE BOUND_S  poll until keepalived's last "Entering X STATE" on HOST is STATE
  wait-adverts HOST N BOUND_S    poll until HOST's keepalived has received N more adverts than at the start
                                 (its stats file, SIGUSR2), noting every host seen holding the VIP meanwhile;
                                 ends early (rc 1) when the VIP is seen elsewhere than at the start

The hosts are read with nsenter (lab.state.Lab.exec): no SSH, no network; HTTP goes over the lab's bridge.
"""

import http.client
import json
import re
import sys
import time

from lab.state import load

STATE_RE = re.compile(r"Entering ([A-Z]+) STATE")
RECEIVED_RE = re.compile(r"Advertisements:\s*\n\s*Received:\s*(\d+)")
VRRP_GROUP = "224.0.0.18"
ACTIONS = {
    "stop-haproxy": ["systemctl", "stop", "haproxy.service"],
    "unplug": ["ip", "link", "set", "host0", "down"],
    "plug": ["ip", "link", "set", "host0", "up"],
}


def sh(lab, host: str, script: str) -> str:
    return lab.exec(host, ["sh", "-c", script], check=False, timeout=20).stdout


def holds(lab, host: str, vip: str) -> bool:
    return vip in sh(lab, host, f"ip -o -4 addr show to {vip}/32")


def states(lab, host: str) -> list[str]:
    """Every state keepalived entered on host, in order (its journal since the host booted)."""
    return STATE_RE.findall(sh(lab, host, "journalctl -u keepalived.service -o cat --no-pager"))


def state(lab, host: str) -> str:
    found = states(lab, host)
    return found[-1] if found else ""


def received(lab, host: str) -> int:
    # keepalived writes /tmp/keepalived.stats on SIGUSR2 (keepalived --signum=STATS), replaced whole.
    out = sh(
        lab,
        host,
        "rm -f /tmp/keepalived.stats; systemctl kill --kill-whom=main --signal=USR2 keepalived.service; "
        "for i in $(seq 50); do [ -s /tmp/keepalived.stats ] && break; sleep 0.1; done; "
        "cat /tmp/keepalived.stats",
    )
    m = RECEIVED_RE.search(out)
    if not m:
        raise SystemExit(f"no advert count in {host}'s stats: {out!r}")
    return int(m.group(1))


def http_host(vip: str) -> str:
    conn = http.client.HTTPConnection(vip, 443, timeout=2)
    try:
        conn.request("GET", "/")
        return conn.getresponse().read().decode().strip()
    except OSError as err:
        return f"error: {err}"
    finally:
        conn.close()


def holders(lab, hosts: list[str], vip: str) -> list[str]:
    return [h for h in hosts if holds(lab, h, vip)]


def main() -> int:
    lab_name, vip, hosts_arg, mode, *args = sys.argv[1:]
    lab, hosts = load(lab_name), hosts_arg.split(",")
    start = time.monotonic()
    if mode == "snapshot":
        out = {
            h: {
                "holds": holds(lab, h, vip),
                "state": state(lab, h),
                "became_master": states(lab, h).count("MASTER"),
                "multicast": VRRP_GROUP in sh(lab, h, "ip maddr show"),
            }
            for h in hosts
        }
        print(json.dumps({"hosts": out, "http": http_host(vip)}))
        return 0
    if mode == "wait-holder":
        host, bound = args[0], float(args[1])
        if len(args) > 2:
            action, target = args[2].split(":")
            start = time.monotonic()
            lab.exec(target, ACTIONS[action], timeout=30)
        samples = both = 0
        while True:
            held = holders(lab, hosts, vip)
            samples += 1
            both += len(held) > 1
            answer = http_host(vip) if held == [host] else ""
            done = held == [host] and answer == host
            if done or time.monotonic() - start > bound:
                print(
                    json.dumps(
                        {
                            "elapsed_s": round(time.monotonic() - start, 2),
                            "samples": samples,
                            "both_held": both,
                            "holders": held,
                            "http": answer,
                            "done": done,
                        }
                    )
                )
                return 0 if done else 1
            time.sleep(0.1)
    if mode == "plug":
        lab.exec(args[0], ACTIONS["plug"], timeout=30)
        return 0
    if mode == "wait-state":
        host, want, bound = args[0], args[1], float(args[2])
        while True:
            got = state(lab, host)
            if got == want or time.monotonic() - start > bound:
                print(json.dumps({"elapsed_s": round(time.monotonic() - start, 2), "state": got}))
                return 0 if got == want else 1
            time.sleep(0.1)
    if mode == "wait-adverts":
        host, more, bound = args[0], int(args[1]), float(args[2])
        first = received(lab, host)
        seen: set[str] = set(holders(lab, hosts, vip))
        at_start = set(seen)
        while True:
            seen.update(holders(lab, hosts, vip))
            now = received(lab, host)
            # Ends early when the address moved: the verdict is known.
            if now - first >= more or seen != at_start or time.monotonic() - start > bound:
                seen.update(holders(lab, hosts, vip))
                print(
                    json.dumps(
                        {
                            "elapsed_s": round(time.monotonic() - start, 2),
                            "received": now - first,
                            "holders_seen": sorted(seen),
                            "done": now - first >= more,
                        }
                    )
                )
                return 0 if now - first >= more and seen == at_start else 1
            time.sleep(0.2)
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    sys.exit(main())
