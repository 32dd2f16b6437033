"""The fleet scenario (`make test-fleet`): rolling upgrades through a load balancer under load, in the lab.

3 app hosts + 1 HAProxy host converge site.yml. A load generator sends OCR requests with real documents to
the load balancer while playbooks/upgrade.yml rolls a new app version through the fleet, then a deliberately
broken one (it starts and passes its self-test but misreads letters, so its smoke test fails): the first
host must be rolled back, the play must stop, the fleet must keep serving the good version, and no request
may fail in either rollout. Prints `failed_requests=F total_requests=N` once, for the whole scenario.
"""

from __future__ import annotations

import csv
import io
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fleet.load import Load
from tests.fleet.releases import break_reading, derive_wheelhouse
from tests.lab import fleet as F

pytestmark = [pytest.mark.lab, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
LAB = "fleet"
APPS = 3
MIN_REQUESTS = 500


def say(msg: str) -> None:
    print(f"[fleet] {msg}", flush=True)


def lb_servers(fleet: F.Fleet) -> dict[str, dict]:
    """HAProxy's view of backend ocr_servers, from its runtime API on the load balancer host."""
    out = fleet.lab.exec("lb-1", ["socat", "stdio", "/run/haproxy/admin.sock"], input="show stat\n").stdout
    rows = csv.DictReader(io.StringIO(out.removeprefix("# ")))
    return {r["svname"]: r for r in rows if r["pxname"] == "ocr_servers" and r["svname"] not in ("BACKEND",)}


def current_release(fleet: F.Fleet, host: str) -> str:
    return fleet.lab.exec(host, ["readlink", "/opt/ocr-app/current"]).stdout.strip().rsplit("/", 1)[-1]


def task_order(r, play_prefix: str) -> list[tuple[str, str]]:
    """(host, task) of every task result of the plays whose name starts with play_prefix, in order."""
    return [
        (e["event_data"]["host"], e["event_data"]["task"])
        for e in r.events
        if e.get("event") in ("runner_on_ok", "runner_on_failed")
        and e["event_data"].get("play", "").startswith(play_prefix)
    ]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    base = ROOT / "build" / "wheelhouse"
    if not any(base.glob("ocr_app-*.whl")):
        pytest.fail("no wheelhouse: run `make wheelhouse` (make test-fleet does)")
    state = tmp_path_factory.mktemp("fleet")
    start = time.monotonic()
    try:
        # `make demo`'s own script brings the fleet up: the demo is tested here, on 3 app hosts.
        demo = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "demo.py"), "--state", str(state), "--lab", LAB,
             "up", "--apps", str(APPS)],
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        assert demo.returncode == 0, demo.stdout[-4000:] + demo.stderr[-2000:]
        fl = F.load(LAB, state)
        for expected in ("invoice No. 2048", "Ada Lovelace", f"Load balancer: {fl.lb_url}", fl.key):
            assert expected in demo.stdout, demo.stdout[-3000:]
        say(f"scripts/demo.py: {APPS} app hosts + 1 load balancer up in {time.monotonic() - start:.0f} s")
        yield fl
    finally:
        F.down(LAB)


def test_rolling_upgrades_under_load(fleet, tmp_path):
    base = ROOT / "build" / "wheelhouse"
    old = current_release(fleet, "app-1")
    good, bad = f"{old}+fleet.2", f"{old}+fleet.3"  # local versions sort after the release they patch
    good_wh = derive_wheelhouse(base, tmp_path / "good", good)
    bad_wh = derive_wheelhouse(base, tmp_path / "bad", bad, patch=break_reading)
    assert {lb_servers(fleet)[h]["status"] for h in fleet.apps} == {"UP"}

    load = Load(fleet.client, concurrency=4).start()
    try:
        # --- a good version, through the whole fleet -----------------------------------------------------
        t0 = time.monotonic()
        r = fleet.playbook("playbooks/upgrade.yml", {"ocr_app_wheelhouse_dir": str(good_wh)}, check=False)
        say(f"upgrade to {good}: rc {r.rc} in {time.monotonic() - t0:.0f} s, {load.total} requests so far")
        assert r.rc == 0, F.failures(r)
        assert not load.exhausted, "the load ended before the rollout did"
        for h in fleet.apps:
            assert current_release(fleet, h) == good, h
            assert fleet.host_health(h)["version"] == good, h
        # One host at a time: each host is back in the pool before the next one is drained.
        order = task_order(r, "Switch the fleet")
        drains = [order.index((h, "Drain the host (its /healthz says draining; requests in flight finish)"))
                  for h in fleet.apps]  # fmt: skip
        undrains = [order.index((h, "Undrain the host")) for h in fleet.apps]
        assert drains[0] < undrains[0] < drains[1] < undrains[1] < drains[2] < undrains[2]
        assert {lb_servers(fleet)[h]["status"] for h in fleet.apps} == {"UP"}
        after_good = load.total

        # --- a broken version: the first host's smoke test fails ----------------------------------------
        t0 = time.monotonic()
        r = fleet.playbook("playbooks/upgrade.yml", {"ocr_app_wheelhouse_dir": str(bad_wh)}, check=False)
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
    finally:
        load.finish(MIN_REQUESTS)
    print(f"failed_requests={load.failed} total_requests={load.total}", flush=True)
    say(f"load: {load.total} requests in {load.seconds:.0f} s; failures by kind: {dict(load.failures)}")
    assert load.failed == 0, load.first_failures
    assert load.total >= MIN_REQUESTS
