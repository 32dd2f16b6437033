"""The load-balancer pair (`make test-fleet`; last, because it kills an LB host for good): clients reach the
service address, which keepalived holds on one of two HAProxy hosts.

1. A planned restart of HAProxy on both (playbooks/lb-restart.yml) under load fails no request: the standby
   first (stopped and started), the holder last (a reload, its master re-executed); the address stays put.
   Prints `lb_restart_failed_requests=F of N`.
2. The LB holding the address dies under load, as in a power cut: its link is taken down on the bridge
   (nothing it held answers again, not even a reset), then every process on it is killed (SIGKILL of its
   container's init). The standby takes the address after three missed adverts, new connections reach it
   (their SYNs sent again meanwhile), and only requests in flight on the dead LB fail, when the client's
   timeout ends them: one per client at most, each holding one connection. Prints
   `lb_failover_failed_requests=F of N` and `lb_failover_s` (the cut until the standby holds the address),
   and the alert that says the pair has lost its standby fires.

   Killed without the cut, the container's kernel state outlives its processes for a moment and refuses the
   connections sent to the address meanwhile (a reset per SYN: hundreds of attempts by a client that tries
   again at once); a host whose HAProxy alone dies does the same until keepalived's check gives it up.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from lab.base import wait_until
from tests.fleet.conftest import firing, say, task_order
from tests.fleet.load import Load

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

CLIENTS = 4
MIN_REQUESTS = 24
# A request's bound: under the planned restart, room for the slowest answer; through the failover, how long a
# request in flight on the dead LB hangs before it fails (nothing answers for it again): a lab request takes
# about a second.
CLIENT_TIMEOUT_S = 30
FAILOVER_CLIENT_TIMEOUT_S = 10


def haproxy_pids(fleet, host: str) -> tuple[int, set[int]]:
    """HAProxy's master (the unit's main process) and its workers on the host."""
    master = int(fleet.lab.exec(host, ["systemctl", "show", "-p", "MainPID", "--value", "haproxy"]).stdout)
    out = fleet.lab.exec(host, ["pgrep", "-P", str(master)], check=False).stdout
    return master, {int(p) for p in out.split()}


def test_planned_restart_fails_none_and_a_dead_lb_costs_only_its_requests(fleet):
    assert len(fleet.lbs) == 2, fleet.lbs
    holder = wait_until(fleet.lb_holder, 30, "an LB holding the service address")
    (standby,) = set(fleet.lbs) - {holder}
    before = {lb: haproxy_pids(fleet, lb) for lb in fleet.lbs}

    # 1. The planned restart.
    load = Load(lambda: fleet.client(timeout=CLIENT_TIMEOUT_S), concurrency=CLIENTS).start()
    wait_until(lambda: load.total >= 8, 300, "requests before the restart")
    r = fleet.playbook("playbooks/lb-restart.yml")
    at = load.total
    wait_until(lambda: load.total >= at + 8, 300, "requests after the restart")
    load.finish(MIN_REQUESTS)
    print(f"lb_restart_failed_requests={load.failed} of {load.total}", flush=True)
    assert load.failed == 0, load.first_failures
    restarted = [h for h, t in task_order(r, "Restart HAProxy") if t == "Restart HAProxy"]
    assert restarted == [standby, holder], restarted
    after = {lb: haproxy_pids(fleet, lb) for lb in fleet.lbs}
    assert after[standby][0] != before[standby][0], "the standby's HAProxy was not restarted"
    # The holder's reload: the same unit process, re-executed, with new workers (the old ones finish).
    assert after[holder][0] == before[holder][0], (before, after)
    assert after[holder][1] and not after[holder][1] & before[holder][1], (before, after)
    assert fleet.lb_holder() == holder, "the planned restart moved the service address"

    # 2. The holder killed.
    load = Load(lambda: fleet.client(timeout=FAILOVER_CLIENT_TIMEOUT_S), concurrency=CLIENTS).start()
    wait_until(lambda: load.total >= 8, 300, "requests before the kill")
    host = fleet.lab.host(holder)
    subprocess.run(["ip", "link", "set", f"vb-{host.machine}", "down"], check=True)
    killed = time.monotonic()
    os.kill(host.leader, signal.SIGKILL)
    wait_until(lambda: fleet.lb_holder() == standby, 60, f"{standby} holding the address", interval=0.05)
    failover_s = time.monotonic() - killed
    at = load.ok
    wait_until(lambda: load.ok >= at + 8, 300, f"requests answered through {standby}")
    load.finish(MIN_REQUESTS)
    print(
        f"lb_failover_failed_requests={load.failed} of {load.total} lb_failover_s={failover_s:.1f}"
        f" failures={dict(load.failures)}",
        flush=True,
    )
    assert load.failed <= CLIENTS, load.first_failures
    assert load.total >= MIN_REQUESTS

    # The pair has no standby now: the alert says so.
    alert = wait_until(lambda: firing(fleet, "OcrLbPeerDown"), 180, "OcrLbPeerDown firing", interval=1)
    say(f"OcrLbPeerDown firing {time.monotonic() - killed:.0f} s after the cut: {alert[0]['labels']}")
