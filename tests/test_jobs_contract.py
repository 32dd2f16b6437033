"""The jobs contract clients rely on (`make test-app`): events in order, cancel, list, purge.

Real servers (tests/stall_engine.py's engine, real HTTP) on a real PostgreSQL. A job's events are read with
httpx-sse, a Server-Sent Events client no one here wrote, as a client would: it stops at the first event that
says the job is finished, and must hold every page by then.
"""

from __future__ import annotations

import json
import time

import httpx
import psycopg
import pytest
from httpx_sse import connect_sse

from .server import add_key
from .test_errors import assert_error
from .test_jobs import StallServer, doc, make_server, submit, submit_ok, wait_status

FINISHED = {"done", "failed", "cancelled", "expired"}


@pytest.fixture(scope="module")
def srv(tmp_path_factory, postgres):
    """One claimer (job_max_inflight 1): a range's pages run one after another, and the next job's only once
    the range before it is over, so "the next job is done" means "the worker is past the last one"."""
    s = make_server(
        StallServer,
        tmp_path_factory,
        postgres,
        "jobs_contract_v2",
        engine="rapidocr",
        job_range_pages=2,
        job_max_inflight=1,
        job_lease_s=5,
        max_job_pages=8,
        max_jobs_in_flight=3,
    )
    s.control = tmp_path_factory.mktemp("contract-control")
    s.start(env={"STALL_CONTROL": str(s.control)})
    yield s
    assert s.stop() == 0, s.logs()[-2000:]


def says_finished(event: str, data: str) -> bool:
    if event == "done":
        return True
    return event == "progress" and json.loads(data)["status"] in FINISHED


def read_until_finished(
    c: httpx.Client, job_id: str, last_event_id: str | None = None, stop_after_pages: int | None = None
) -> tuple[list[int], dict | None, str | None]:
    """(page numbers received, the first event's data that said finished or None, the last event id),
    read with httpx-sse; stops at that first event (as a client that trusts it), or after
    `stop_after_pages` page events (a client that drops the connection)."""
    pages: list[int] = []
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    last_id = last_event_id
    with connect_sse(c, "GET", f"/v1/jobs/{job_id}/events", headers=headers) as source:
        assert source.response.status_code == 200
        for sse in source.iter_sse():
            if sse.event in ("page", "page_error"):
                assert sse.id and int(sse.id) == json.loads(sse.data)["page"]
                pages.append(int(sse.id))
                last_id = sse.id
                if stop_after_pages is not None and len(pages) >= stop_after_pages:
                    return pages, None, last_id
            elif says_finished(sse.event, sse.data):
                return pages, {"event": sse.event, **json.loads(sse.data)}, last_id
    raise AssertionError(f"the stream ended without saying the job is finished, after pages {pages}")


def test_a_finished_job_is_announced_after_its_last_page(srv):
    """A stream opened on a job that is already done: every page, then the finished status."""
    with srv.client() as c:
        job_id = submit_ok(c, doc(5, "ev")).json()["job_id"]
        wait_status(c, job_id, lambda s: s["status"] == "done")
        pages, finished, _ = read_until_finished(c, job_id)
        assert pages == [1, 2, 3, 4, 5]
        assert finished == {"event": "progress", "status": "done", "pages_sent": 5, "pages_total": 5}
        # Resumed after page 3: the two left, then the finished status; the stream's last event is done.
        pages, finished, _ = read_until_finished(c, job_id, last_event_id="3")
        assert pages == [4, 5] and finished is not None and finished["status"] == "done"
        with connect_sse(c, "GET", f"/v1/jobs/{job_id}/events") as source:
            names = [e.event for e in source.iter_sse()]
        assert names[-2:] == ["progress", "done"] and names.count("page") == 5


def test_pages_read_on_two_instances_arrive_before_done_with_a_reconnect(srv, tmp_path_factory):
    """A second instance on the same database: the job's ranges are read by both (each page slow enough for
    the other to claim the next range). One client reads it on instance B, drops after two pages and
    resumes with Last-Event-ID on instance A; another reads it whole on A. Both hold every page once the
    first event says finished."""
    url = srv.config["database_url"]
    b = StallServer(
        tmp_path_factory.mktemp("contract-b"),
        database_url=url,
        job_poll_s=0.05,
        engine="rapidocr",
        job_range_pages=2,
        job_max_inflight=1,
        job_lease_s=5,
        max_job_pages=8,
    )
    b_control = tmp_path_factory.mktemp("contract-b-control")
    (b_control / "trickle").write_text("0.3")
    (srv.control / "trickle").write_text("0.3")
    b.start(env={"STALL_CONTROL": str(b_control)})
    try:
        # B's key has srv's key name ("tests"): the same owner.
        with srv.client() as a_client, b.client() as b_client:
            job_id = submit_ok(a_client, doc(8, "two")).json()["job_id"]
            first, none, last_id = read_until_finished(b_client, job_id, stop_after_pages=2)
            assert first == [1, 2] and none is None
            rest, finished, _ = read_until_finished(a_client, job_id, last_event_id=last_id)
            assert first + rest == list(range(1, 9)), (first, rest)
            assert finished is not None and finished["status"] == "done"
            whole, finished, _ = read_until_finished(a_client, job_id)
            assert whole == list(range(1, 9)) and finished is not None
        with psycopg.connect(url) as conn:
            workers = conn.execute(
                "SELECT count(DISTINCT worker) FROM ocr_job_pages WHERE job_id = %s", (job_id,)
            ).fetchone()
        assert workers == (2,), "the job's pages were not read on both instances"
    finally:
        (srv.control / "trickle").unlink(missing_ok=True)
        assert b.stop() == 0, b.logs()[-2000:]


def wedge_next_page(s) -> int:
    """Let the engine read one more page, then hold the page after it; returns the engine's page count."""
    at = int(s.metrics()["ocr_engine_pages_total"])
    (s.control / "wedge_after").write_text(str(at + 1))
    return at


def wait_inflight(s, pages: int) -> None:
    deadline = time.monotonic() + 30
    while s.metrics()["ocr_job_pages_inflight"] != pages:
        assert time.monotonic() < deadline, f"never {pages} job page(s) in flight"
        time.sleep(0.05)


def run_one_more_job(c: httpx.Client) -> None:
    """With one claimer, this job is done only once the worker has left the range it was on."""
    job_id = submit_ok(c, doc(1, "next")).json()["job_id"]
    wait_status(c, job_id, lambda s: s["status"] == "done")


def test_cancel_drops_the_page_in_flight_and_starts_none(srv):
    """Page 1 is read, page 2 is in the engine when the cancel returns: page 2 is dropped (not written, not
    counted, not sent), pages 3-4 never start, page 1 stays readable, and the counters stay put."""
    with srv.client() as c:
        before = srv.metrics()
        engine_at = wedge_next_page(srv)
        try:
            job_id = submit_ok(c, doc(4, "cx")).json()["job_id"]
            wait_status(c, job_id, lambda s: s["pages"]["done"] == 1)
            wait_inflight(srv, 1)
            r = c.delete(f"/v1/jobs/{job_id}")
            assert r.status_code == 200, r.text
            cancelled = r.json()
            assert cancelled["status"] == "cancelled"
            assert cancelled["pages"] == {"total": 4, "done": 1, "failed": 0}
        finally:
            (srv.control / "wedge_after").unlink()
        run_one_more_job(c)
        after = srv.metrics()
        status = c.get(f"/v1/jobs/{job_id}").json()
        assert status["status"] == "cancelled" and status["pages"] == {"total": 4, "done": 1, "failed": 0}
        # The engine ran page 1, page 2 (whose result was dropped) and the next job's page: 3 pages.
        assert after["ocr_engine_pages_total"] - engine_at == 3
        ok = 'ocr_job_pages_total{outcome="ok"}'
        assert after[ok] - before.get(ok, 0) == 2  # page 1 and the next job's page
        with psycopg.connect(srv.config["database_url"]) as conn:
            rows = conn.execute("SELECT page FROM ocr_job_pages WHERE job_id = %s", (job_id,)).fetchall()
        assert rows == [(1,)]
        result = c.get(f"/v1/jobs/{job_id}/result").json()
        assert result["status"] == "cancelled" and [p["page"] for p in result["pages"]] == [1]
        pages, finished, _ = read_until_finished(c, job_id)
        assert pages == [1] and finished == {
            "event": "progress",
            "status": "cancelled",
            "pages_sent": 1,
            "pages_total": 4,
        }


def test_list_newest_first_by_pages_and_state_for_its_key_only(srv):
    key = add_key(srv.keys_file, f"lister-{time.monotonic_ns()}")
    with srv.client(key) as c:
        ids = [submit_ok(c, doc(1, f"ls{n}")).json()["job_id"] for n in range(3)]
        for job_id in ids[:2]:
            wait_status(c, job_id, lambda s: s["status"] in ("done", "cancelled"))
        c.delete(f"/v1/jobs/{ids[2]}")  # cancelled, or done already: its state is read back below
        states = {i: c.get(f"/v1/jobs/{i}").json()["status"] for i in ids}

        first = c.get("/v1/jobs", params={"limit": 2})
        assert first.status_code == 200, first.text
        body = first.json()
        assert [j["job_id"] for j in body["jobs"]] == [ids[2], ids[1]] and body["next_cursor"]
        assert body["jobs"][0]["status"] == states[ids[2]] and body["jobs"][1]["pages"]["total"] == 1
        second = c.get("/v1/jobs", params={"limit": 2, "cursor": body["next_cursor"]}).json()
        assert [j["job_id"] for j in second["jobs"]] == [ids[0]] and second["next_cursor"] is None
        # At the limit (100) and one past it; the default page holds all three.
        assert [j["job_id"] for j in c.get("/v1/jobs", params={"limit": 100}).json()["jobs"]] == ids[::-1]
        assert_error(c.get("/v1/jobs", params={"limit": 101}), 422, "invalid_parameter")
        assert_error(c.get("/v1/jobs", params={"limit": 0}), 422, "invalid_parameter")
        assert [j["job_id"] for j in c.get("/v1/jobs").json()["jobs"]] == ids[::-1]
        for state in set(states.values()):
            listed = c.get("/v1/jobs", params={"status": state}).json()["jobs"]
            assert [j["job_id"] for j in listed] == [i for i in ids[::-1] if states[i] == state]
        both = c.get("/v1/jobs", params=[("status", "done"), ("status", "cancelled")]).json()["jobs"]
        assert len(both) == 3
        assert c.get("/v1/jobs", params={"status": "queued"}).json() == {"jobs": [], "next_cursor": None}
        assert_error(c.get("/v1/jobs", params={"status": "finished"}), 422, "invalid_parameter")
        for bad in ("zzz", "eyJ4IjoxfQ", "W10", "WyJ4IiwieSJd", "x" * 201):
            assert_error(c.get("/v1/jobs", params={"cursor": bad}), 422, "invalid_parameter")
    with srv.client() as c:  # another key: none of these, and their ids stay 404
        listed = {j["job_id"] for j in c.get("/v1/jobs", params={"limit": 100}).json()["jobs"]}
        assert not listed & set(ids)
        assert_error(c.get(f"/v1/jobs/{ids[0]}"), 404, "not_found")
    with srv.client(None) as c:
        assert_error(c.get("/v1/jobs"), 401, "unauthorized")


def test_purge_deletes_the_job_now_and_stops_its_work(srv):
    url = srv.config["database_url"]
    with srv.client() as c:
        done_id = submit_ok(c, doc(2, "pd")).json()["job_id"]
        wait_status(c, done_id, lambda s: s["status"] == "done")
        engine_at = wedge_next_page(srv)
        try:
            job_id = submit_ok(c, doc(4, "pg")).json()["job_id"]
            # Page 1 written, then page 2 in flight (page 1's slot is given back before its write): a purge
            # before page 2 started would stop it before the engine, which this test does not count on.
            wait_status(c, job_id, lambda s: s["pages"]["done"] == 1)
            wait_inflight(srv, 1)
            with srv.client(add_key(srv.keys_file, f"stranger-{time.monotonic_ns()}")) as other:
                assert_error(other.delete(f"/v1/jobs/{job_id}", params={"purge": "true"}), 404, "not_found")
            for purged in (done_id, job_id):
                r = c.delete(f"/v1/jobs/{purged}", params={"purge": "true"})
                assert r.status_code == 204 and r.content == b"", r.text
        finally:
            (srv.control / "wedge_after").unlink()
        run_one_more_job(c)
        # Pages 1 and 2 (dropped), then the next job's page.
        assert srv.metrics()["ocr_engine_pages_total"] - engine_at == 3
        for purged in (done_id, job_id):
            for method, path in [
                ("GET", f"/v1/jobs/{purged}"),
                ("GET", f"/v1/jobs/{purged}/result"),
                ("DELETE", f"/v1/jobs/{purged}"),
                ("DELETE", f"/v1/jobs/{purged}?purge=true"),
            ]:
                assert_error(c.request(method, path), 404, "not_found")
        listed = c.get("/v1/jobs", params={"limit": 100}).json()["jobs"]
        assert not {done_id, job_id} & {j["job_id"] for j in listed}
    with psycopg.connect(url) as conn:
        for table, column in [
            ("ocr_jobs", "id"),
            ("ocr_job_documents", "job_id"),
            ("ocr_job_ranges", "job_id"),
            ("ocr_job_pages", "job_id"),
        ]:
            left = conn.execute(
                f"SELECT count(*) FROM {table} WHERE {column} = ANY(%s::uuid[])",  # noqa: S608 - names above
                ([done_id, job_id],),
            ).fetchone()
            assert left == (0,), table
    assert "database error" not in srv.logs()


def test_bad_job_requests_are_the_apis_errors(srv):
    with srv.client() as c:
        assert_error(c.delete("/v1/jobs/not-a-uuid", params={"purge": "true"}), 404, "not_found")
        assert_error(c.delete("/v1/jobs/not-a-uuid", params={"purge": "maybe"}), 422, "invalid_parameter")
        assert_error(c.put("/v1/jobs"), 405, "method_not_allowed")
        assert_error(submit(c, b""), 400, "invalid_image")
