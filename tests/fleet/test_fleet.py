"""The fleet scenario (`make test-fleet`): rolling upgrades through a load balancer under load, in the lab.

3 app hosts + 1 HAProxy host converge site.yml (the CPU engine's models as an ocr_model revision). A load
generator sends OCR requests with real documents to the load balancer while playbooks/upgrade.yml rolls a new
app version and a new model revision through the fleet (app-1 first, as a canary: a quarter then half of the
requests while the other hosts replay every request they answer to it and compare the texts; promoted; a
bulk job submitted once the release is staged is read through app-1's drain and restart, by every host
(300 pages or more: as many as the fleet reads in about 4 minutes at the pace a smaller job was read at while
the release staged), and must come back whole: `job_pages_lost=0 job_pages_duplicated=0 pages=N`, each host's
share printed, with each host's time out of service and the time between batches). The three faulty rollouts
that follow run on the smallest fleet that shows them, the canary and one host beside it (app-1 and app-3,
upgrade.yml --limit), while app-2 keeps serving the good release: a newer release with a deliberately
broken model revision (its files match their manifest, it passes its self-test and reads the golden document,
but its dictionary reads capitals the golden document lacks as others, so the evaluation gate, an evaluation
set read before and after the first host's switch, finds it worse): the first host must be rolled back to the
good release and model, the play must stop, the fleet must keep serving the good version, and no request may
fail in either rollout.
Then the newer release with a revision that misreads capitals only the load's documents have: it passes the
smoke test and the default evaluation (the golden document), and the canary's comparison with the other hosts'
answers rolls it back, with no failed request (each prints `canary_compared_requests=N canary_text_diff=X%
canary_verdict=promote|rollback`).
Then a fourth rollout (the newer release, already staged by the broken one, with the good model) has its
control node die (ansible-playbook and its workers killed) while app-1 is drained: app-1 stays out of the
pool, and a plain re-run of upgrade.yml brings it back and finishes the rollout, installing nothing again. No
output of any run may hold the fleet's API key (the smoke test sends it). Each staging copies only what the
hosts lack: the new app wheel (and a cached wheel damaged on purpose), the changed model files (the others
are hard-linked from the installed revision). Prints `failed_requests=F
total_requests=N` once, for the whole scenario, and `model_upgrade: ...`.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import string
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from lab import fleet as F
from lab.base import wait_until
from tests.docs import encode, render
from tests.fleet.conftest import (
    MULTI,
    MULTI_INSTANCES,
    ROOT,
    current_release,
    instances,
    lb_servers,
    say,
    task_order,
)
from tests.fleet.jobs import FleetJob, document
from tests.fleet.load import Load
from tests.fleet.releases import derive_wheelhouse
from tests.models import misreading_revision

pytestmark = [pytest.mark.lab, pytest.mark.timeout(3600)]

MIN_REQUESTS = 500
# A bulk job worked through the good upgrade (tests/fleet/jobs.py): submitted once the release is staged, its
# pages heavy enough (filler lines) and many enough that it is still being read when the canary host is back
# in, 114-146 s after the submit so far. How many: a pace job of PACE_PAGES, sent as the rollout starts, is
# read while the release stages; the job gets as many pages as that pace reads in JOB_TARGET_S, at least
# JOB_PAGES (a slow machine's 300 pages took 450 s) and at most JOB_PAGES_MAX (a fast one read 300 in 114 s:
# a fixed count ended 0.1 s before app-1 was back in).
JOB_PAGES, JOB_PAGES_MAX, PACE_PAGES = 300, 1000, 48
JOB_TARGET_S = 240
JOB_FILLER = 8  # 9 lines a page, about 0.4 CPU-s of OCR: the job outlasts app-1's drain
DRAIN_TASKS = ("Write the drain file", "Remove the drain file")  # the ocr_app role's drain and undrain
DRAIN_FILE = "/run/ocr-app/drain"
MODEL_ROOT = "/var/lib/ocr-app/models"  # ocr_model_root's default
MODEL = F.lab_model()[0]
# The gate's evaluation set: pages full of capitals. The broken revision misreads the capitals the golden
# document lacks, so it passes the smoke test and only the evaluation catches it.
EVAL_PAGES = {
    "invoice": ["INVOICE No. 2048 FROM BERLIN", "PAYMENT DUE BY 31 MAY 1843", "Dear Ada Lovelace"],
    "letter": ["ANALYTICAL ENGINE COMPANY", "Charles Babbage, London", "Bernoulli numbers, Note G"],
}
GOLDEN = (ROOT / "roles" / "ocr_app" / "files" / "smoke" / "golden.txt").read_text()
MISREAD = "".join(c for c in string.ascii_uppercase if c not in GOLDEN)
# The canary's revision misreads capitals of the load's documents (tests/fleet/load.py: OCRFLEET ROLLING
# UPGRADE) that neither the golden document nor the words and numbers the load checks have: the smoke test and
# the default evaluation (the golden document) pass it, its clients get 200 with their word and number, and
# only the comparison with the old hosts' answers on the same documents finds it worse.
CANARY_MISREAD = "FLEUPA"
# A canary in two steps: a quarter of the requests, then half, 20 s each; every request the other hosts answer
# is replayed to it (the lab's load is small; production shares are smaller and steps longer).
CANARY = {
    "upgrade_canary_weight": 25,
    "upgrade_canary_steps": [50],
    "upgrade_canary_seconds": 20,
    "upgrade_canary_shadow_share": 100,
    "upgrade_canary_min_compared": 5,
    "upgrade_canary_min_requests": 3,
}
CANARY_MAP = "/etc/haproxy/ocrfleet-canary.map"  # ocr_lb_canary_map's default
SHADOW_FILE = "/run/ocr-app/shadow.json"  # ocr_app_shadow_file's default
CANARY_TEXTFILE = "/var/lib/prometheus/node-exporter/ocr_canary.prom"


def exists(fleet: F.Fleet, host: str, path: str) -> bool:
    return fleet.lab.exec(host, ["test", "-e", path], check=False).returncode == 0


def drained(fleet: F.Fleet, host: str) -> bool:
    return exists(fleet, host, DRAIN_FILE)


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


def current_model(fleet: F.Fleet, host: str) -> str:
    return fleet.lab.exec(host, ["readlink", f"{MODEL_ROOT}/{MODEL}/current"]).stdout.strip()


def ports(host: str) -> list[int]:
    return [8000 + i for i in range(instances(host))]


def units(host: str) -> list[str]:
    return [f"ocr-app@{port - 8000}.service" for port in ports(host)]


def invocations(fleet: F.Fleet, host: str) -> list[str]:
    """systemd's InvocationID of each instance: a new one for every start."""
    return fleet.lab.exec(
        host, ["systemctl", "show", "-p", "InvocationID", "--value", *units(host)]
    ).stdout.split()


def restart_windows(fleet: F.Fleet, host: str) -> list[tuple[int, int]]:
    """(stopped, active again) of each instance's last restart, in CLOCK_MONOTONIC microseconds (Type=notify:
    active at READY=1, its engine loaded)."""
    props = "InactiveEnterTimestampMonotonic,ActiveEnterTimestampMonotonic"
    out = fleet.lab.exec(host, ["systemctl", "show", "-p", props, *units(host)]).stdout
    blocks = [dict(line.split("=", 1) for line in b.split()) for b in out.strip().split("\n\n")]
    return [
        (int(b["InactiveEnterTimestampMonotonic"]), int(b["ActiveEnterTimestampMonotonic"])) for b in blocks
    ]


def results(r, task_prefix: str) -> dict[str, dict]:
    """Each host's result of the task whose name starts with task_prefix (one run of it per host)."""
    return {
        e["event_data"]["host"]: e["event_data"]["res"]
        for e in r.events
        if e.get("event") == "runner_on_ok" and e["event_data"]["task"].startswith(task_prefix)
    }


def drained_at(r) -> dict[str, list[float]]:
    """Unix times at which each host's drain file was written and removed in the run, in order."""
    at: dict[str, list[float]] = {}
    for e in r.events:
        if e.get("event") == "runner_on_ok" and e["event_data"]["task"] in DRAIN_TASKS:
            at.setdefault(e["event_data"]["host"], []).append(
                datetime.fromisoformat(e["created"]).timestamp()
            )
    return at


def packed_files(r) -> dict[str, list[str]]:
    """Each host's files in the tar of the wheels it lacked (the ocr_app role's wheel cache), sorted."""
    return {
        h: sorted(Path(a).name for a in res["archived"]) for h, res in results(r, "Pack the wheels").items()
    }


def messages(r, task_prefix: str) -> list[str]:
    """The msg of every result (ok or failed) of the tasks whose names start with task_prefix, in order."""
    return [
        e["event_data"]["res"].get("msg", "")
        for e in r.events
        if e.get("event") in ("runner_on_ok", "runner_on_failed")
        and e["event_data"]["task"].startswith(task_prefix)
    ]


def canary_figures(verdict: str) -> str:
    """The issue's line for a canary run, from its verdict message."""
    m = re.search(r"canary verdict: (promote|rollback) \((\d+) compared, text difference ([\d.]+) %", verdict)
    assert m, verdict
    return f"canary_compared_requests={m[2]} canary_text_diff={m[3]}% canary_verdict={m[1]}"


def canary_ended(fleet: F.Fleet) -> None:
    """No canary left behind: every server at its configured weight, the share map empty, no replays, no
    figures for Prometheus."""
    weights = {h: row["weight"] for h, row in lb_servers(fleet).items() if h in fleet.apps}
    assert len(set(weights.values())) == 1 and "0" not in weights.values(), weights
    shares = fleet.lab.exec(
        "lb-1", ["socat", "stdio", "/run/haproxy/admin.sock"], input=f"show map {CANARY_MAP}\n"
    )
    assert shares.stdout.strip() == "", shares.stdout
    for h in fleet.apps:
        for path in (SHADOW_FILE, CANARY_TEXTFILE):
            assert fleet.lab.exec(h, ["test", "-e", path], check=False).returncode != 0, f"{path} left on {h}"


def pair(fleet: F.Fleet) -> list[str]:
    """The smallest fleet a faulty rollout needs: the canary (the rollout's first host) and one host beside
    it to compare with and to stay untouched: app-1 and the last app host (upgrade.yml --limit). The other app
    host stays on the release the good rollout left, serving beside them."""
    return [fleet.apps[0], fleet.apps[-1]]


def failed_rollout(fleet: F.Fleet, load: Load, runs: list, what: str, extravars: dict, task: str):
    """Run upgrade.yml on pair(fleet) where it must fail: app-1's `task` fails and the rescue rolls it back.
    The run and its last message (`app-1: Stop the rollout: ...`)."""
    t0 = time.monotonic()
    r = fleet.playbook("playbooks/upgrade.yml", extravars, check=False, limit=pair(fleet))
    runs.append(r)
    say(f"{what}: rc {r.rc} in {time.monotonic() - t0:.0f} s, {load.total} requests")
    assert r.rc != 0, f"{what}: the rollout succeeded"
    assert not load.exhausted, "the load ended before the rollout did"
    failed = F.failures(r)
    assert any(f.startswith(f"app-1: {task}") for f in failed), failed
    stop = [f for f in failed if f.startswith("app-1: Stop the rollout")]
    assert stop, failed
    return r, stop[0]


def served_model(fleet: F.Fleet, host: str) -> str:
    """The revision every instance of the host reports in /healthz (`<name>@<revision> (rapidocr ...)`)."""
    models = {fleet.host_health(host, port)["model"].split(" ")[0] for port in ports(host)}
    assert len(models) == 1, f"{host}'s instances serve {models}"
    return models.pop().removeprefix(f"{MODEL}@")


def test_rolling_upgrades_under_load(fleet, tmp_path):
    base = ROOT / "build" / "wheelhouse"
    old = current_release(fleet, "app-1")
    good, newer = f"{old}+fleet.2", f"{old}+fleet.3"  # local versions sort after the release they patch
    good_wh = derive_wheelhouse(base, tmp_path / "good", good)
    newer_wh = derive_wheelhouse(base, tmp_path / "newer", newer)
    # Model revisions on the controller: the inventory's first, the same files under a new revision, and a
    # copy whose dictionary reads capitals the golden document lacks as others (its manifest written for it:
    # checksums match).
    first_model = F.lab_model()[1]
    good_model, bad_model, canary_model = "wheel-2", "wheel-3-misreading", "wheel-4-misreading-caps"
    F.require_model(good_model)
    for revision, letters in ((bad_model, MISREAD), (canary_model, CANARY_MISREAD)):
        out = F.MODELS / MODEL / revision
        shutil.rmtree(out, ignore_errors=True)
        misreading_revision(F.require_model(), out, out.parent / f"{revision}.json", letters=letters)
    eval_dir = tmp_path / "eval"
    eval_dir.mkdir()
    for name, lines in EVAL_PAGES.items():
        (eval_dir / f"{name}.png").write_bytes(encode(render(lines, size=32, width=900).image, "PNG"))
        (eval_dir / f"{name}.txt").write_text("\n".join(lines) + "\n")
    gate = {"ocr_app_eval_dir": str(eval_dir), "ocr_app_eval_repeat": 1}
    for h in fleet.apps:
        assert (current_model(fleet, h), served_model(fleet, h)) == (first_model, first_model), h
    assert {lb_servers(fleet)[h]["status"] for h in fleet.apps} == {"UP"}

    runs = []  # every ansible-runner run of the scenario: none may print the API key
    # Two workers, each starting a request at most once a second: requests reach every host through each
    # drain, restart and rejoin, and the playbooks keep the cores they need (tests/fleet/load.py).
    load = Load(fleet.client, concurrency=2, interval_s=1.0).start()
    try:
        # --- a good version (release and model revision), through the whole fleet, canaried on app-1 ----
        started = invocations(fleet, MULTI)
        extravars = {
            "ocr_app_wheelhouse_dir": str(good_wh),
            "ocr_model_revision": good_model,
            **gate,
            **CANARY,
        }
        # A bulk job through the switches: submitted once every host has staged the release (the drains come
        # next), so that the first host is drained with ranges leased and restarted while the others read on.
        # The ocr_app role's mark of a whole release, its last staging step.
        staged = f"/opt/ocr-app/releases/{good}/.ocr-app-release"
        done: list = []
        rollout = threading.Thread(
            target=lambda: done.append(fleet.playbook("playbooks/upgrade.yml", extravars, check=False))
        )
        t0, t0_wall = time.monotonic(), time.time()
        rollout.start()
        pace = FleetJob.submit(fleet, PACE_PAGES, key=f"fleet-pace-{int(t0_wall)}", filler=JOB_FILLER)
        try:
            wait_until(
                lambda: not rollout.is_alive() or all(exists(fleet, h, staged) for h in fleet.apps),
                1800, "the release staged on every host", 0.5,
            )  # fmt: skip
            pages = pace.sized(JOB_TARGET_S, JOB_PAGES, JOB_PAGES_MAX)
            body = document(pages, JOB_FILLER)
            submitted = time.time()
            job = FleetJob.send(fleet, body, pages, key=f"fleet-upgrade-{int(submitted)}")
        finally:
            rollout.join(1800)
        assert done, "upgrade.yml did not end"
        r = done[0]
        runs.append(r)
        drains = drained_at(r)
        say(
            f"upgrade to {good} and model {good_model}: rc {r.rc} in {time.monotonic() - t0:.0f} s, "
            f"{load.total} requests so far"
        )
        assert r.rc == 0, F.failures(r)
        # Each host out of service for the batch only (drain -> switch -> restart -> smoke -> undrain); the
        # staging came before, on every host at once.
        batches = [(h, *drains[h]) for h in fleet.apps]
        say(
            f"rollout: staged on {len(batches)} hosts in {batches[0][1] - t0_wall:.0f} s; drained "
            + ", ".join(f"{h} {back - out:.0f} s" for h, out, back in batches)
            + "; between batches "
            + ", ".join(f"{b[1] - a[2]:.0f} s" for a, b in itertools.pairwise(batches))
        )
        assert not load.exhausted, "the load ended before the rollout did"
        for h in fleet.apps:
            assert current_release(fleet, h) == good, h
            assert fleet.host_health(h)["version"] == good, h
            assert (current_model(fleet, h), served_model(fleet, h)) == (good_model, good_model), h
        # One host at a time: each host is back in the pool before the next one is drained.
        order = task_order(r, "Switch the fleet")
        # The ocr_app role's drain and undrain entry points, by their tasks.
        steps = [order.index((h, task)) for h in fleet.apps for task in DRAIN_TASKS]
        assert steps == sorted(steps), order
        # The first host read the evaluation set before its switch and after its smoke test; no other did.
        assert [h for h, t in order if t == "Check the evaluation"] == ["app-1", "app-1"], order
        say(f"evaluation gate, good version: {results(r, 'Check the evaluation')['app-1']['msg']}")
        # The canary: both steps on app-1, its figures published, promoted; then the next host.
        steps = messages(r, "Canary | report the step")
        assert [m.split(":")[0] for m in steps] == ["canary app-1 step 1/2", "canary app-1 step 2/2"], steps
        assert "25 % of the requests" in steps[0] and "50 % of the requests" in steps[1], steps
        assert steps[0].endswith("decision: go on to 50 %") and steps[1].endswith("decision: promote"), steps
        for m in steps:
            say(m)
        assert results(r, "Canary | publish the step's figures")["app-1"].get("changed"), (
            "no figures published"
        )
        verdict = messages(r, "Canary | report the verdict")
        assert len(verdict) == 1 and "canary verdict: promote" in verdict[0], verdict
        canary_ended(fleet)
        print(canary_figures(verdict[0]))
        # And on the 2-instance host, one instance at a time: each stopped only once the one before it was
        # active again.
        restarted = invocations(fleet, MULTI)
        assert len(restarted) == MULTI_INSTANCES and not set(started) & set(restarted), (started, restarted)
        windows = sorted(restart_windows(fleet, MULTI))
        assert all(windows[i][1] <= windows[i + 1][0] for i in range(len(windows) - 1)), windows
        assert {lb_servers(fleet)[h]["status"] for h in fleet.apps} == {"UP"}
        # The hosts' wheel cache held the old release's wheels: only the new app wheel travelled.
        packed = packed_files(r)
        wheel = [w.name for w in good_wh.glob("ocr_app-*.whl")]
        assert packed == {h: sorted(["SHA256SUMS", "requirements.txt", *wheel]) for h in fleet.apps}, packed
        # The new model revision has the first one's files: all linked on each host, none copied.
        files = sorted(
            f["path"] for f in json.loads((F.MODELS / MODEL / f"{good_model}.json").read_text())["files"]
        )
        linked = {h: sorted(res["linked"]) for h, res in results(r, "Link the files").items()}
        assert linked == {h: files for h in fleet.apps}, linked
        st = job.wait_done(900)
        figures = job.check()
        shares, written = job.shares(), job.written()
        out_s = {h: "-".join(f"{t - submitted:.0f}" for t in ts) + " s" for h, ts in sorted(drains.items())}
        drained_1, back_1 = drains[fleet.apps[0]]
        after = sum(1 for h, t in written if h == fleet.apps[0] and t > back_1)
        say(
            f"job {job.job_id} through the upgrade: {st['pages']}, pages by host {shares}, written "
            f"{job.windows(submitted)} after its submit; hosts drained {out_s}; {fleet.apps[0]} read {after} "
            "after it was back in"
        )
        print(" ".join(f"{k}={v}" for k, v in figures.items()))
        assert figures == {"job_pages_lost": 0, "job_pages_duplicated": 0, "pages": pages}, figures
        pace.wait_done(300)
        assert pace.check() == {"job_pages_lost": 0, "job_pages_duplicated": 0, "pages": PACE_PAGES}
        # Submitted before the first drain, still read after that host was back in; every host read some.
        assert submitted < drained_1 < back_1 < written[-1][1], (submitted, drains, written[-1])
        assert sorted(shares) == sorted(fleet.apps) and all(n > 0 for n in shares.values()), shares
        after_good = load.total

        # --- a broken model revision (with a newer release): the first host's evaluation fails -----------
        # This and the next two rollouts run on the canary and one host beside it (pair()).
        pair_hosts, left = pair(fleet), [h for h in fleet.apps if h not in pair(fleet)]
        untouched = {h: invocations(fleet, h) for h in fleet.apps[1:]}
        # A cached wheel damaged on the last host: its copy must not be trusted, so that wheel travels again.
        damaged = next(w.name for w in base.glob("*.whl") if not w.name.startswith("ocr_app-"))
        fleet.lab.exec(fleet.apps[-1], ["truncate", "-s", "-1", f"/opt/ocr-app/wheels/{damaged}"])
        extravars = {"ocr_app_wheelhouse_dir": str(newer_wh), "ocr_model_revision": bad_model, **gate}
        what = f"broken upgrade to {newer} and model {bad_model}"
        r, stop = failed_rollout(fleet, load, runs, what, extravars, "Check the evaluation")
        # The golden document still read right; the evaluation set's capitals did not.
        assert "failed the evaluation: CER" in stop and "the baseline's" in stop, stop
        assert f"rolled back to {good};" in stop, stop  # the release it runs again, by name
        order = task_order(r, "Switch the fleet")
        assert ("app-1", "Check the smoke test's text") in order, order
        say(f"evaluation gate, broken revision: {stop}")
        assert {h for h, _ in order} == {"app-1"}, "hosts after the failed one were touched"
        # Staging the release and the model restarted nothing on the hosts it never switched.
        assert {h: invocations(fleet, h) for h in fleet.apps[1:]} == untouched
        # Staged on the pair, switched nowhere: the failed host is back on the good release and model; the
        # host outside the limit got nothing.
        for h in fleet.apps:
            assert current_release(fleet, h) == good, h
            assert fleet.host_health(h)["status"] == "ready", h
            assert (current_model(fleet, h), served_model(fleet, h)) == (good_model, good_model), h
            for staged in (f"/opt/ocr-app/releases/{newer}", f"{MODEL_ROOT}/{MODEL}/{bad_model}"):
                found = fleet.lab.exec(h, ["test", "-d", staged], check=False)
                assert (found.returncode == 0) == (h in pair_hosts), (staged, h, found.returncode)
        assert {lb_servers(fleet)[h]["status"] for h in fleet.apps} == {"UP"}
        assert load.total > after_good
        packed = packed_files(r)
        wheels = ["SHA256SUMS", "requirements.txt", *(w.name for w in newer_wh.glob("ocr_app-*.whl"))]
        assert packed == {h: sorted(wheels + [damaged] * (h == fleet.apps[-1])) for h in pair_hosts}, packed
        # Only the dictionary differs from the good revision: the weights were linked, not copied again.
        linked = {h: sorted(res["linked"]) for h, res in results(r, "Link the files").items()}
        assert linked == {h: [f for f in files if f != "rec_keys.txt"] for h in pair_hosts}, linked

        # --- a revision that reads the load's pages worse: caught by the canary's comparison, rolled back --
        # The newer release (staged by the broken rollout) with a revision the smoke test and the default
        # evaluation (the golden document) pass: only the old hosts' answers on live documents tell.
        untouched = {h: invocations(fleet, h) for h in fleet.apps[1:]}
        failed_before = load.failed
        extravars = {"ocr_app_wheelhouse_dir": str(newer_wh), "ocr_model_revision": canary_model, **CANARY}
        what = f"canary of {newer} and model {canary_model}"
        r, stop = failed_rollout(fleet, load, runs, what, extravars, "Canary | judge the step")
        assert "canary verdict: rollback" in stop, stop
        assert "answers differ from those of the other hosts" in stop, stop
        assert f"rolled back to {good};" in stop, stop
        steps = messages(r, "Canary | report the step")
        for m in steps:
            say(m)
        assert "decision: rollback: its answers differ" in steps[-1], steps
        say(f"canary, misreading revision: {stop}")
        # Its evaluation passed: the golden document has none of the capitals it misreads.
        assert "app-1" in results(r, "Check the evaluation"), F.failures(r)
        assert {h for h, _ in task_order(r, "Switch the fleet")} == {"app-1"}, (
            "hosts after the canary were touched"
        )
        assert {h: invocations(fleet, h) for h in fleet.apps[1:]} == untouched
        for h in fleet.apps:
            assert current_release(fleet, h) == good, h
            assert fleet.host_health(h)["status"] == "ready", h
            assert (current_model(fleet, h), served_model(fleet, h)) == (good_model, good_model), h
        assert {lb_servers(fleet)[h]["status"] for h in fleet.apps} == {"UP"}
        canary_ended(fleet)
        # Its clients got 200 with the word and number they sent: no request failed while it served.
        assert load.failed == failed_before, load.first_failures
        print(canary_figures(stop))

        # --- an interrupted rollout: the control node dies while app-1 is drained; a re-run finishes it ----
        # The newer release, this time with the good model: the broken rollout staged it everywhere, so this
        # one finds it complete and copies nothing (a staged release is reused, not installed again).
        resumed, resumed_wh = newer, newer_wh
        victim, after = pair_hosts
        extravars = {"ocr_app_wheelhouse_dir": str(resumed_wh), "ocr_model_revision": good_model, **gate}
        killed: list = []
        rollout = threading.Thread(
            target=lambda: killed.append(
                fleet.playbook("playbooks/upgrade.yml", extravars, check=False, limit=pair_hosts)
            )
        )
        rollout.start()
        try:
            wait_until(
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
        wait_until(lambda: lb_servers(fleet)[victim]["status"] != "UP", 60, f"{victim} out of pool", 0.5)
        assert current_release(fleet, after) != resumed, "the rollout went past the drained host"

        t0 = time.monotonic()
        r = fleet.playbook("playbooks/upgrade.yml", extravars, check=False, limit=pair_hosts)
        runs.append(r)
        rerun_s = time.monotonic() - t0
        assert r.rc == 0, F.failures(r)
        installs = [
            (h, t) for run in (killed[0], r) for h, t in task_order(run, "Check the fleet")
            if t == "Install the app and its dependencies from the wheelhouse"
        ]  # fmt: skip
        assert installs == [], "the staged release was installed again"
        assert not load.exhausted, "the load ended before the rollout did"
        for h in fleet.apps:
            release = resumed if h in pair_hosts else good  # the host outside the limit stays as it was
            assert current_release(fleet, h) == release, h
            health = fleet.host_health(h)
            assert (health["version"], health["status"]) == (release, "ready"), h
            assert not drained(fleet, h), f"{h} still has its drain file"
            assert served_model(fleet, h) == good_model, h
        assert {lb_servers(fleet)[h]["status"] for h in fleet.apps} == {"UP"}
        print(f"interrupted_upgrade: killed during {victim} drained; rerun rc={r.rc} in {rerun_s:.0f} s")
        print(
            f"model_upgrade: {MODEL} {first_model} -> {good_model} on {len(fleet.apps)} hosts; "
            f"{bad_model} rolled back on app-1 (its evaluation misread), staged only on {pair_hosts[1]}; "
            f"{left} left on {good}"
        )

        # The smoke test sends the fleet's key: no event and no stdout of any run may hold it in clear.
        for run in runs:
            assert fleet.key not in " ".join(run.config.command), "a command line holds the API key"
            assert fleet.key not in run.stdout.read(), "a playbook's output holds the API key"
            for e in run.events:
                assert fleet.key not in json.dumps(e), f"event {e.get('event')} of a run holds the API key"
    finally:
        load.finish(MIN_REQUESTS)
    load.check(MIN_REQUESTS)
