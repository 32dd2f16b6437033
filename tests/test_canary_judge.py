"""The canary's judgement of a step (playbooks/tasks/canary-judge.yml), the margins' one rule, run by
ansible-runner on local hosts from the figures a step reads (the load balancers' `ocr_lb_traffic`, the other
hosts' replay counters before and after): each scenario a host of one run. The fleet test runs it for real
(a good revision promoted, a misreading one rolled back); here every margin, the evidence, a restarted
instance's counters and the figures for Prometheus, in seconds."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import ansible_runner
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
JUDGE = ROOT / "playbooks" / "tasks" / "canary-judge.yml"


def lb(requests: int, errors: int, p99: int) -> dict:
    return {
        "requests": requests,
        "errors": errors,
        "error_rate_pct": round(100 * errors / requests, 2),
        "p99_ms": p99,
    }


def replays(compared=0, failed=0, chars=0, edits=0) -> dict:
    return {
        "compared": compared,
        "failed": failed,
        "busy": 0,
        "skipped": 0,
        "reference_chars": chars,
        "edits": edits,
    }


ZERO = replays()
QUIET = {"canary": lb(10, 0, 1500), "rest": lb(30, 0, 1400)}
# Two steps (25 %, 50 %), each: what the LBs served, the replay counters before and after.
SCENARIOS = {
    "promote": [(QUIET, ZERO, replays(6, 0, 228)), (QUIET, replays(6, 0, 228), replays(12, 0, 456))],
    "misreads": [
        (QUIET, ZERO, replays(6, 0, 228, 52)),
        (QUIET, replays(6, 0, 228, 52), replays(12, 0, 456, 104)),
    ],
    "fails": [({"canary": lb(10, 1, 900), "rest": lb(30, 0, 1400)}, ZERO, replays(6, 1, 228))],
    "slow": [({"canary": lb(10, 0, 4500), "rest": lb(30, 0, 1400)}, ZERO, replays(6, 0, 228))],
    "too_little": [(QUIET, ZERO, replays(2, 0, 76)), (QUIET, replays(2, 0, 76), replays(3, 0, 114))],
    # app-2's instances restarted between the reads: their counters start from 0 again.
    "restarted": [(QUIET, ZERO, replays(12, 0, 456)), (QUIET, replays(12, 0, 456), replays(4, 0, 152))],
}
PLAY = [
    {
        "hosts": "all",
        "gather_facts": False,
        "vars_files": [str(ROOT / "playbooks" / "vars" / "upgrade.yml")],
        "vars": {"upgrade_canary_weight": 25, "upgrade_canary_steps": [50], "upgrade_canary_seconds": 20},
        "tasks": [
            {
                "ansible.builtin.stat": {"path": "{{ gpu_metrics_textfile_dir }}"},
                "register": "_upgrade_canary_textfile_dir",
            },
            {
                "ansible.builtin.set_fact": {
                    "_upgrade_canary_totals": {"compared": 0, "reference_chars": 0, "edits": 0, "requests": 0}
                }
            },
            {
                "name": "steps",
                "ansible.builtin.include_tasks": str(JUDGE),
                "loop": "{{ steps | map(attribute='0') | list }}",
                "loop_control": {"loop_var": "_step", "index_var": "_upgrade_canary_index"},
                "vars": {
                    "_upgrade_canary_share": "{{ _upgrade_canary_shares[_upgrade_canary_index] }}",
                    "ocr_lb_traffic": "{{ _step }}",
                    "_upgrade_canary_before": "{{ steps[_upgrade_canary_index][1] }}",
                    "ocr_app_shadow_counts": "{{ steps[_upgrade_canary_index][2] }}",
                },
            },
        ],
    }
]


@pytest.fixture(scope="module")
def judged(tmp_path_factory) -> dict[str, dict]:
    """Each scenario's step lines, its failure (or None) and its Prometheus textfile."""
    tmp = tmp_path_factory.mktemp("judge")
    hosts = {
        name: {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "gpu_metrics_textfile_dir": str(tmp / name),
            "steps": steps,
            # The lab's margins: 1 point of errors, p99 x 1.5, 1 % of the text; evidence 10 and 10.
            "upgrade_canary_min_compared": 10,
            "upgrade_canary_min_requests": 10,
        }
        for name, steps in SCENARIOS.items()
    }
    for name in [*hosts, "runner"]:
        (tmp / name).mkdir()
    (tmp / "play.yml").write_text(yaml.safe_dump(PLAY))
    r = ansible_runner.run(
        private_data_dir=str(tmp / "runner"),
        playbook=str(tmp / "play.yml"),
        inventory={"all": {"hosts": hosts}},
        quiet=True,
        envvars={"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )
    out = {name: {"steps": [], "failed": None, "prom": ""} for name in hosts}
    for e in r.events:
        d = e.get("event_data", {})
        if e.get("event") == "runner_on_ok" and d.get("task") == "Canary | report the step":
            out[d["host"]]["steps"].append(d["res"]["msg"])
        if e.get("event") == "runner_on_failed":
            out[d["host"]]["failed"] = f"{d['task']}: {d['res'].get('msg')}"
    for name in hosts:
        prom = tmp / name / "ocr_canary.prom"
        out[name]["prom"] = prom.read_text() if prom.exists() else ""
    return out


def test_a_step_within_the_margins_goes_on_and_the_last_promotes(judged):
    s = judged["promote"]
    assert s["failed"] is None, s
    assert s["steps"][0].endswith("decision: go on to 50 %") and s["steps"][1].endswith(
        "decision: promote"
    ), s
    assert "12 compared so far, text difference 0.00 %" in s["steps"][1], s
    assert 'ocr_canary_share_percent{host="promote"} 50' in s["prom"]
    assert 'ocr_canary_compared_requests{host="promote"} 12' in s["prom"]
    assert 'ocr_canary_p99_seconds{host="promote",group="canary"} 1.5' in s["prom"]


def test_answers_that_differ_roll_back_at_the_first_step(judged):
    s = judged["misreads"]
    assert len(s["steps"]) == 1, s
    assert s["failed"].startswith(
        "Canary | judge the step against the other hosts: canary verdict: rollback "
    ), s
    assert "(6 compared, text difference 22.81 %) at step 1 (25 %)" in s["failed"], s
    assert "its answers differ from those of the other hosts by 22.81 % of the characters" in s["failed"], s
    assert 'ocr_canary_text_diff_ratio{host="misreads"} 0.2281' in s["prom"]


def test_errors_count_failed_replays_too(judged):
    s = judged["fails"]
    # 1 error of 10 served and 1 of 7 replays: 2 / 17 = 11.76 %, against 0 % + 1 point.
    assert "error rate 11.76 %, the other hosts 0.00 %" in s["failed"], s
    assert "p99" not in s["failed"].split(": ", 2)[2], s


def test_a_slow_canary_rolls_back(judged):
    assert (
        "p99 4500 ms, the other hosts 1400 ms (upgrade_canary_max_p99_ratio 1.5)" in judged["slow"]["failed"]
    )


def test_too_little_traffic_is_no_promotion(judged):
    s = judged["too_little"]
    assert s["steps"][0].endswith("decision: go on to 50 %"), s
    assert (
        "too little traffic to judge it: 20 requests served (upgrade_canary_min_requests 10), 3 replays"
        in (s["failed"])
    ), s


def test_counters_of_a_restarted_instance_count_from_zero(judged):
    s = judged["restarted"]
    # The second step read 4 after 12: it counts nothing rather than minus 8.
    assert s["failed"] is None, s
    assert "replayed to it: 0 compared (0 failed, 0 busy, 0 skipped), 12 compared so far" in s["steps"][1], s
