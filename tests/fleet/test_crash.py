"""A crash costs nothing (`make test-fleet`): `kill -9` of an app instance under load fails no request; nor
does a full disk on a third host (tests/fleet/disk.py), which leaves the pool before it can fail one.

Under a constant load (4 clients, documents up to 2 MB) the only instance of app-1 is killed, then one of
the two instances of app-2. Requests the dead instance held are replayed (nginx: on another of app-2's;
HAProxy: on the other host for app-1, whose nginx can only answer 502), and the dead instance gets no request
after its first failure (nginx skips app-2's dead instance) or, for app-1, once HAProxy's checks have it DOWN
(a replayed 502 cannot mark a server down: HAProxy replays it before counting it). Each time systemd restarts
the instance and the fleet is whole again before the next step. Prints
`crash_failed_requests=F crash_total_requests=N` once.
"""

from __future__ import annotations

import re

import pytest

from lab.base import wait_until
from tests.fleet.conftest import MULTI, https_client, lb_servers, log_size, ocr_lines, say, serving_lb
from tests.fleet.disk import full_disk
from tests.fleet.load import Load, documents, large_documents

pytestmark = [pytest.mark.lab, pytest.mark.timeout(1800)]

ONE = "app-1"
FULL = "app-3"  # its disk fills after the crashes
FAIL_TIMEOUT_S = 10  # nginx_tls_upstream_fail_timeout: nginx tries a failed instance again after this
MIN_REQUESTS = 60


def unit_state(fleet, host: str, unit: str) -> tuple[int, str]:
    out = fleet.lab.exec(host, ["systemctl", "show", "-p", "MainPID,ActiveState", unit]).stdout
    props = dict(line.split("=", 1) for line in out.split())
    return int(props["MainPID"]), props["ActiveState"]


def lb_state_changes(fleet, host: str, since: float) -> list[tuple[float, str]]:
    """(epoch, UP/DOWN) of HAProxy's state changes of the host's server since `since`, from its journal."""
    argv = ["journalctl", "-o", "short-unix", "--no-pager", f"--since=@{since - 1:.0f}"]
    out = fleet.lab.exec(serving_lb(fleet), argv).stdout
    pattern = re.compile(rf"^(\d+\.\d+) .*Server ocr_servers/{re.escape(host)} is (UP|DOWN)")
    changes: list[tuple[float, str]] = []
    for m in filter(None, map(pattern.search, out.splitlines())):
        # Logged twice (syslog and stderr): keep each change once.
        if float(m[1]) >= since and (not changes or changes[-1][1] != m[2]):
            changes.append((float(m[1]), m[2]))
    return changes


def crash(fleet, load: Load, host: str, unit: str) -> tuple[float, float]:
    """kill -9 the unit's process under load; wait until systemd restarted it, HAProxy has the host UP and the
    load went on. Returns the seconds until the instance was back and the time of the kill (epoch)."""
    pid, state = unit_state(fleet, host, unit)
    assert pid > 0 and state == "active", (host, unit, pid, state)
    before = load.total
    wait_until(lambda: load.total >= before + 4, 300, "requests before the kill")
    # Killed while it holds a request (its /healthz counts them), polled on the host itself: a tight race.
    port = 8000 + int(unit.split("@")[1].split(".")[0])
    script = (
        "import json,os,time,urllib.request\n"
        "end=time.monotonic()+300\n"
        "while time.monotonic()<end:\n"
        f" h=json.load(urllib.request.urlopen('http://127.0.0.1:{port}/healthz',timeout=10))\n"
        " if h['inflight']>=1: break\n"
        " time.sleep(0.02)\n"
        f"os.kill({pid},9); print(time.time())\n"
    )
    killed_at = float(fleet.lab.exec(host, ["python3", "-c", script], timeout=400).stdout)

    def restarted() -> bool:
        # Type=notify: active again means the new process loaded its engine and said READY=1.
        new_pid, new_state = unit_state(fleet, host, unit)
        return new_pid not in (0, pid) and new_state == "active"

    wait_until(restarted, 300, f"{host} {unit} restarted", interval=0.2)
    back = float(fleet.lab.exec(host, ["date", "+%s.%N"]).stdout) - killed_at
    wait_until(lambda: lb_servers(fleet)[host]["status"] == "UP", 120, f"{host} UP", interval=0.2)
    after = load.total
    wait_until(lambda: load.total >= after + 8, 300, f"requests after {host} is back")
    say(f"{host} {unit}: killed (pid {pid}), active again {back:.1f} s later; {load.total} requests so far")
    return back, killed_at


def test_a_crash_or_a_full_disk_costs_nothing(fleet):
    assert {lb_servers(fleet)[h]["status"] for h in fleet.apps} == {"UP"}
    assert unit_state(fleet, MULTI, "ocr-app@1.service")[1] == "active", f"{MULTI} has no second instance"
    offsets = {h: log_size(fleet, h) for h in (ONE, MULTI)}
    load = Load(fleet.client, concurrency=4, docs=documents() + large_documents()).start()
    try:
        one_back, one_killed = crash(fleet, load, ONE, "ocr-app@0.service")
        multi_back, multi_killed = crash(fleet, load, MULTI, "ocr-app@1.service")
        full_disk(fleet, load, FULL, lambda host: https_client(fleet, host))
    finally:
        load.finish(MIN_REQUESTS)
    load.check(MIN_REQUESTS, prefix="crash_")

    # app-1 (one instance): every request it got while the instance was dead failed on it (nginx's 502, which
    # HAProxy replayed elsewhere). Once HAProxy has it DOWN (checks every 100 ms after a failed one) it gets
    # none (0.25 s: a request HAProxy dispatched just before may reach nginx just after).
    changes = lb_state_changes(fleet, ONE, one_killed)
    assert [c for _, c in changes][:2] == ["DOWN", "UP"], changes
    down_at = changes[0][0]
    lines = [r for r in ocr_lines(fleet, ONE, offsets[ONE]) if r["end"] >= one_killed]
    failed = [r for r in lines if r["status"] == 502]
    assert failed, "no request was in flight on app-1 when it was killed: nothing was replayed"
    first_end = min(r["end"] for r in failed)
    window = [r for r in failed if r["start"] > first_end]
    late = [r["rid"] for r in failed if r["start"] > down_at + 0.25]
    say(f"{ONE}: DOWN {down_at - one_killed:.2f} s after the kill ({down_at - first_end:.2f} s after its "
        f"first failure); {len(failed)} request(s) failed on it and were replayed, {len(window)} of them "
        f"sent after the first failure, {len(late)} after DOWN")  # fmt: skip
    assert not late, f"{ONE} got requests after HAProxy had it DOWN: {late}"
    say(f"{ONE}: replayed by HAProxy: {[r['rid'] for r in failed]} (load-I-N: N % 8 >= 6 is a 2 MB document)")

    # app-2 (two instances): nginx replays what @1 held on the next instance and skips @1 after its first
    # failure, but for one request per FAIL_TIMEOUT_S with which it probes whether @1 is back (replayed when
    # it is not).
    dead = "127.0.0.1:8001"
    lines = [r for r in ocr_lines(fleet, MULTI, offsets[MULTI]) if r["end"] >= multi_killed]
    assert all(r["status"] == 200 for r in lines), [r for r in lines if r["status"] != 200]
    failed = [r for r in lines if any(a == dead and s != "200" for a, s in r["attempts"])]
    assert failed, f"no request was in flight on {MULTI}'s ocr-app@1 when it was killed: nothing was replayed"
    first_end = min(r["end"] for r in failed)
    late = [r["rid"] for r in failed if r["start"] > first_end]
    probes = int(multi_back // FAIL_TIMEOUT_S) + 1
    say(f"{MULTI}: {len(failed)} request(s) failed on ocr-app@1 and were replayed on another instance, "
        f"{len(late)} after the first (nginx probes allowed: {probes}); "
        f"{one_back:.1f}/{multi_back:.1f} s until back")  # fmt: skip
    assert len(late) <= probes, f"{MULTI}'s dead instance got requests after its first failure: {late}"
    # Not asserted (known, issue #10): when nginx tries the restarted, still loading @1 again, its 503 on
    # /healthz can fail HAProxy's checks of the whole host for a few seconds (no request fails).
    say(f"{MULTI}: HAProxy state changes after the kill: {lb_state_changes(fleet, MULTI, multi_killed)}")
    assert {lb_servers(fleet)[h]["status"] for h in fleet.apps} == {"UP"}
