"""The fleet the scenarios of `make test-fleet` share: 3 app hosts, two LBs (HAProxy, keepalived), monitoring
and two database hosts (Patroni), brought up once by `make demo`'s own script, as `make demo` brings it up (so
the demo is tested too), torn down at the end of the session.

OCRFLEET_FLEET_LAB names the lab (default `fleet`), so that two runs on one machine do not collide.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from lab import fleet as F

ROOT = Path(__file__).resolve().parents[2]
LAB = os.environ.get("OCRFLEET_FLEET_LAB", "fleet")
# One more than make demo's default: on 2 hosts the load's 2 clients keep app-1's one instance busy
# throughout, so it takes no job page beside them; on 3, leastconn leaves a different host quiet each moment.
APPS = 3
DBS = 2  # a replicated job database: Patroni, etcd on both and on mon-1
LBS = 2  # a pair of load balancers sharing the service address (keepalived)
MULTI = "app-2"  # runs ocr-app@0..1 (inventory/lab/host_vars/app-2.yml)
MULTI_INSTANCES = 2


def instances(host: str) -> int:
    """ocr-app instances on an app host: MULTI_INSTANCES on MULTI, one elsewhere (the lab inventory's)."""
    return MULTI_INSTANCES if host == MULTI else 1


ACCESS_LOG = "/var/log/nginx/access.log"  # nginx_tls: its log format ends with what LINE reads
LINE = re.compile(
    r'"POST /v1/ocr[^"]*" (?P<status>\d+) .* request_id=(?P<rid>\S+) request_time=(?P<rt>[\d.]+) '
    r"upstream=(?P<up>.*?) upstream_status=(?P<us>.*?) upstream_time=.* msec=(?P<msec>[\d.]+)$"
)
ALERTMANAGER_PORT = 9093  # the monitoring role's default, on mon-1's loopback
BRING_UP_S = 1800  # scripts/demo.py's own limit below


# Run first: tests that time nothing. `make test` runs test-app beside this stage, to use the cores the
# bring-up leaves idle; the tests that measure how soon something happens (an alert's window, a canary's
# latency) come after these, once test-app has ended. test_jobs.py's job through a kill, a database stop and
# a cut asserts what is read, not how soon (its waits are bounded polls; the alert times it prints are
# longer under load): it fills the time test-app would otherwise keep the timed tests waiting.
UNTIMED_FIRST = ("test_converged.py", "test_jobs.py")
# Run last: it kills an LB host for good (the lab's hosts come back only by a new bring-up).
LAST = ("test_lb_pair.py",)


# `make test` names the stages that run beside this one (OCRFLEET_BESIDE) and the file each stage's name is
# written to as it ends, passed or failed (OCRFLEET_STAGES_ENDED). The first timed test waits for them, so
# that a longer test-app delays the fleet's timed tests instead of slowing what they time.
BESIDE_WAIT_S = 900


def wait_for_stages_beside() -> None:
    beside = set(os.environ.get("OCRFLEET_BESIDE", "").split()) - {"test-fleet"}
    ended_file = os.environ.get("OCRFLEET_STAGES_ENDED")
    if not beside or not ended_file:
        return
    start = time.monotonic()
    while True:
        try:
            ended = set(Path(ended_file).read_text().split())
        except FileNotFoundError:
            ended = set()
        waited = time.monotonic() - start
        if beside <= ended:
            say(f"stages beside the fleet ended ({' '.join(sorted(beside))}): waited {waited:.0f} s")
            return
        if waited > BESIDE_WAIT_S:
            say(f"still running beside the fleet after {waited:.0f} s: {' '.join(sorted(beside - ended))}")
            return
        time.sleep(2)  # polls a file: the timed tests start once it names every stage beside


_quiet = False


@pytest.fixture(autouse=True)
def _timed_tests_run_alone(request):
    """Before the first fleet test that times something: the stages beside have ended (see above). Only the
    fleet's own (lab) tests wait: this folder's unit tests run in test-app, a stage waited for."""
    global _quiet
    here = Path(__file__).parent
    node = request.node
    if (
        not _quiet
        and node.get_closest_marker("lab") is not None
        and node.path.is_relative_to(here)
        and node.path.name not in UNTIMED_FIRST
    ):
        wait_for_stages_beside()
        _quiet = True


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    items.sort(
        key=lambda item: (
            item.path.is_relative_to(here) and item.path.name not in UNTIMED_FIRST,
            item.path.is_relative_to(here) and item.path.name in LAST,
        )
    )
    # pytest-timeout counts fixture setup: whichever fleet test comes first also waits for the bring-up.
    for item in items:
        if item.path.is_relative_to(here):
            marker = item.get_closest_marker("timeout")
            own = marker.args[0] if marker and marker.args else item.config.getini("timeout")
            item.add_marker(pytest.mark.timeout(float(own) + BRING_UP_S), append=False)


def say(msg: str) -> None:
    print(f"[fleet] {msg}", flush=True)


def serving_lb(fleet: F.Fleet) -> str:
    """The LB that serves clients now (the holder of the service address); a failure when none does."""
    holder = fleet.lb_holder()
    assert holder is not None, "no LB holds the service address"
    return holder


def lb_servers(fleet: F.Fleet) -> dict[str, dict]:
    """HAProxy's view of backend ocr_servers, from its runtime API on the LB that serves clients."""
    argv = ["socat", "stdio", "/run/haproxy/admin.sock"]
    out = fleet.lab.exec(serving_lb(fleet), argv, input="show stat\n").stdout
    rows = csv.DictReader(io.StringIO(out.removeprefix("# ")))
    return {r["svname"]: r for r in rows if r["pxname"] == "ocr_servers" and r["svname"] not in ("BACKEND",)}


def https_client(fleet: F.Fleet, host: str) -> httpx.Client:
    """An HTTPS client of the host's own nginx (past HAProxy), verifying it with the fleet's CA."""
    ca = ssl.create_default_context(cafile=str(fleet.ca_file))  # the chain must verify
    return httpx.Client(base_url=f"https://{fleet.lab.host(host).address}", verify=ca, timeout=120)


def firing(fleet: F.Fleet, alert: str) -> list[dict]:
    """The alerts of that name mon-1's Alertmanager holds (its API v2 lists the active ones, not resolved)."""
    alerts = json.loads(fleet.host_get("mon-1", ALERTMANAGER_PORT, "/api/v2/alerts"))
    return [a for a in alerts if a["labels"]["alertname"] == alert]


def log_size(fleet: F.Fleet, host: str) -> int:
    return int(fleet.lab.exec(host, ["stat", "-c", "%s", ACCESS_LOG]).stdout)


def ocr_lines(fleet: F.Fleet, host: str, offset: int) -> list[dict]:
    """POST /v1/ocr lines of the host's nginx access log from byte offset on, with start and end times."""
    text = fleet.lab.exec(host, ["tail", "-c", f"+{offset + 1}", ACCESS_LOG]).stdout
    out = []
    for m in filter(None, map(LINE.search, text.splitlines())):
        end = float(m["msec"])
        # One attempt per instance tried, in order: "127.0.0.1:8001, 127.0.0.1:8000" / "502, 200".
        attempts = list(zip(m["up"].split(", "), m["us"].split(", "), strict=False))
        out.append({"rid": m["rid"], "status": int(m["status"]), "start": end - float(m["rt"]), "end": end,
                    "attempts": attempts})  # fmt: skip
    return out


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


@pytest.fixture(scope="session")
def fleet(tmp_path_factory):
    F.require_wheelhouse()
    state = tmp_path_factory.mktemp("fleet")
    start = time.monotonic()
    try:
        # `make demo`'s own script brings the fleet up: the demo is tested here.
        demo = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "demo.py"), "--state", str(state), "--lab", LAB,
             "up", "--apps", str(APPS), "--dbs", str(DBS), "--lbs", str(LBS)],
            capture_output=True, text=True, timeout=BRING_UP_S,
        )  # fmt: skip
        assert demo.returncode == 0, demo.stdout[-4000:] + demo.stderr[-2000:]
        fl = F.load(LAB, state)
        for expected in ("invoice No. 2048", "Ada Lovelace", f"Load balancer: {fl.lb_url}", fl.key):
            assert expected in demo.stdout, demo.stdout[-3000:]
        say(
            f"scripts/demo.py: {APPS} app hosts + {LBS} load balancers + 1 monitoring + {DBS} database hosts "
            f"up in {time.monotonic() - start:.0f} s"
        )
        yield fl
    finally:
        F.down(LAB)
