"""`ocr-app eval`: an evaluation set read through the real service (rapidocr), its figures, and the gate
against a baseline report (what a release gate runs with the old version's report)."""

from __future__ import annotations

import json
import statistics

import pytest

from ocr_app.fleet.evaluation import percentile

from .docs import encode, pdf, render
from .test_cli import run

PAGES = {
    "invoice": ["Invoice No. 2048", "Total due 1337.50 EUR"],
    "letter": ["Dear Ada Lovelace", "Your analytical engine works"],
}


@pytest.fixture(scope="module")
def eval_set(tmp_path_factory):
    d = tmp_path_factory.mktemp("eval")
    (d / "invoice.png").write_bytes(encode(render(PAGES["invoice"]).image, "PNG"))
    (d / "letter.pdf").write_bytes(pdf([render(PAGES["letter"]).image]))
    for name, lines in PAGES.items():
        (d / f"{name}.txt").write_text("\n".join(lines) + "\n")
    (d / "README.md").write_text("no expected text beside it: not part of the set\n")
    return d


def report_of(r) -> dict:
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def test_the_set_is_read_and_measured(server, eval_set, tmp_path):
    out = tmp_path / "old.json"
    r = run("eval", eval_set, "--url", server.url, "--key", server.key, "--repeat", 2, "-o", out)
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert [d["name"] for d in report["documents"]] == ["invoice.png", "letter.pdf"]
    assert report["cer"] < 0.05, report  # the CPU engine reads rendered lines nearly perfectly
    assert report["requests"] == 4 and report["failed"] == [] and report["worse"] == []
    latencies = [ms for d in report["documents"] for ms in d["latencies_ms"]]
    # Nearest rank: p50 of 4 is the 2nd smallest (the lower median), p95 the 4th (ceil(3.8)).
    assert report["p50_ms"] == statistics.median_low(latencies) and report["p95_ms"] == max(latencies)
    assert "overall: CER" in r.stdout and "invoice.png" in r.stdout  # the table for people


@pytest.mark.parametrize(
    ("q", "rank"),
    [(0, 1), (25, 1), (26, 2), (50, 2), (51, 3), (75, 3), (76, 4), (95, 4), (100, 4)],
)
def test_a_percentile_is_the_nearest_rank(q, rank):
    # The rank-th smallest, rank = ceil(q / 100 * n) (at least 1), worked out by hand for n = 4; each step
    # between two ranks at the step and one point past it.
    assert percentile([40.0, 10.0, 30.0, 20.0], q) == [10.0, 20.0, 30.0, 40.0][rank - 1]


def test_a_percentile_of_twenty_and_of_one():
    twenty = [float(n) for n in range(20, 0, -1)]  # 20 .. 1: sorted by the function, not here
    assert [percentile(twenty, q) for q in (5, 6, 50, 90, 95, 96)] == [1.0, 2.0, 10.0, 18.0, 19.0, 20.0]
    assert percentile([7.0], 0) == percentile([7.0], 50) == percentile([7.0], 100) == 7.0


def test_a_worse_reading_fails_the_gate_against_the_baseline(server, eval_set, tmp_path):
    base = report_of(run("eval", eval_set, "--url", server.url, "--key", server.key, "--json"))
    (tmp_path / "baseline.json").write_text(json.dumps(base))
    # What the service reads no longer matches one document's truth: as a revision that misreads it would.
    worse_set = tmp_path / "set"
    worse_set.mkdir()
    for f in eval_set.iterdir():
        (worse_set / f.name).write_bytes(f.read_bytes())
    (worse_set / "invoice.txt").write_text("Invoice No. 9999\nTotal due 4242.00 USD\n")
    argv = ["eval", worse_set, "--url", server.url, "--key", server.key, "--json"]
    r = run(*argv, "--baseline", tmp_path / "baseline.json")
    report = report_of(r)
    assert r.returncode == 1
    assert report["cer"] > base["cer"] + 0.01
    assert "worse: CER" in r.stderr and "the baseline's" in r.stderr
    # A margin wide enough lets it through (the latency's too: this machine's load is not what is judged
    # here); --max-cer holds whatever the baseline.
    wide = ("--max-cer-increase", 100, "--max-latency-ratio", 1000)
    assert run(*argv, "--baseline", tmp_path / "baseline.json", *wide).returncode == 0
    r = run(*argv, "--max-cer", 1)
    assert r.returncode == 1 and "> 1.0%" in r.stderr


def test_a_slower_version_fails_the_latency_gate(server, eval_set, tmp_path):
    base = report_of(run("eval", eval_set, "--url", server.url, "--key", server.key, "--json"))
    fast = dict(base, p50_ms=base["p50_ms"] / 10)  # a baseline ten times faster than this service
    (tmp_path / "fast.json").write_text(json.dumps(fast))
    r = run("eval", eval_set, "--url", server.url, "--key", server.key, "--baseline", tmp_path / "fast.json")
    assert r.returncode == 1 and "p50 latency" in r.stderr and "at most 1.5x" in r.stderr


def test_documents_not_read_are_reported_and_fail(server, eval_set, tmp_path):
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)  # a PNG signature, no image
    (tmp_path / "broken.txt").write_text("anything\n")
    r = run("eval", tmp_path, "--url", server.url, "--key", server.key, "--json")
    report = report_of(r)
    assert r.returncode == 1 and report["failed"] == ["broken.png"]
    (doc,) = report["documents"]
    assert doc["error"].startswith("HTTP 400 invalid_image") and doc["cer"] == 1.0
    assert "not read: broken.png" in r.stderr
    r = run("eval", eval_set, "--url", server.url, "--key", "wrong", "--json")
    assert r.returncode == 1 and "HTTP 401" in r.stdout


def test_bad_sets_and_baselines_are_refused_clearly(tmp_path, eval_set):
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run("eval", empty, "--url", "http://127.0.0.1:9")
    assert r.returncode == 2 and "no document with its expected text" in r.stderr
    (tmp_path / "junk.dat").write_bytes(b"plain bytes")
    (tmp_path / "junk.txt").write_text("x")
    r = run("eval", tmp_path, "--url", "http://127.0.0.1:9")
    assert r.returncode == 2 and "junk.dat: not a document the service reads" in r.stderr
    (tmp_path / "baseline.json").write_text('{"documents": []}')
    r = run("eval", eval_set, "--url", "http://127.0.0.1:9", "--baseline", tmp_path / "baseline.json")
    assert r.returncode == 2 and "not a report of `ocr-app eval --output`" in r.stderr


def test_the_set_is_read_through_the_chat_route_and_compared_only_with_its_own(server, eval_set, tmp_path):
    # --route chat (the role's ocr_app_eval_route): each document to /v1/chat/completions, the Markdown read
    # as text; a baseline read through /v1/ocr is not compared with it.
    chats = 'ocr_chat_requests_total{code="200"}'
    before = server.metrics().get(chats, 0)
    out = tmp_path / "chat.json"
    r = run("eval", eval_set, "--url", server.url, "--key", server.key, "--route", "chat", "-o", out)
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert report["route"] == "chat" and report["requests"] == 2 and report["failed"] == []
    assert report["cer"] < 0.05, report
    assert server.metrics().get(chats, 0) - before == 2
    ocr = tmp_path / "ocr.json"
    ocr.write_text(json.dumps({**report, "route": "ocr"}))
    r = run("eval", eval_set, "--url", server.url, "--key", server.key, "--route", "chat", "--baseline", ocr)
    assert r.returncode == 1 and "not comparable" in r.stderr, r.stderr
