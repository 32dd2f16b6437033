"""An instance that stays dead is alerted on (`make test-fleet`): OcrInstanceDown reaches the Alertmanager.

`kill -9` of app-2's second instance (ocr-app@1; the host still serves through the others, so only a
per-instance scrape sees it) with systemd's restart held off, then: the alert reaches mon-1's Alertmanager API
no sooner than the rule's `for:` (the lab inventory's 10 s, monitoring_alert_for, in place of the shipped 2
minutes) and no later than `for:` + one scrape and one evaluation interval after the kill; once the instance
is started again (from `systemctl start` returning, at READY=1) it leaves the active alerts within one scrape
+ one evaluation interval. Prints `alert_fired_after_s=S` and
`alert_resolved_after_s=S`.
"""

from __future__ import annotations

import json
import time

import pytest
import yaml

from lab.base import wait_until

from .conftest import MULTI, ROOT, firing, say

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

MON, HOST, UNIT = "mon-1", MULTI, "ocr-app@1.service"
INSTANCE = f"{HOST}:ocr-app@1"  # the monitoring role's instance label of that target
ALERT = "OcrInstanceDown"
PROMETHEUS = 9090  # the role's default, on mon-1's loopback
POLL_S = 1.0  # how often the test looks
SLACK_S = POLL_S + 0.5  # what it measures is late by up to one poll period and one poll (an exec on mon-1)
# A runtime drop-in (in /run, gone with the host) that keeps the killed instance dead: the failure modelled is
# an instance that does not come back (crash loop, start limit hit), not one that systemd restarts in seconds.
KEEP_DOWN = f"/run/systemd/system/{UNIT}.d/zz-test-keep-down.conf"
# The unit's back-off (OnFailure=, roles/ocr_app) would start it again after its delay: masked at runtime for
# the test, as an operator keeping an instance down stops it too (a dependency cannot be reset in a drop-in).
RETRY = "ocr-app-retry@1.service"


def seconds(duration: str) -> float:
    """A Prometheus duration of one unit (`2m`, `5s`, `1h`) in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    unit = "ms" if duration.endswith("ms") else duration[-1]
    return float(duration[: -len(unit)]) * units[unit]


def rule_for_s(fleet) -> float:
    """The alert's `for:` as Prometheus loaded it: the lab inventory's monitoring_alert_for, in place of the
    shipped rule's (which promtool's unit tests check in make lint)."""
    groups = get_json(fleet, PROMETHEUS, "/api/v1/rules?type=alert")["data"]["groups"]
    (rule,) = [r for g in groups for r in g["rules"] if r["name"] == ALERT]
    lab = yaml.safe_load((ROOT / "inventory/lab/group_vars/all/lab.yml").read_text())["monitoring_alert_for"]
    shipped = yaml.safe_load((ROOT / "files/prometheus/ocrfleet-alerts.yml").read_text())["groups"]
    (original,) = [r for g in shipped for r in g["rules"] if r.get("alert") == ALERT]
    assert rule["duration"] == seconds(lab[ALERT]) != seconds(original["for"]), (rule, lab, original)
    return float(rule["duration"])


def get_json(fleet, port: int, path: str):
    return json.loads(fleet.host_get(MON, port, path))


def active_alerts(fleet) -> list[dict]:
    return firing(fleet, ALERT)


def all_up(fleet) -> list[dict]:
    """Prometheus' active targets when every one is up, else []."""
    targets = get_json(fleet, PROMETHEUS, "/api/v1/targets?state=active")["data"]["activeTargets"]
    return targets if all(t["health"] == "up" for t in targets) else []


def target_health(fleet) -> str:
    targets = get_json(fleet, PROMETHEUS, "/api/v1/targets?state=active")["data"]["activeTargets"]
    (target,) = [t for t in targets if t["labels"]["instance"] == INSTANCE]
    return target["health"]


def main_pid(fleet) -> int:
    out = fleet.lab.exec(HOST, ["systemctl", "show", "-p", "MainPID", "--value", UNIT]).stdout
    return int(out)


def test_instance_down_alert_fires_and_resolves(fleet):
    for_s = rule_for_s(fleet)
    config = yaml.safe_load(get_json(fleet, PROMETHEUS, "/api/v1/status/config")["data"]["yaml"])["global"]
    scrape_s, eval_s = seconds(config["scrape_interval"]), seconds(config["evaluation_interval"])
    fire_budget = for_s + scrape_s + eval_s
    # Every target is up (every instance, node-exporter, HAProxy's exporter, themselves) and nothing alerts.
    targets = wait_until(lambda: all_up(fleet), 60, "every target up in Prometheus", POLL_S)
    assert {t["labels"]["job"] for t in targets} >= {"ocr-app", "node", "haproxy"}, targets
    assert INSTANCE in {t["labels"]["instance"] for t in targets}, targets
    assert active_alerts(fleet) == []

    pid = main_pid(fleet)
    assert pid > 0
    fleet.lab.exec(HOST, ["mkdir", "-p", KEEP_DOWN.rsplit("/", 1)[0]])
    fleet.lab.exec(HOST, ["tee", KEEP_DOWN], input="[Service]\nRestart=no\n")
    fleet.lab.exec(HOST, ["systemctl", "mask", "--runtime", RETRY])
    try:
        fleet.lab.exec(HOST, ["systemctl", "daemon-reload"])
        killed_at = float(
            fleet.lab.exec(
                HOST, ["python3", "-c", f"import os,time; os.kill({pid}, 9); print(time.time())"]
            ).stdout
        )

        fired = wait_until(lambda: active_alerts(fleet), fire_budget + 60, f"{ALERT} in Alertmanager", POLL_S)
        fired_after = time.time() - killed_at
        say(
            f"alert_fired_after_s={fired_after:.1f} "
            f"(for: {for_s:.0f} s, scrape {scrape_s:.0f} s, evaluation {eval_s:.0f} s)"
        )
        assert [(a["labels"]["instance"], a["labels"]["host"], a["labels"]["job"]) for a in fired] == [
            (INSTANCE, HOST, "ocr-app")
        ], fired
        assert fired[0]["status"]["state"] == "active", fired
        assert main_pid(fleet) == 0, "systemd restarted the instance: the drop-in did not hold it down"
        assert for_s <= fired_after <= fire_budget + SLACK_S, (fired_after, fire_budget)
    finally:
        fleet.lab.exec(HOST, ["rm", "-rf", KEEP_DOWN.rsplit("/", 1)[0]])
        fleet.lab.exec(HOST, ["systemctl", "unmask", "--runtime", RETRY])
        fleet.lab.exec(HOST, ["systemctl", "daemon-reload"])
        fleet.lab.exec(HOST, ["systemctl", "reset-failed", UNIT], check=False)
        # Type=notify: start returns once the instance loaded its engine and said READY=1.
        fleet.lab.exec(HOST, ["systemctl", "start", UNIT], timeout=300)
    started_at = time.time()

    wait_until(lambda: active_alerts(fleet) == [], scrape_s + eval_s + 60, f"{ALERT} resolved", POLL_S)
    resolved_after = time.time() - started_at
    say(f"alert_resolved_after_s={resolved_after:.1f}")
    assert resolved_after <= scrape_s + eval_s + SLACK_S, resolved_after
    assert target_health(fleet) == "up"
