"""Bulk jobs (POST /v1/jobs ...): the real app over real HTTP against a real PostgreSQL (tests/postgres.py).

The servers run tests/stall_engine.py's engine (instant, or slow on demand: the test-time budget), and a
job's page is compared with what /v1/ocr answers for the same page on the same instance: the same pipeline
(decode worker, engine, response model) reads both.
"""

from __future__ import annotations

import io
import json
import signal
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path

import httpx
import psycopg
import pypdfium2 as pdfium
import pytest

from ocr_app.errors import InvalidParameter
from ocr_app.jobs.service import last_page_sent

from .docs import TEXTS, pdf, render
from .server import Server, StallServer, add_key
from .test_errors import assert_error

HERE = Path(__file__).parent
PDF_TYPE = "application/pdf"


def doc(pages: int, seed: str = "") -> bytes:
    return pdf(
        [render([f"{seed}{n} {TEXTS['en'][0]}"], size=28, width=700).image for n in range(1, pages + 1)]
    )


def db_cli(server: Server, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*server.command, "db", *args, "--config", str(server.config_file)], capture_output=True, text=True
    )


def submit(c: httpx.Client, data: bytes, **kw) -> httpx.Response:
    headers = {"Content-Type": PDF_TYPE, **kw.pop("headers", {})}
    return c.post("/v1/jobs", content=data, headers=headers, **kw)


def wait_unfinished(url: str, timeout: float = 30) -> None:
    """Until no job in the database is queued or running."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url) as conn:
        sql = "SELECT count(*) FROM ocr_jobs WHERE status IN ('queued', 'running')"
        while conn.execute(sql).fetchone() != (0,) and time.monotonic() < deadline:
            time.sleep(0.05)


def submit_ok(c: httpx.Client, data: bytes, timeout: float = 30, **kw) -> httpx.Response:
    """Submit, waiting while this key's earlier jobs hold max_jobs_in_flight (429)."""
    deadline = time.monotonic() + timeout
    while (r := submit(c, data, **kw)).status_code == 429 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert r.status_code == 202, r.text
    return r


def wait_status(c: httpx.Client, job_id: str, predicate, timeout: float = 300) -> dict:
    """The job's status once `predicate` holds. The bound stops a hang; it times nothing: a job waits behind
    whatever else the server reads, which on a slow, busy machine can take minutes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = c.get(f"/v1/jobs/{job_id}").json()
        if predicate(body):
            return body
        time.sleep(0.05)  # a poll interval, not a timing assumption
    raise TimeoutError(f"job {job_id} never matched: {body}")


def events(
    c: httpx.Client, job_id: str, last_event_id: str | None = None
) -> list[tuple[str | None, str, str]]:
    """(id, event, data) of every event until the stream ends."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    out, cur = [], {}
    with c.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line:
                if "event" in cur:
                    out.append((cur.get("id"), cur["event"], cur.get("data", "")))
                cur = {}
            elif not line.startswith(":"):
                k, _, v = line.partition(": ")
                cur[k] = v
    return out


def make_server(cls, tmp_path_factory, postgres, name: str, upgrade: bool = True, **settings) -> Server:
    srv = cls(
        tmp_path_factory.mktemp(name),
        database_url=postgres.create_database(name),
        job_poll_s=0.05,
        job_sweep_s=0.2,
        **settings,
    )
    if upgrade:
        assert db_cli(srv, "upgrade").returncode == 0
    return srv


@pytest.fixture(scope="module")
def jobs_srv(tmp_path_factory, postgres):
    srv = make_server(
        StallServer,
        tmp_path_factory,
        postgres,
        "jobs_contract",
        engine="rapidocr",
        max_concurrency=2,
        job_range_pages=2,
        job_lease_s=5,
        max_job_pages=5,
        max_job_bytes=2_000_000,
        max_jobs_in_flight=2,
    )
    srv.control = tmp_path_factory.mktemp("stall-control")
    srv.start(env={"STALL_CONTROL": str(srv.control)})
    srv.other_key = add_key(srv.keys_file, "other")
    yield srv
    assert srv.stop() == 0, srv.logs()[-2000:]


def test_a_job_reads_each_page_as_v1_ocr_does(jobs_srv):
    data = doc(3)
    with jobs_srv.client() as c:
        r = submit_ok(c, data)
        created = r.json()
        job_id = created["job_id"]
        assert created == {
            "job_id": job_id,
            "status_url": f"/v1/jobs/{job_id}",
            "events_url": f"/v1/jobs/{job_id}/events",
            "result_url": f"/v1/jobs/{job_id}/result",
        }
        evs = events(c, job_id)
        pages = [json.loads(d) for _, e, d in evs if e == "page"]
        assert [i for i, e, _ in evs if e == "page"] == ["1", "2", "3"]
        assert evs[0][1] == "progress" and evs[-1][1] == "done" and json.loads(evs[-1][2])["status"] == "done"
        sync = jobs_srv.ocr(data, PDF_TYPE).json()["pages"]
        assert pages == sync and len(sync) == 3 and all(p["lines"] for p in sync)

        status = c.get(created["status_url"]).json()
        assert status["status"] == "done" and status["pages"] == {"total": 3, "done": 3, "failed": 0}
        assert (
            status["errors"] == [] and status["started_at"] and status["finished_at"] and status["expires_at"]
        )

        result = c.get(created["result_url"])
        assert result.headers["content-type"].startswith("application/json")
        assert result.json() == {"job_id": job_id, "status": "done", "pages": sync, "errors": []}
        lines = c.get(created["result_url"], headers={"Accept": "application/x-ndjson"})
        assert lines.headers["content-type"].startswith("application/x-ndjson")
        assert [json.loads(x) for x in lines.text.splitlines()] == sync


def test_events_resume_after_last_event_id(jobs_srv):
    with jobs_srv.client() as c:
        job_id = submit_ok(c, doc(4, "r"), params={"pages": "1,2,4"}).json()["job_id"]
        full = events(c, job_id)
        assert [i for i, e, _ in full if e == "page"] == ["1", "2", "4"]
        resumed = events(c, job_id, last_event_id="2")
        assert [(i, e) for i, e, _ in resumed if e in ("page", "done")] == [("4", "page"), (None, "done")]
        assert [d for i, e, d in resumed if e == "page"] == [d for i, e, d in full if i == "4"]
        for not_a_page in ("x", b"\xb2"):  # b"\xb2": "²" in Latin-1, a digit to str.isdigit(), not to int()
            assert_error(
                c.get(f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": not_a_page}),
                422,
                "invalid_parameter",
            )


@pytest.mark.parametrize(("header", "page"), [(None, 0), ("", 0), ("0", 0), ("7", 7), (" 12 ", 12)])
def test_last_event_id_names_the_last_page_sent(header, page):
    assert last_page_sent(header) == page


@pytest.mark.parametrize("header", ["x", " ", "-1", "1.5", "²", "1¹", "٣"])
def test_a_last_event_id_that_is_not_a_page_number_is_refused(header):
    with pytest.raises(InvalidParameter):
        last_page_sent(header)


def test_idempotency_key_returns_the_same_job(jobs_srv):
    data = doc(1, "i")
    with jobs_srv.client() as c:
        first = submit_ok(c, data, headers={"Idempotency-Key": "k1"})
        again = submit(c, data, headers={"Idempotency-Key": "k1"})
        assert first.status_code == again.status_code == 202
        assert again.json() == first.json() and again.headers["Idempotent-Replayed"] == "true"
        assert_error(
            submit(c, doc(1, "other"), headers={"Idempotency-Key": "k1"}), 409, "idempotency_conflict"
        )
        assert_error(
            submit(c, data, headers={"Idempotency-Key": "k1"}, params={"preview": "true"}),
            409,
            "idempotency_conflict",
        )
        # The same document as multipart (another body, the same file): the same job.
        multi = c.post(
            "/v1/jobs", files={"file": ("a.pdf", data, PDF_TYPE)}, headers={"Idempotency-Key": "k1"}
        )
        assert multi.status_code == 202 and multi.json()["job_id"] == first.json()["job_id"]
        assert submit_ok(c, data).json()["job_id"] != first.json()["job_id"]  # no key: a new job
    with jobs_srv.client(jobs_srv.other_key) as c:  # keys are per API key
        assert (
            submit_ok(c, data, headers={"Idempotency-Key": "k1"}).json()["job_id"] != first.json()["job_id"]
        )


def test_a_job_is_visible_only_to_its_key(jobs_srv):
    with jobs_srv.client() as c:
        job_id = submit_ok(c, doc(1, "v")).json()["job_id"]
        wait_status(c, job_id, lambda b: b["status"] == "done")
    with jobs_srv.client(jobs_srv.other_key) as c:
        for method, path in [
            ("GET", f"/v1/jobs/{job_id}"),
            ("GET", f"/v1/jobs/{job_id}/events"),
            ("GET", f"/v1/jobs/{job_id}/result"),
            ("DELETE", f"/v1/jobs/{job_id}"),
            ("GET", "/v1/jobs/not-a-job-id"),
            ("GET", "/v1/jobs/00000000-0000-0000-0000-000000000000"),
        ]:
            assert_error(c.request(method, path), 404, "not_found")
    with jobs_srv.client(None) as c:
        assert_error(c.get(f"/v1/jobs/{job_id}"), 401, "unauthorized")
        assert_error(submit(c, doc(1)), 401, "unauthorized")
    with jobs_srv.client() as c:  # still the owner's, untouched
        assert c.get(f"/v1/jobs/{job_id}").json()["status"] == "done"


def test_limits_of_their_own(jobs_srv):
    with jobs_srv.client() as c:
        assert_error(submit(c, doc(6)), 413, "too_many_pages")  # max_job_pages 5
        assert_error(submit(c, doc(2), params={"pages": "1-6"}), 413, "too_many_pages")
        assert_error(submit(c, doc(2), params={"pages": "3"}), 422, "invalid_parameter")
        assert_error(submit(c, b"x" * 2_000_001), 413, "payload_too_large")  # max_job_bytes
        assert_error(
            c.post("/v1/jobs", content=b"x", headers={"Content-Type": "text/plain"}),
            415,
            "unsupported_media_type",
        )
        assert_error(submit(c, b"%PDF-1.4 not really"), 400, "invalid_image")
        # More than /v1/ocr's max_pages (50) is not what limits a job: max_job_pages is.
        assert submit_ok(c, doc(5, "l")).status_code == 202


def test_cancel_runs_no_page_and_frees_the_in_flight_limit(jobs_srv):
    wait_unfinished(jobs_srv.config["database_url"])  # earlier tests' jobs finish first
    jobs_srv.drain_file.touch()  # a draining instance claims nothing: the jobs stay queued
    try:
        with jobs_srv.client() as c:
            ids = [submit_ok(c, doc(2, f"c{n}")).json()["job_id"] for n in range(2)]
            assert_error(submit(c, doc(2, "c-over")), 429, "too_many_jobs")  # max_jobs_in_flight 2
            queued = c.get(f"/v1/jobs/{ids[0]}").json()
            assert queued["status"] == "queued" and queued["started_at"] is None
            assert_error(c.get(f"/v1/jobs/{ids[0]}/result"), 409, "job_not_finished")
            with c.stream("GET", f"/v1/jobs/{ids[0]}/events") as r:  # a progress event while queued
                assert next(r.iter_lines()) == "event: progress"
            for job_id in ids:
                r = c.delete(f"/v1/jobs/{job_id}")
                assert r.status_code == 200 and r.json()["status"] == "cancelled", r.text
            assert c.delete(f"/v1/jobs/{ids[0]}").json()["status"] == "cancelled"  # again: no change
            assert submit(c, doc(1, "after")).status_code == 202  # the limit counts queued and running only
        jobs_srv.drain_file.unlink()
        with jobs_srv.client() as c:
            done = [e for _, e, _ in events(c, ids[0])]
            assert done == ["progress", "done"]  # no page was run
            assert c.get(f"/v1/jobs/{ids[0]}").json()["pages"] == {"total": 2, "done": 0, "failed": 0}
            assert c.get(f"/v1/jobs/{ids[0]}/result").json()["pages"] == []
    finally:
        jobs_srv.drain_file.unlink(missing_ok=True)


def test_job_routes_in_the_openapi_document(jobs_srv):
    paths = httpx.get(jobs_srv.url + "/openapi.json").json()["paths"]
    assert set(paths["/v1/jobs"]) == {"post", "get"}
    assert set(paths["/v1/jobs/{job_id}"]) == {"get", "delete"}
    assert "get" in paths["/v1/jobs/{job_id}/events"] and "get" in paths["/v1/jobs/{job_id}/result"]
    assert "202" in paths["/v1/jobs"]["post"]["responses"]


def test_job_metrics(jobs_srv):
    with jobs_srv.client() as c:
        job_id = submit_ok(c, doc(1, "m")).json()["job_id"]
        wait_status(c, job_id, lambda b: b["status"] == "done")
    deadline = time.monotonic() + 30
    while (m := jobs_srv.metrics()).get('ocr_jobs{status="done"}', 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert m['ocr_jobs{status="done"}'] >= 1
    assert m['ocr_job_pages_total{outcome="ok"}'] >= 1
    for name in ("ocr_job_pages_queued", "ocr_job_oldest_queued_seconds", "ocr_job_lease_expiries_total"):
        assert name in m


def test_without_a_database_job_routes_say_what_to_set(server):
    with server.client() as c:
        for r in (submit(c, doc(1)), c.get("/v1/jobs/00000000-0000-0000-0000-000000000000")):
            assert "database_url" in assert_error(r, 503, "jobs_unavailable")["message"]
    # Said in /healthz as its own field; no ocr_job_store_up, so no job-store alert fires for it.
    assert server.health().json()["job_store"] == "off"
    assert not any(name.startswith("ocr_job_store_up") for name in server.metrics())


def test_schema_behind_is_refused_until_upgraded_then_results_expire(tmp_path_factory, postgres):
    srv = make_server(
        StallServer,
        tmp_path_factory,
        postgres,
        "jobs_ttl",
        upgrade=False,
        engine="rapidocr",
        job_result_ttl_s=1,
    )
    srv.start(env={"STALL_CONTROL": str(srv.workdir)})
    try:
        with srv.client() as c:
            assert "ocr-app db upgrade" in assert_error(submit(c, doc(1)), 503, "jobs_unavailable")["message"]
            assert srv.health().json()["job_store"] == "schema_behind"
            behind = db_cli(srv, "status")
            assert behind.returncode == 1 and "BEHIND" in behind.stdout
            assert db_cli(srv, "upgrade").returncode == 0
            assert db_cli(srv, "status").returncode == 0
            deadline = time.monotonic() + 30  # the instance sees the new schema at its next check
            while (r := submit(c, doc(1))).status_code == 503 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert r.status_code == 202, r.text
            assert srv.health().json()["job_store"] == "ready"
            job_id = r.json()["job_id"]
            done = wait_status(c, job_id, lambda b: b.get("status") == "done")
            assert done["expires_at"] is not None
            wait_status(c, job_id, lambda b: "error" in b)  # the timer deleted it: 404
            assert_error(c.get(f"/v1/jobs/{job_id}"), 404, "not_found")
            with psycopg.connect(srv.config["database_url"]) as conn:
                assert conn.execute("SELECT count(*) FROM ocr_job_pages").fetchone() == (0,)
    finally:
        assert srv.stop() == 0, srv.logs()[-2000:]


def test_a_killed_workers_pages_are_finished_by_another_once(jobs_srv, tmp_path_factory):
    """Instance A reads slowly and is SIGKILLed mid-range; the contract server (B, drained until then so that
    A takes the job) reclaims A's range when its lease expires and reads only the pages A had not written:
    every page once, none run twice."""
    url = jobs_srv.config["database_url"]
    wait_unfinished(url)
    a = StallServer(
        tmp_path_factory.mktemp("jobs_kill"),
        database_url=url,
        job_poll_s=0.05,
        engine="rapidocr",
        job_range_pages=4,
        job_lease_s=1.5,
        max_concurrency=1,
        preprocess_workers=1,
    )
    (a.workdir / "trickle").write_text("0.4")  # each page 0.4 s: a range is still being read when A dies
    jobs_srv.drain_file.touch()
    try:
        a.start(env={"STALL_CONTROL": str(a.workdir)})
        with a.client() as c:  # A's key has the contract server's key name: the same owner
            job_id = submit_ok(c, doc(8, "k")).json()["job_id"]
            wait_status(c, job_id, lambda s: s["pages"]["done"] >= 1)
        a.stop(signal.SIGKILL)
        with psycopg.connect(url) as conn:
            by_a = conn.execute("SELECT count(*) FROM ocr_job_pages WHERE job_id = %s", (job_id,)).fetchone()[
                0
            ]
            leased = conn.execute(
                "SELECT count(*) FROM ocr_job_ranges WHERE job_id = %s AND state = 'leased'", (job_id,)
            ).fetchone()[0]
        assert 1 <= by_a < 8 and leased == 1  # A died holding a range it had not finished
        before = jobs_srv.metrics()
        jobs_srv.drain_file.unlink()

        with jobs_srv.client() as c:
            done = wait_status(c, job_id, lambda s: s["status"] == "done")
            assert done["pages"] == {"total": 8, "done": 8, "failed": 0}
            lines = c.get(f"/v1/jobs/{job_id}/result", headers={"Accept": "application/x-ndjson"}).text
            assert [json.loads(x)["page"] for x in lines.splitlines()] == list(range(1, 9))
        with psycopg.connect(url) as conn:
            rows = dict(
                conn.execute(
                    "SELECT worker LIKE %s, count(*) FROM ocr_job_pages WHERE job_id = %s GROUP BY 1",
                    (f"%:{jobs_srv.port}:%", job_id),
                ).fetchall()
            )
        after = jobs_srv.metrics()
        assert rows.get(False, 0) == by_a and rows[True] == 8 - by_a
        # B ran no page that A had written, and none twice.
        assert after["ocr_engine_pages_total"] - before["ocr_engine_pages_total"] == 8 - by_a
        assert after["ocr_job_lease_expiries_total"] - before["ocr_job_lease_expiries_total"] == 1
    finally:
        jobs_srv.drain_file.unlink(missing_ok=True)
        a.stop(signal.SIGKILL)


class HeldRequest:
    """A one-page /v1/ocr request held in the engine (hold_interactive) until let_go(); it must answer 200.
    Constructed once the request is in flight."""

    def __init__(self, srv):
        self.srv = srv
        self.answers: list[int] = []
        (srv.control / "hold_interactive").touch()
        self.thread = threading.Thread(target=self._send)
        self.thread.start()
        deadline = time.monotonic() + 30
        while srv.metrics()["ocr_inflight_requests"] != 1:
            assert time.monotonic() < deadline, "the interactive request never got in flight"
            time.sleep(0.05)

    def _send(self) -> None:
        self.answers.append(self.srv.ocr(doc(1, "i"), PDF_TYPE, timeout=60).status_code)

    def let_go(self) -> float:
        """When it was released (wall clock), once it answered."""
        released = time.time()
        (self.srv.control / "hold_interactive").unlink()
        self.thread.join(60)
        assert self.answers == [200]
        return released


def test_job_pages_wait_while_an_interactive_request_runs(jobs_srv):
    """A job submitted while an interactive request is in flight stays queued (job_max_interactive is 0 on
    the CPU engine) and starts only job_yield_s after that request ended: its client's next request would
    have found the engine free."""
    wait_unfinished(jobs_srv.config["database_url"])
    held = HeldRequest(jobs_srv)
    try:
        with jobs_srv.client() as c:
            job_id = submit_ok(c, doc(2, "yield")).json()["job_id"]
            # The submit woke the worker, which looks every 0.1 s at most: ten chances to break the rule.
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                assert c.get(f"/v1/jobs/{job_id}").json()["status"] == "queued"
                time.sleep(0.05)
    finally:
        released = held.let_go()
    with jobs_srv.client() as c:
        done = wait_status(c, job_id, lambda s: s["status"] == "done")
    started = datetime.fromisoformat(done["started_at"]).timestamp()
    assert started >= released + 0.25, (started - released, done)  # job_yield_s, default 0.25
    assert done["pages"] == {"total": 2, "done": 2, "failed": 0}


def test_a_range_kept_waiting_by_interactive_requests_goes_back_to_the_queue(jobs_srv):
    """An instance busy with interactive requests does not sit on a claimed range: after a heartbeat period
    (job_lease_s / 3) its unread pages are queued again for any instance, and read once in the end."""
    url = jobs_srv.config["database_url"]
    wait_unfinished(url)
    (jobs_srv.control / "trickle").write_text("1.0")  # each range is on its first page when the hold starts
    try:
        before = jobs_srv.metrics()
        with jobs_srv.client() as c:
            job_id = submit_ok(c, doc(4, "busy")).json()["job_id"]
        deadline = time.monotonic() + 30
        while jobs_srv.metrics()["ocr_job_pages_inflight"] == 0:
            assert time.monotonic() < deadline, "no job page ever started"
            time.sleep(0.05)
        held = HeldRequest(jobs_srv)
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                sql = (
                    "SELECT count(*) FILTER (WHERE state = 'queued' AND claims > 0),"
                    " (SELECT count(*) FROM ocr_job_pages WHERE job_id = %s)"
                    " FROM ocr_job_ranges WHERE job_id = %s"
                )
                deadline = time.monotonic() + 30
                while (row := conn.execute(sql, (job_id, job_id)).fetchone())[0] == 0:
                    assert time.monotonic() < deadline, "no range was given back"
                    time.sleep(0.05)
                assert row[1] < 4  # given back with pages still to read
        finally:
            held.let_go()
        with jobs_srv.client() as c:
            done = wait_status(c, job_id, lambda s: s["status"] == "done")
        assert done["pages"] == {"total": 4, "done": 4, "failed": 0}
        after = jobs_srv.metrics()
        # Every page read once, the interactive one besides: a range given back is not read twice.
        assert after["ocr_engine_pages_total"] - before["ocr_engine_pages_total"] == 4 + 1
        assert after["ocr_job_lease_expiries_total"] == before["ocr_job_lease_expiries_total"]
    finally:
        (jobs_srv.control / "trickle").unlink(missing_ok=True)


def test_a_page_that_cannot_be_read_is_a_page_error(jobs_srv):
    """Page 2 is over the PDF page-size bound: /v1/ocr refuses it with 400 invalid_image, and the job records
    the same error for that page while the others are read."""
    pdf_doc = pdfium.PdfDocument.new()
    pdf_doc.new_page(600, 800)
    pdf_doc.new_page(15_000, 800)  # over MAX_PDF_PAGE_PT
    buf = io.BytesIO()
    pdf_doc.save(buf)
    data = buf.getvalue()
    sync_error = assert_error(jobs_srv.ocr(data, PDF_TYPE, params={"pages": "2"}), 400, "invalid_image")
    with jobs_srv.client() as c:
        job_id = submit_ok(c, data).json()["job_id"]
        evs = events(c, job_id)
        assert [(i, e) for i, e, _ in evs if e.startswith("page")] == [("1", "page"), ("2", "page_error")]
        page_error = json.loads(next(d for _, e, d in evs if e == "page_error"))
        status = c.get(f"/v1/jobs/{job_id}").json()
        assert status["status"] == "done" and status["pages"] == {"total": 2, "done": 1, "failed": 1}
        assert status["errors"] == [page_error]
        assert page_error["error"] == {"code": "invalid_image", "message": sync_error["message"]}
        result = c.get(f"/v1/jobs/{job_id}/result").json()
        assert [p["page"] for p in result["pages"]] == [1] and result["errors"] == [page_error]


def test_a_job_page_slower_than_a_request_deadline_is_still_read(tmp_path_factory, postgres):
    """Interactive work comes first, so a job page may take longer than request_timeout_s (a /v1/ocr
    request's deadline): it is still read. Past job_page_timeout_s it is a page error `timeout`.

    The job's page is held in the engine (`wedge`) from before a /v1/ocr request starts until that request
    has had its 504: the page has then been in flight longer than a request's deadline, for certain, and is
    released within its own (job_page_timeout_s, with room for a loaded machine)."""
    srv = make_server(
        StallServer,
        tmp_path_factory,
        postgres,
        "jobs_deadline",
        engine="rapidocr",
        request_timeout_s=1,
        job_page_timeout_s=6,
    )
    control = tmp_path_factory.mktemp("stall-deadline")
    wedge = control / "wedge"
    srv.start(env={"STALL_CONTROL": str(control)})
    try:
        wedge.touch()
        with srv.client() as c:
            job_id = submit_ok(c, doc(1, "slow")).json()["job_id"]
            deadline = time.monotonic() + 30
            while srv.metrics()["ocr_job_pages_inflight"] != 1:  # its clock (job_page_timeout_s) runs
                assert time.monotonic() < deadline, "the job's page never started"
                time.sleep(0.05)
            assert_error(srv.ocr(doc(1, "sync"), PDF_TYPE), 504, "timeout")
            held = c.get(f"/v1/jobs/{job_id}").json()
            assert held["status"] == "running" and held["pages"] == {"total": 1, "done": 0, "failed": 0}, held
            wedge.unlink()
            done = wait_status(c, job_id, lambda s: s["status"] == "done")
            assert done["pages"] == {"total": 1, "done": 1, "failed": 0}, done
            wedge.touch()  # held past job_page_timeout_s
            job_id = submit_ok(c, doc(1, "late")).json()["job_id"]
            failed = wait_status(c, job_id, lambda s: s["status"] not in ("queued", "running"))
            assert failed["status"] == "failed" and failed["pages"] == {"total": 1, "done": 0, "failed": 1}
            assert failed["errors"][0]["error"] == {
                "code": "timeout",
                "message": "the page was not read within 6 s (job_page_timeout_s)",
            }
    finally:
        wedge.unlink(missing_ok=True)
        assert srv.stop() == 0, srv.logs()[-2000:]
