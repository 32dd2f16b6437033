"""The fleet scenario (`make test-fleet`): rolling upgrades through a load balancer under load, in the lab.

3 app hosts + 1 HAProxy host converge site.yml. A load generator sends OCR requests with real documents to
the load balancer while playbooks/upgrade.yml rolls a new app version through the fleet, then a deliberately
broken one (it starts and passes its self-test but misreads letters, so its smoke test fails): the first
host must be rolled back, the play must stop, the fleet must keep serving the good version, and no request
may fail in either rollout. Prints `failed_requests=F total_requests=N` once, for the whole scenario.
"""

from __future__ import annotations

import time

import pytest

from tests.fleet.conftest import ROOT, current_release, lb_servers, say, task_order
from tests.fleet.load import Load
from tests.fleet.releases import break_reading, derive_wheelhouse
from tests.lab import fleet as F

pytestmark = [pytest.mark.lab, pytest.mark.timeout(3600)]

MIN_REQUESTS = 500


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
