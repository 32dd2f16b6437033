"""The fleet scenario (`make test-fleet`): rolling upgrades through a load balancer under load, in the lab.

3 app hosts + 1 HAProxy host converge site.yml. A load generator sends OCR requests with real documents to
the load balancer while playbooks/upgrade.yml rolls a new app version through the fleet, then a deliberately
broken one (it starts and passes its self-test but misreads letters, so its smoke test fails): the first
host must be rolled back, the play must stop, the fleet must keep serving the good version, and no request
may fail in either rollout. Then a third rollout's control node dies (ansible-playbook and its workers
killed) while app-2 is drained: app-2 stays out of the pool, and a plain re-run of upgrade.yml brings it back
and finishes the rollout. No output of any run may hold the fleet's API key (the smoke test sends it).
Prints `failed_requests=F total_requests=N` once, for the whole scenario.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from lab import fleet as F
from lab import lab as L
from tests.fleet.conftest import ROOT, current_release, lb_servers, say, task_order
from tests.fleet.load import Load
from tests.fleet.releases import break_reading, derive_wheelhouse

pytestmark = [pytest.mark.lab, pytest.mark.timeout(3600)]

MIN_REQUESTS = 500
DRAIN_FILE = "/run/ocr-app/drain"


def drained(fleet: F.Fleet, host: str) -> bool:
    return fleet.lab.exec(host, ["test", "-e", DRAIN_FILE], check=False).returncode == 0


def kill_control_node(playbook: str) -> int:
    """SIGKILL our ansible-playbook child and its workers (ansible-runner starts it in its own session)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        args = [a.decode(errors="replace") for a in cmdline]
        if ppid == os.getpid() and any(a.endswith("ansible-playbook") for a in args) and playbook in args[-1]:
            os.killpg(int(proc.name), signal.SIGKILL)
            return int(proc.name)
    raise AssertionError(f"no ansible-playbook {playbook} child of this process")


def test_rolling_upgrades_under_load(fleet, tmp_path):
    base = ROOT / "build" / "wheelhouse"
    old = current_release(fleet, "app-1")
    good, bad = f"{old}+fleet.2", f"{old}+fleet.3"  # local versions sort after the release they patch
    good_wh = derive_wheelhouse(base, tmp_path / "good", good)
    bad_wh = derive_wheelhouse(base, tmp_path / "bad", bad, patch=break_reading)
    assert {lb_servers(fleet)[h]["status"] for h in fleet.apps} == {"UP"}

    runs = []  # every ansible-runner run of the scenario: none may print the API key
    load = Load(fleet.client, concurrency=4).start()
    try:
        # --- a good version, through the whole fleet -----------------------------------------------------
        t0 = time.monotonic()
        r = fleet.playbook("playbooks/upgrade.yml", {"ocr_app_wheelhouse_dir": str(good_wh)}, check=False)
        runs.append(r)
        say(f"upgrade to {good}: rc {r.rc} in {time.monotonic() - t0:.0f} s, {load.total} requests so far")
        assert r.rc == 0, F.failures(r)
        assert not load.exhausted, "the load ended before the rollout did"
        for h in fleet.apps:
            assert current_release(fleet, h) == good, h
            assert fleet.host_health(h)["version"] == good, h
        # One host at a time: each host is back in the pool before the next one is drained.
        order = task_order(r, "Switch the fleet")
        # The ocr_app role's drain and undrain entry points, by their tasks.
        drains = [order.index((h, "Write the drain file")) for h in fleet.apps]
        undrains = [order.index((h, "Remove the drain file")) for h in fleet.apps]
        assert drains[0] < undrains[0] < drains[1] < undrains[1] < drains[2] < undrains[2]
        assert {lb_servers(fleet)[h]["status"] for h in fleet.apps} == {"UP"}
        after_good = load.total

        # --- a broken version: the first host's smoke test fails ----------------------------------------
        t0 = time.monotonic()
        r = fleet.playbook("playbooks/upgrade.yml", {"ocr_app_wheelhouse_dir": str(bad_wh)}, check=False)
        runs.append(r)
        say(f"broken upgrade to {bad}: rc {r.rc} in {time.monotonic() - t0:.0f} s, {load.total} requests")
        assert r.rc != 0, "the broken release's rollout succeeded"
        assert not load.exhausted, "the load ended before the rollout did"
        failed = F.failures(r)
        assert any(f.startswith("app-1: Check the smoke test's text") for f in failed), failed
        assert any(f.startswith("app-1: Stop the rollout") for f in failed), failed
        order = task_order(r, "Switch the fleet")
        assert {h for h, _ in order} == {"app-1"}, "hosts after the failed one were touched"
        # Staged everywhere, switched nowhere: the failed host is back on the good version.
        for h in fleet.apps:
            assert current_release(fleet, h) == good, h
            assert fleet.host_health(h)["status"] == "ready", h
            staged = fleet.lab.exec(h, ["test", "-d", f"/opt/ocr-app/releases/{bad}"], check=False)
            assert staged.returncode == 0, f"{bad} was not staged on {h}"
        assert {lb_servers(fleet)[h]["status"] for h in fleet.apps} == {"UP"}
        assert load.total > after_good

        # --- an interrupted rollout: the control node dies while app-2 is drained; a re-run finishes it ----
        resumed = f"{old}+fleet.4"
        resumed_wh = derive_wheelhouse(base, tmp_path / "resumed", resumed)
        victim = "app-2"
        extravars = {"ocr_app_wheelhouse_dir": str(resumed_wh)}
        killed: list = []
        rollout = threading.Thread(
            target=lambda: killed.append(fleet.playbook("playbooks/upgrade.yml", extravars, check=False))
        )
        rollout.start()
        try:
            L.wait_until(
                lambda: not rollout.is_alive() or drained(fleet, victim), 1800, f"{victim} drained", 0.5
            )
            assert rollout.is_alive(), f"upgrade.yml ended before draining {victim}: {F.failures(killed[0])}"
            kill_control_node("upgrade.yml")
        finally:
            rollout.join(300)
        assert not rollout.is_alive()
        runs += killed
        assert killed[0].rc != 0, "the killed upgrade.yml reported success"
        # Left as the dead run left it: drained, out of the pool (HAProxy's checks see /healthz draining).
        assert drained(fleet, victim)
        L.wait_until(lambda: lb_servers(fleet)[victim]["status"] != "UP", 60, f"{victim} out of pool", 0.5)
        assert current_release(fleet, "app-3") != resumed, "the rollout went past the drained host"

        t0 = time.monotonic()
        r = fleet.playbook("playbooks/upgrade.yml", extravars, check=False)
        runs.append(r)
        rerun_s = time.monotonic() - t0
        assert r.rc == 0, F.failures(r)
        assert not load.exhausted, "the load ended before the rollout did"
        for h in fleet.apps:
            assert current_release(fleet, h) == resumed, h
            health = fleet.host_health(h)
            assert (health["version"], health["status"]) == (resumed, "ready"), h
            assert not drained(fleet, h), f"{h} still has its drain file"
        assert {lb_servers(fleet)[h]["status"] for h in fleet.apps} == {"UP"}
        print(f"interrupted_upgrade: killed during {victim} drained; rerun rc={r.rc} in {rerun_s:.0f} s")

        # The smoke test sends the fleet's key: no event and no stdout of any run may hold it in clear.
        for run in runs:
            assert fleet.key not in " ".join(run.config.command), "a command line holds the API key"
            assert fleet.key not in run.stdout.read(), "a playbook's output holds the API key"
            for e in run.events:
                assert fleet.key not in json.dumps(e), f"event {e.get('event')} of a run holds the API key"
    finally:
        load.finish(MIN_REQUESTS)
    load.check(MIN_REQUESTS)
