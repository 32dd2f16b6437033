"""The job database away (`make test-app`): its own throw-away cluster, frozen as a hung or cut-off database
host is (its processes stopped: connections queue, nothing answers) while a job runs and a client follows it.

What a client sees: job routes answer 503 jobs_unavailable with Retry-After at once (no 30 s wait on the
pool), /v1/ocr serves, /healthz stays ready with job_store "unreachable", an open event stream ends with an
`unavailable` event and a clean close (read with httpx-sse); when the database is back, the job finishes by
itself with every page once and the stream resumes after its Last-Event-ID.

A route's bound is checked as a stall would show: the client's own time-out (STALL_S) fails the test where
the old code waited 30 s; the times are printed, never asserted.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
import uuid

import httpx
import psycopg
import pytest
from httpx_sse import connect_sse

from ocr_app.errors import JobsUnavailable
from ocr_app.jobs.store import JobStore

from .alert_metrics import missing
from .docs import TEXTS, encode, render
from .postgres import Cluster, frozen
from .server import OCR_APP
from .test_cli_jobs import env_of
from .test_errors import assert_error
from .test_jobs import StallServer, db_cli, doc, submit, wait_status

DB_TIMEOUT_S = 1.0  # job_db_timeout_s here; the default is 2 s
STALL_S = 8.0  # what a route may take before the test calls it a stall


@pytest.fixture(scope="module")
def cluster():
    c = Cluster().start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def srv(tmp_path_factory, cluster):
    s = StallServer(
        tmp_path_factory.mktemp("db_away"),
        database_url=cluster.create_database("db_away"),
        job_poll_s=0.05,
        job_sweep_s=0.2,
        job_db_timeout_s=DB_TIMEOUT_S,
        engine="rapidocr",
        job_range_pages=2,
        job_max_inflight=1,
        job_lease_s=5,
        max_job_pages=8,
    )
    assert db_cli(s, "upgrade").returncode == 0
    s.control = tmp_path_factory.mktemp("db_away-control")
    s.start(env={"STALL_CONTROL": str(s.control)})
    yield s
    assert s.stop() == 0, s.logs()[-2000:]


def test_a_statement_on_a_frozen_database_is_bounded(cluster):
    """JobStore.bounded answers within job_db_timeout_s whatever the statement does (psycopg itself waits up
    to 10 s to cancel a statement on a server that does not answer): the route's answer never waits for it."""
    url = cluster.create_database("db_away_bounded")

    async def scenario() -> tuple[float, str]:
        store = JobStore(url, max_connections=2, timeout_s=DB_TIMEOUT_S)
        await store.open()
        await store.pool.wait()  # a connection open before the freeze: the statement itself hangs
        try:
            with frozen(cluster):
                start = time.monotonic()
                with pytest.raises(JobsUnavailable) as err:
                    # The outer bound only tells a stall from an answer.
                    await asyncio.wait_for(store.bounded(store.job_state(uuid.uuid4())), STALL_S)
                took = time.monotonic() - start
            return took, err.value.message
        finally:
            await store.close()

    took, message = asyncio.run(scenario())
    print(f"[db-away] a statement on the frozen database: JobsUnavailable after {took:.2f} s: {message}")
    assert "job_db_timeout_s" in message


def follow(c: httpx.Client, job_id: str, seen: list[tuple[str, str, str]], last_id: str = "") -> None:
    """Every event of the job's stream into `seen` (event, data, id) until the server closes it."""
    headers = {"Last-Event-ID": last_id} if last_id else {}
    with connect_sse(c, "GET", f"/v1/jobs/{job_id}/events", headers=headers) as source:
        for ev in source.iter_sse():
            seen.append((ev.event, ev.data, ev.id))


def wait_for(predicate, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.05)  # a poll interval, not a timing assumption


def test_job_routes_refuse_at_once_while_ocr_serves_and_the_job_resumes(srv, cluster):
    png = encode(render(TEXTS["en"][:1]).image, "PNG")
    c = srv.client(timeout=STALL_S)
    at = int(srv.metrics()["ocr_engine_pages_total"])
    (srv.control / "wedge_after").write_text(str(at + 2))  # two pages read, the third held in the engine
    job_id = submit(c, doc(6, "away")).json()["job_id"]
    seen: list[tuple[str, str, str]] = []
    reader = threading.Thread(target=follow, args=(srv.client(timeout=60), job_id, seen), daemon=True)
    reader.start()
    # `ocr-app jobs result --follow` too: it must sit the outage out and write every page once.
    follower = subprocess.Popen(
        [OCR_APP, "jobs", "result", job_id, "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env_of(srv),
        stdin=subprocess.DEVNULL,
    )
    wait_for(lambda: sum(e == "page" for e, _, _ in seen) == 2, "two page events before the outage")
    assert follower.stdout is not None
    held = [follower.stdout.readline() for _ in range(2)]  # pages 1 and 2: its stream is open now

    with frozen(cluster):
        times = {}
        for name, call in {
            "status": lambda: c.get(f"/v1/jobs/{job_id}"),
            "list": lambda: c.get("/v1/jobs"),
            "submit": lambda: submit(c, doc(1, "while away")),
            "events": lambda: c.get(f"/v1/jobs/{job_id}/events"),
        }.items():
            start = time.monotonic()
            r = call()
            times[name] = round(time.monotonic() - start, 2)
            assert_error(r, 503, "jobs_unavailable")
            assert r.headers["retry-after"].isdigit()
        # The held page ends now: its result waits for the database (the worker's write hangs meanwhile).
        (srv.control / "wedge_after").unlink()
        # /v1/ocr reads on: it needs no database.
        r = c.post("/v1/ocr", content=png, headers={"Content-Type": "image/png"})
        assert r.status_code == 200 and r.json()["pages"][0]["text"]
        # The instance stays in the load balancer; the job store's state is its own field.
        wait_for(lambda: srv.health().json()["job_store"] == "unreachable", "job_store unreachable")
        health = srv.health()
        assert health.status_code == 200 and health.json()["status"] == "ready"
        assert srv.metrics()["ocr_job_store_up"] == 0
        assert missing(httpx.get(srv.url + "/metrics").text, "app") == []  # what the alert rules select
        # The open stream ends with an event that says why, and closes cleanly (httpx-sse raised nothing).
        reader.join(STALL_S)
        assert not reader.is_alive(), f"the event stream stayed open: {seen[-3:]}"
        event, data, _ = seen[-1]
        assert event == "unavailable" and json.loads(data)["code"] == "jobs_unavailable", seen[-3:]
        print(f"[db-away] job routes answered 503 after {times} s (job_db_timeout_s {DB_TIMEOUT_S:g})")

    wait_for(lambda: srv.health().json()["job_store"] == "ready", "job_store ready again")
    assert srv.metrics()["ocr_job_store_up"] == 1
    wait_status(c, job_id, lambda s: s["status"] == "done")
    # The stream resumes after the last page the client holds, each page once.
    last_id = [i for e, _, i in seen if e == "page"][-1]
    rest: list[tuple[str, str, str]] = []
    follow(c, job_id, rest, last_id)
    pages = [json.loads(d)["page"] for e, d, _ in seen + rest if e == "page"]
    assert pages == [1, 2, 3, 4, 5, 6] and rest[-1][0] == "done"
    with psycopg.connect(srv.config["database_url"]) as conn:
        sql = "SELECT page FROM ocr_job_pages WHERE job_id = %s ORDER BY page"
        rows = conn.execute(sql, (job_id,)).fetchall()
    assert [p for (p,) in rows] == [1, 2, 3, 4, 5, 6]
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err
    assert [json.loads(line)["page"] for line in held + out.splitlines()] == [1, 2, 3, 4, 5, 6]
    assert "event stream lost (the job database" in err, err
