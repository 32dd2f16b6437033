"""The series the alert rules select, checked against real scrapes.

promtool's unit tests (files/prometheus/ocrfleet-alerts.test.yml) feed the rules hand-written series, so a
metric renamed in the app, or one HAProxy's exporter does not have, passes them while its alert can never
fire. `missing()` compares what the rules select (parsed with promql-parser) with a real exposition text.

As a command (for Molecule verify steps): python -m tests.alert_metrics SOURCE [FILE] - exits 1 listing what
the rules select from SOURCE that FILE (default: standard input) does not export.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import promql_parser
import yaml
from prometheus_client.parser import text_string_to_metric_families

RULES = Path(__file__).resolve().parents[1] / "files" / "prometheus" / "ocrfleet-alerts.yml"
# The sample names a family of each type exposes (prometheus_client drops `_total` from a counter's name).
_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}


# Who exports what, by metric name prefix (the longest match wins). process_*: every exporter has them; the
# rules that read them keep the app's targets only (`and on (job, instance) ocr_build_info`).
SOURCES = {
    "ocr_": "app",
    "process_": "app",
    "ocr_gpu_": "gpu_metrics",
    "ocr_lb_": "keepalived",
    "ocr_pgbackrest_": "pgbackrest",
    "haproxy_": "haproxy",
    "node_": "node",
    "pg_": "postgres",
    "patroni_": "patroni",
    "etcd_": "etcd",
    "up": "prometheus",
}


def source_of(metric: str) -> str | None:
    prefixes = [p for p in SOURCES if metric == p or (p.endswith("_") and metric.startswith(p))]
    return SOURCES[max(prefixes, key=len)] if prefixes else None


@dataclass(frozen=True)
class Selector:
    alert: str
    metric: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, op, value); op "Equal" fixes the value


def selectors(rules: Path = RULES) -> list[Selector]:
    out = []
    for group in yaml.safe_load(rules.read_text())["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert") or rule["record"]
            found: list = []
            promql_parser.walk(promql_parser.parse(rule["expr"]), found.append)
            for node in found:
                if isinstance(node, promql_parser.VectorSelector):
                    ms = node.matchers.matchers
                    ops = tuple((m.name, str(m.op).rsplit(".", 1)[-1], m.value) for m in ms)
                    out.append(Selector(name, node.name, ops))
    return out


def exported(text: str) -> dict[str, list[dict[str, str]]]:
    """Sample name -> the label sets of its samples (empty for a family declared without samples yet), each
    under the name the text gives it, which is the one Prometheus stores: prometheus_client's parser calls a
    counter's samples `<name>_total` even where the text writes `<name>` (PostgreSQL's exporter does)."""
    lines = [line for line in text.splitlines() if line and line[0] != "#"]
    written = {line.split("{", 1)[0].split(" ", 1)[0] for line in lines}
    out: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for suffix in _SUFFIXES.get(family.type, ("",)):
            out.setdefault(family.name + suffix, [])
        for sample in family.samples:
            name = sample.name
            if name not in written and name.endswith("_total") and name.removesuffix("_total") in written:
                name = name.removesuffix("_total")
            out.setdefault(name, []).append(sample.labels)
    return out


def missing(text: str, source: str, rules: Path = RULES) -> list[str]:
    """What the rules select from `source` that `text` lacks: the metric, a label it matches on, or (for an
    equality matcher) a series with that exact value; regex matchers pick values that come with faults."""
    series = exported(text)
    problems = []
    for sel in selectors(rules):
        if source_of(sel.metric) != source:
            continue
        if sel.metric not in series:
            problems.append(f"{sel.alert}: {sel.metric} is not exported")
            continue
        for label, op, value in sel.matchers:
            if not any(label in s for s in series[sel.metric]):
                problems.append(f"{sel.alert}: {sel.metric} has no label {label!r}")
            elif op == "Equal" and not any(s.get(label) == value for s in series[sel.metric]):
                problems.append(f"{sel.alert}: no {sel.metric}{{{label}={value!r}}} series")
    return problems


if __name__ == "__main__":
    source, where = sys.argv[1], (sys.argv[2:] or ["-"])[0]
    gaps = missing(sys.stdin.read() if where == "-" else Path(where).read_text(), source)
    print("\n".join(gaps) or f"every {source} series the alert rules select is exported")
    sys.exit(1 if gaps else 0)
