"""The load generator's checker sees the fault test-fleet injects: the deliberately broken release keeps
digits and garbles letters, and every one of its answers must count as a failed request (were that release
ever to reach the pool, test-fleet's failed_requests would show it). Runs in test-app: no lab needed."""

from __future__ import annotations

import itertools
import shutil
import sys
import time
from collections import defaultdict

import pytest

from tests.server import Server

from .load import Load, documents, misread
from .releases import ROOT, break_reading


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """The broken release's sources, run as `ocr-app serve` from a copy of the checkout's."""
    src = tmp_path_factory.mktemp("broken-release")
    shutil.copytree(ROOT / "ocr_app", src / "ocr_app", ignore=shutil.ignore_patterns("__pycache__"))
    break_reading(src)

    class Broken(Server):
        command = (sys.executable, "-P", "-m", "ocr_app.cli")  # -P: the copy, not the checkout (cwd)

    srv = Broken(src / "run").start(env={"PYTHONPATH": str(src)})
    yield srv
    assert srv.stop() == 0, srv.logs()[-2000:]


def test_every_load_document_reads_right_on_the_good_release(server):
    for doc in documents():
        text = server.ocr(doc.body, "image/png").json()["pages"][0]["text"]
        assert misread(doc, text) is None, text


def test_the_broken_release_fails_every_load_document(broken):
    for doc in documents():
        r = broken.ocr(doc.body, "image/png")
        assert r.status_code == 200, r.text
        text = r.json()["pages"][0]["text"]
        assert doc.number in "".join(text.split()), text  # test-fleet's fault: digits kept, letters not
        assert misread(doc, text) == f"{doc.word} not read", text


def test_a_paced_worker_starts_its_requests_at_least_interval_s_apart(server):
    """The pace test-fleet runs its load at (Load.interval_s): each worker's requests start at least that far
    apart, when they are answered sooner, and every one of them reads right."""
    sent: dict[str, list[tuple[float, str]]] = defaultdict(list)

    def note(request):
        rid = request.headers["X-Request-ID"]  # load-<worker>-<n>
        sent[rid.rsplit("-", 1)[0]].append((time.monotonic(), rid))

    load = Load(lambda: server.client(event_hooks={"request": [note]}), concurrency=2, interval_s=0.5).start()
    load.finish(min_total=8)
    load.check(8)
    assert sorted(sent) == ["load-0", "load-1"]
    # How the 8 requests split between the workers is the scheduler's (5 and 3 on a busy machine): every
    # interval counts, 8 starts in 2 workers make 6 of them.
    pairs = [pair for requests in sent.values() for pair in itertools.pairwise(requests)]
    assert len(pairs) == 6, sent
    # Measured from the turn of the request before (not from its sending, which a busy machine may delay by
    # tens of ms after its turn came, so that the two sendings stand closer than interval_s): the worker's
    # clock. The waits' timeouts round up to the ns, the clocks are the same one: no slack needed.
    since_turn = [(t - load.turns[prev], rid) for (_, prev), (t, rid) in pairs]
    assert min(since_turn)[0] >= 0.5, since_turn
