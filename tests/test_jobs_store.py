"""The job store's guarantees, on the real PostgreSQL (tests/postgres.py), below the HTTP layer: a page is
written once whoever replays it, a lease that is not renewed lets another worker claim its range, two
workers never hold the same range, and a cancelled job's ranges are not claimed."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import subprocess
import sys
import time
import uuid

import psycopg
import pytest

from ocr_app.jobs import schema
from ocr_app.jobs.store import JobStore


@pytest.fixture
def url(postgres, request):
    name = request.node.name  # a database each (a parameter's too): no test sees another's
    url = postgres.create_database(f"store_{name[5:30]}_{hashlib.sha256(name.encode()).hexdigest()[:8]}")
    with psycopg.connect(url, autocommit=True) as conn:
        assert schema.upgrade(conn) == [m[0] for m in schema.MIGRATIONS]
        assert schema.upgrade(conn) == []  # applied once
        assert schema.status(conn) == schema.LATEST
    return url


def run(url: str, scenario) -> object:
    async def main():
        store = JobStore(url)
        await store.open()
        try:
            return await scenario(store)
        finally:
            await store.close()

    return asyncio.run(main())


async def new_job(store: JobStore, owner: str, pages: list[int], range_pages: int = 2):
    job_id, created = await store.create(owner, None, owner, "image/png", {}, pages, b"doc", range_pages, 100)
    assert created
    return job_id


def test_a_replayed_page_changes_nothing(url):
    async def scenario(store: JobStore):
        job_id = await new_job(store, "replay", [1, 2])
        claim = await store.ranges.claim("w1", 30)
        assert claim is not None and claim.job_id == job_id and claim.pages == [1, 2]
        assert await store.ranges.write_page(job_id, 1, '{"page": 1, "text": "first"}', None, "w1")
        assert not await store.ranges.write_page(job_id, 1, '{"page": 1, "text": "second"}', None, "w2")
        assert not await store.ranges.write_page(job_id, 1, None, {"code": "x", "message": "y"}, "w2")
        return [(r.page, r.result, r.error) for r in await store.finished_pages(job_id, 0)]

    assert run(url, scenario) == [(1, '{"page": 1, "text": "first"}', None)]


def test_an_expired_lease_is_claimed_by_another_worker_and_two_never_share_a_range(url):
    async def scenario(store: JobStore):
        job_id = await new_job(store, "lease", [1, 2, 3, 4])
        first = await store.ranges.claim("dead", 1)
        second = await store.ranges.claim("alive", 30)
        assert first is not None and second is not None
        assert {first.first_page, second.first_page} == {1, 3}  # SKIP LOCKED / leased: different ranges
        assert await store.ranges.claim("alive", 30) is None  # nothing else is claimable while leases hold
        deadline = time.monotonic() + 30
        # Polls the database's clock past the dead worker's lease (no event can say when it passes).
        while (again := await store.ranges.claim("alive", 30)) is None and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        assert again is not None and again.reclaimed and again.first_page == first.first_page
        assert not await store.ranges.keep(first, "dead", 30)  # the dead worker's lease is gone
        assert await store.ranges.keep(again, "alive", 30)
        return job_id

    run(url, scenario)


def test_a_cancelled_jobs_ranges_are_not_claimed(url):
    async def scenario(store: JobStore):
        job_id = await new_job(store, "cancel", [1, 2, 3])
        claim = await store.ranges.claim("w", 30)
        assert claim is not None and claim.job_id == job_id
        assert await store.cancel("cancel", job_id, 60)
        assert not await store.ranges.keep(claim, "w", 30)  # the running range stops before its next page
        assert await store.ranges.claim("w", 30) is None
        assert await store.ranges.document(job_id) is None
        assert await store.ranges.finish_range(claim, "w", 60) is None  # cancelled stays cancelled
        return (await store.status("cancel", job_id))["status"]

    assert run(url, scenario) == "cancelled"


def test_a_page_is_written_before_a_cancel_or_not_at_all(url):
    """The cancel holds the job's row; a page written meanwhile waits for it and is then dropped. A page
    written before the cancel stays, and is counted."""

    async def scenario(store: JobStore):
        job_id = await new_job(store, "race", [1, 2, 3])
        claim = await store.ranges.claim("w", 30)
        assert claim is not None and claim.pages == [1, 2]
        assert await store.ranges.write_page(job_id, 1, '{"page": 1}', None, "w")
        async with await psycopg.AsyncConnection.connect(url) as cancelling:
            await cancelling.execute(
                "SELECT 1 FROM ocr_jobs WHERE id = %s FOR UPDATE", (job_id,)
            )  # a cancel under way: JobStore.cancel's first statement, its transaction still open
            write = asyncio.create_task(store.ranges.write_page(job_id, 2, '{"page": 2}', None, "w"))
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as watch:
                sql = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s"
                deadline = time.monotonic() + 30
                while (await (await watch.execute(sql, ("INSERT INTO ocr_job_pages%",))).fetchone())[0] != 1:
                    assert time.monotonic() < deadline and not write.done(), "the write never waited"
                    await asyncio.sleep(0.02)
            await cancelling.execute("UPDATE ocr_jobs SET status = 'cancelled' WHERE id = %s", (job_id,))
            await cancelling.commit()
        assert not await write  # waited for the cancel, then dropped
        assert not await store.ranges.write_page(job_id, 3, '{"page": 3}', None, "w")
        status = await store.status("race", job_id)
        return status["pages"], [r.page for r in await store.finished_pages(job_id, 0)]

    assert run(url, scenario) == ({"total": 3, "done": 1, "failed": 0}, [1])


async def waiting_on_a_lock(url: str, query: str, task: asyncio.Task) -> None:
    """Until a session runs `query` (a LIKE pattern) waiting for a lock (pg_stat_activity's state, polled)."""
    sql = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s"
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as watch:
        deadline = time.monotonic() + 30
        while (await (await watch.execute(sql, (query,))).fetchone())[0] != 1:
            assert time.monotonic() < deadline and not task.done(), f"never waited: {query}"
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("action", ["cancel", "purge"])
def test_a_cancel_or_purge_beside_a_claim_waits_for_it_and_neither_deadlocks(url, action):
    """Ranges.claim locks a range's row, then updates its job's; a cancel or purge beside it takes the ranges
    first too, so it waits for the claim instead of holding the job's row the claim needs (PostgreSQL would
    abort one of the two after deadlock_timeout: the client's cancel answered 503, or the claim lost)."""

    async def scenario(store: JobStore):
        job_id = await new_job(store, "order", [1, 2, 3, 4])
        async with await psycopg.AsyncConnection.connect(url) as claiming:
            await claiming.execute(  # the claim's first statement, its transaction still open
                "SELECT 1 FROM ocr_job_ranges WHERE job_id = %s AND first_page = 1 FOR UPDATE", (job_id,)
            )
            task = asyncio.create_task(
                getattr(store, action)("order", job_id, *([60] if action == "cancel" else []))
            )
            first = "UPDATE ocr_job_ranges%" if action == "cancel" else "DELETE FROM ocr_job_ranges%"
            await waiting_on_a_lock(url, first, task)
            await claiming.execute(  # the claim's second statement: the job's row, free
                "UPDATE ocr_jobs SET status = 'running' WHERE id = %s AND status IN ('queued', 'running')",
                (job_id,),
            )
            await claiming.commit()
        assert await task
        return await store.status("order", job_id)

    status = run(url, scenario)
    if action == "purge":
        assert status is None
    else:
        assert status is not None and status["status"] == "cancelled"


def test_a_finish_beside_a_cancel_waits_for_it_and_neither_deadlocks(url):
    """finish_range takes its range's row, then the job's: a cancel that holds the job's ranges is waited
    for; the range is then cancelled, not done, and the job stays cancelled."""

    async def scenario(store: JobStore):
        job_id = await new_job(store, "finish", [1, 2])
        claim = await store.ranges.claim("w", 30)
        assert claim is not None and await store.ranges.write_page(job_id, 1, '{"page": 1}', None, "w")
        async with await psycopg.AsyncConnection.connect(url) as cancelling:
            await cancelling.execute(  # JobStore.cancel's first statement, its transaction still open
                "UPDATE ocr_job_ranges SET state = 'cancelled'"
                " WHERE job_id = %s AND state IN ('queued', 'leased')",
                (job_id,),
            )
            finish = asyncio.create_task(store.ranges.finish_range(claim, "w", 60))
            await waiting_on_a_lock(url, "UPDATE ocr_job_ranges%", finish)
            await cancelling.execute("SELECT 1 FROM ocr_jobs WHERE id = %s FOR UPDATE", (job_id,))
            await cancelling.execute("UPDATE ocr_jobs SET status = 'cancelled' WHERE id = %s", (job_id,))
            await cancelling.commit()
        assert await finish is None  # nothing finished by it
        status = await store.status("finish", job_id)
        return status["status"], status["pages"]

    assert run(url, scenario) == ("cancelled", {"total": 2, "done": 1, "failed": 0})


# Run by the previous release's Python (its ocr_app/ first on sys.path): a job's whole way through its store.
PREVIOUS_RELEASE_JOB = """
import asyncio, sys
sys.path.insert(0, sys.argv[1])
from ocr_app.jobs.store import JobStore
from ocr_app.jobs import schema

async def main():
    store = JobStore(sys.argv[2])
    await store.open()
    try:
        assert await store.check_schema() > schema.LATEST and store.refusal() is None
        job_id, created = await store.create("old", "k", "f", "image/png", {}, [1, 2], b"doc", 2, 10)
        claim = await store.claim("old-worker", 30)
        assert created and claim is not None and claim.job_id == job_id
        for page in (1, 2):
            assert await store.write_page(job_id, page, '{"page": %d}' % page, None, "old-worker")
        assert await store.finish_range(claim, "old-worker", 60) == "done"
        print(job_id)
    finally:
        await store.close()

asyncio.run(main())
"""


def test_the_previous_release_works_on_this_schema(url, tmp_path):
    """During a rolling upgrade both releases run on one database, upgraded to this release's schema: the
    previous release (tests/previous_release.txt) creates, claims, writes and finishes a job on it, and this
    release lists it."""
    from .test_settings_kit import _previous_release

    previous = _previous_release(tmp_path / "previous")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run(
        [sys.executable, "-I", "-c", PREVIOUS_RELEASE_JOB, str(previous), url],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    job_id = r.stdout.strip()

    async def scenario(store: JobStore):
        return await store.list_jobs("old", None, 10, None)

    listed = run(url, scenario)
    assert [(j["job_id"], j["status"], j["pages"]) for j in listed] == [
        (job_id, "done", {"total": 2, "done": 2, "failed": 0})
    ]


def test_a_finished_jobs_document_is_kept_until_it_expires(url):
    """format=pdf of a job's result is built from its document: kept once the job is done, read back in
    chunks, deleted with the job when it expires (sweep) or is purged."""

    async def scenario(store: JobStore):
        body = bytes(range(256)) * 40  # 10 240 bytes: chunks of 4096 end in a short one
        job_id, _ = await store.create("keep", None, "keep", "image/png", {}, [1], body, 1, 100)
        purged, _ = await store.create("keep", None, "keep2", "image/png", {}, [1], b"doc", 1, 100)
        for _ in range(2):
            claim = await store.ranges.claim("w", 30)
            assert claim is not None
            await store.ranges.write_page(claim.job_id, 1, '{"page": 1}', None, "w")
            assert await store.ranges.finish_range(claim, "w", 0.5) == "done"
        assert await store.document_info(job_id) == ("image/png", len(body))
        assert b"".join([c async for c in store.document_chunks(job_id, len(body), 4096)]) == body
        assert await store.purge("keep", purged) and await store.document_info(purged) is None
        async with store.pool.connection() as conn:  # its results expire (ttl 0.5 s, by the database clock)
            await conn.execute(
                "UPDATE ocr_jobs SET expires_at = now() - interval '1 s' WHERE id = %s", (job_id,)
            )
        assert await store.sweep() == 1
        return await store.document_info(job_id)

    assert run(url, scenario) is None


# --- what each read returns, each limit at the limit and one past (expectations written by hand) --------


def test_create_splits_ranges_keeps_keys_and_counts_jobs_in_flight(url):
    from ocr_app.errors import IdempotencyConflict, TooManyJobs

    async def scenario(store: JobStore):
        body = b"%PDF-1.4 five pages"
        made, created = await store.create(
            "o", "key", "fp", "application/pdf", {"lang": "en"}, [1, 2, 3, 4, 5], body, 2, 3, "https://h/x"
        )
        assert created
        # The same key and document: the same job, not made again; another document: a conflict.
        assert await store.create("o", "key", "fp", "application/pdf", {}, [1], b"x", 2, 3) == (made, False)
        with pytest.raises(IdempotencyConflict):
            await store.create("o", "key", "other", "application/pdf", {}, [1], b"x", 2, 3)
        assert await store.idempotent("o", "key") == (made, "fp")
        assert await store.idempotent("o", "nokey") is None
        assert await store.idempotent("someone else", "key") is None
        # max_in_flight 3: a second and a third job (no key) are taken, the fourth is one past.
        second, created = await store.create("o", None, "fp2", "image/png", {}, [1], b"p", 2, 3)
        assert created and second != made
        third, created = await store.create("o", None, "fp2", "image/png", {}, [1], b"p", 2, 3)
        assert created and third not in (made, second)
        with pytest.raises(TooManyJobs) as refused:
            await store.create("o", None, "fp2", "image/png", {}, [1], b"p", 2, 3)
        assert "this API key has 3 jobs queued or running" in refused.value.message
        async with store.pool.connection() as conn:
            ranges = await (
                await conn.execute(
                    "SELECT first_page, pages, state FROM ocr_job_ranges WHERE job_id = %s"
                    " ORDER BY first_page",
                    (made,),
                )
            ).fetchall()
            hooks = await (await conn.execute("SELECT job_id, url FROM ocr_job_webhooks")).fetchall()
            jobs = await (await conn.execute("SELECT count(*) FROM ocr_jobs WHERE owner = 'o'")).fetchone()
        return ranges, hooks, jobs, made

    ranges, hooks, jobs, made = run(url, scenario)
    # 5 pages by 2: 1-2, 3-4 and a short last range, 5.
    assert ranges == [(1, [1, 2], "queued"), (3, [3, 4], "queued"), (5, [5], "queued")]
    assert hooks == [(made, "https://h/x")]  # the jobs without a webhook_url have none
    assert jobs == (3,)


def test_a_job_reads_back_as_written(url):
    async def scenario(store: JobStore):
        job_id = await new_job(store, "reader", [1, 2, 3], range_pages=3)
        assert await store.job_state(job_id) == "queued"
        assert await store.pages_of("reader", job_id) == [1, 2, 3]
        assert await store.pages_of("another", job_id) is None
        claim = await store.ranges.claim("w", 30)
        assert claim is not None and claim.pages == [1, 2, 3]
        assert await store.ranges.write_page(job_id, 1, '{"page": 1}', None, "w")
        assert await store.ranges.write_page(job_id, 2, None, {"code": "bad", "message": "no"}, "w")
        assert await store.ranges.write_page(job_id, 3, '{"page": 3}', None, "w")
        status = await store.status("reader", job_id)
        assert await store.status("another", job_id) is None
        async with store.pool.connection() as conn:
            created, started = await (
                await conn.execute("SELECT created_at, started_at FROM ocr_jobs WHERE id = %s", (job_id,))
            ).fetchone()
        after_1 = [(r.page, r.result, r.error) for r in await store.finished_pages(job_id, 1)]
        streamed = [(r.page, r.result, r.error) async for r in store.stream_pages(job_id, batch=2)]
        listed = await store.list_jobs("reader", None, 10, None)
        return job_id, status, created, started, after_1, streamed, listed

    job_id, status, created, started, after_1, streamed, listed = run(url, scenario)
    assert status == {
        "job_id": str(job_id),
        "status": "running",
        "pages": {"total": 3, "done": 2, "failed": 1},
        "created_at": created.isoformat(),
        "started_at": started.isoformat(),
        "finished_at": None,
        "expires_at": None,
        "errors": [{"page": 2, "error": {"code": "bad", "message": "no"}}],
    }
    assert after_1 == [(2, None, {"code": "bad", "message": "no"}), (3, '{"page": 3}', None)]
    assert streamed == [
        (1, '{"page": 1}', None),
        (2, None, {"code": "bad", "message": "no"}),
        (3, '{"page": 3}', None),
    ]
    assert [(j["job_id"], j["status"], j["pages"], j["created_at"], j["started_at"]) for j in listed] == [
        (str(job_id), "running", {"total": 3, "done": 2, "failed": 1}, created, started.isoformat())
    ]
    assert run(url, lambda store: store.job_state(uuid.uuid4())) is None


def test_list_jobs_newest_first_by_status_and_after_a_cursor(url):
    async def scenario(store: JobStore):
        ids = [await new_job(store, "lister", [1]) for _ in range(3)]
        await new_job(store, "other", [1])
        assert await store.cancel("lister", ids[1], 60)
        every = await store.list_jobs("lister", None, 10, None)
        two = await store.list_jobs("lister", [], 2, None)  # no statuses: every status
        cancelled = await store.list_jobs("lister", ["cancelled"], 10, None)
        queued = await store.list_jobs("lister", ["queued", "running"], 10, None)
        after = await store.list_jobs(
            "lister", None, 10, (every[0]["created_at"], uuid.UUID(every[0]["job_id"]))
        )
        return ids, every, two, cancelled, queued, after

    ids, every, two, cancelled, queued, after = run(url, scenario)

    def listed(jobs):
        return [uuid.UUID(j["job_id"]) for j in jobs]

    newest_first = ids[::-1]
    assert listed(every) == newest_first
    assert listed(two) == newest_first[:2]
    assert listed(cancelled) == [ids[1]] and cancelled[0]["finished_at"] is not None
    assert listed(queued) == [ids[2], ids[0]]
    assert listed(after) == newest_first[1:]


def test_a_document_is_read_in_chunks_at_its_length_and_one_past(url):
    async def scenario(store: JobStore):
        body = bytes(range(256)) * 32  # 8192 bytes
        job_id, _ = await store.create("chunks", None, "c", "image/png", {}, [1], body, 1, 100)
        assert await store.document_info(job_id) == ("image/png", 8192)
        assert await store.document_info(uuid.uuid4()) is None
        whole = [c async for c in store.document_chunks(job_id, 8192, 4096)]  # a multiple of the chunk
        short = [c async for c in store.document_chunks(job_id, 8192, 8191)]  # one under: a 1-byte tail
        one = [c async for c in store.document_chunks(job_id, 8192, 8192)]
        # Purged after the first chunk: the rest is not read (the caller sees the length it got).
        got = []
        async for chunk in store.document_chunks(job_id, 8192, 1000):
            got.append(chunk)
            if len(got) == 1:
                assert await store.purge("chunks", job_id)
        return body, whole, short, one, got

    body, whole, short, one, got = run(url, scenario)
    assert whole == [body[:4096], body[4096:]]
    assert short == [body[:8191], body[8191:]] and len(short[1]) == 1
    assert one == [body]
    assert got == [body[:1000]]


def test_cancel_and_purge_answer_for_what_there_is(url):
    async def scenario(store: JobStore):
        done = await new_job(store, "ending", [1], range_pages=1)
        claim = await store.ranges.claim("w", 30)
        assert claim is not None and claim.job_id == done
        assert await store.ranges.write_page(done, 1, '{"page": 1}', None, "w")
        assert await store.ranges.finish_range(claim, "w", 60) == "done"
        queued = await new_job(store, "ending", [1])
        assert await store.cancel("ending", done, 60)  # finished already: nothing to cancel, and no error
        assert await store.cancel("ending", queued, 60)
        assert not await store.cancel("ending", uuid.uuid4(), 60)
        assert not await store.cancel("someone else", queued, 60)
        states = [await store.job_state(done), await store.job_state(queued)]
        kept = await store.document_info(done)
        assert not await store.purge("someone else", done)
        assert not await store.purge("ending", uuid.uuid4())
        assert await store.purge("ending", done)
        return states, kept, await store.job_state(done)

    states, kept, gone = run(url, scenario)
    assert states == ["done", "cancelled"]
    assert kept == ("image/png", 3)  # a done job's document stays (format=pdf)
    assert gone is None


def test_stats_count_waiting_pages_and_the_oldest_ones_age(url):
    async def scenario(store: JobStore):
        first = await new_job(store, "stats", [1, 2, 3], range_pages=2)  # ranges 1-2 and 3
        await new_job(store, "stats", [1])
        cancelled = await new_job(store, "stats", [1, 2])
        assert await store.cancel("stats", cancelled, 60)
        async with store.pool.connection() as conn:
            await conn.execute(
                "UPDATE ocr_job_ranges SET queued_at = now() - interval '100 s' WHERE job_id = %s", (first,)
            )
        return await store.stats()

    by_status, waiting, age = run(url, scenario)
    assert by_status == {"queued": 2, "cancelled": 1}
    assert waiting == 4  # 3 + 1 pages; the cancelled job's are not waiting
    assert isinstance(waiting, int) and isinstance(age, float)
    assert 100 <= age < 160


# --- reachable or not, the schema's version, a bounded wait -------------------------------------------


def unreachable_url(tmp_path) -> str:
    return f"postgresql://ocr@/nodb?host={tmp_path}"  # no server's socket there: refused at once


def test_the_pool_is_made_closed_and_opens_without_waiting_for_the_database(tmp_path):
    async def scenario():
        made = []
        for timeout_s in (0.5, 2.0, 2.01, 3.5):
            store = JobStore(unreachable_url(tmp_path), max_connections=5, timeout_s=timeout_s)
            made.append((store.pool.closed, store.pool.min_size, store.pool.max_size, store.pool.timeout))
            made.append(store.pool.kwargs["connect_timeout"])
            # Opens in the background: an instance starts while its database is down (a bound, not a
            # timing: pool.open(wait=True) would wait 30 s and then fail).
            await asyncio.wait_for(store.open(), 10)
            made.append(store.pool.closed)
            await store.close()
        return made

    made = asyncio.run(scenario())
    # libpq counts under 2 s as 2 s: 2 at the most, rounded up past it.
    assert made == [
        (True, 1, 5, 0.5), 2, False,
        (True, 1, 5, 2.0), 2, False,
        (True, 1, 5, 2.01), 3, False,
        (True, 1, 5, 3.5), 4, False,
    ]  # fmt: skip


def test_a_connection_runs_autocommit_with_the_tcp_liveness_bounds(url):
    async def scenario(store: JobStore):
        async with store.pool.connection() as conn:
            options = {o.keyword.decode(): (o.val or b"").decode() for o in conn.pgconn.info}
            autocommit = conn.autocommit
        # A statement outside a transaction is kept: another connection sees it.
        await store.create("seen", None, "s", "image/png", {}, [1], b"d", 1, 10)
        with psycopg.connect(url) as other:
            count = other.execute("SELECT count(*) FROM ocr_jobs WHERE owner = 'seen'").fetchone()
        return options, autocommit, count

    options, autocommit, count = run(url, scenario)
    assert autocommit and count == (1,)
    # 10 s unacknowledged, or an idle connection's 3 keepalives 2 s apart after 10 s idle (the comment's).
    assert {k: options[k] for k in ("tcp_user_timeout", "keepalives", "keepalives_idle")} == {
        "tcp_user_timeout": "10000",
        "keepalives": "1",
        "keepalives_idle": "10",
    }
    assert (options["keepalives_interval"], options["keepalives_count"]) == ("2", "3")


def test_an_unreachable_database_refuses_until_it_answers_and_each_change_is_logged_once(
    url, tmp_path, caplog
):
    async def scenario():
        store = JobStore(unreachable_url(tmp_path), timeout_s=0.2)
        seen = [(store.state(), store.refusal().message)]  # type: ignore[union-attr]
        await store.open()
        try:
            with caplog.at_level(logging.WARNING, logger="ocr_app.jobs"):
                await store.probe()
                logged = [jobs_log(caplog)]
                await store.probe()
                logged.append(jobs_log(caplog))
            seen.append((store.state(), store.refusal().message))  # type: ignore[union-attr]
            seen.append(store.probed.is_set())
        finally:
            await store.close()
        up = JobStore(url)
        await up.open()
        try:
            with caplog.at_level(logging.WARNING, logger="ocr_app.jobs"):
                await up.probe()  # the first answer: nothing to say
                logged.append(jobs_log(caplog))
                up.reachable = False  # as after a cut: the next probe that answers says so
                await up.probe()
                logged.append(jobs_log(caplog))
                await up.probe()
                logged.append(jobs_log(caplog))
            seen.append((up.reachable, up.state(), up.refusal(), up.schema_version))
        finally:
            await up.close()
        return seen, logged

    seen, logged = asyncio.run(scenario())
    assert seen[0] == ("connecting", "the job database has not been reached yet (database_url)")
    state, why = seen[1]
    assert state == "unreachable" and why.startswith("the job database ") and why.endswith("retry later")
    assert seen[2] is True
    assert seen[3] == (True, "ready", None, schema.LATEST)
    # Each change once, after the probe that saw it.
    unreachable, again = (
        ["job database unreachable"],
        ["job database unreachable", "job database reachable again"],
    )
    assert logged == [unreachable, unreachable, unreachable, again, again]


def jobs_log(caplog) -> list[str]:
    return [r.getMessage().split(":")[0] for r in caplog.records if r.name == "ocr_app.jobs"]


def test_a_schema_behind_refuses_the_job_routes_and_is_logged_once_per_version(postgres, caplog):
    empty = postgres.create_database("store_schema_empty")
    behind = postgres.create_database("store_schema_behind")
    with psycopg.connect(behind, autocommit=True) as conn:  # every migration but the last
        conn.execute(schema._VERSION_TABLE)
        for version, description, statement in schema.MIGRATIONS[:-1]:
            conn.execute(statement)
            conn.execute(
                "INSERT INTO ocr_schema_migrations (version, description) VALUES (%s, %s)",
                (version, description),
            )

    async def scenario(db_url: str):
        store = JobStore(db_url)
        await store.open()
        try:
            with caplog.at_level(logging.ERROR, logger="ocr_app.jobs"):
                versions = [await store.check_schema()]
                logged = [len(jobs_log(caplog))]
                versions.append(await store.check_schema())
                logged.append(len(jobs_log(caplog)))
            return versions, logged, store.state(), store.refusal().message  # type: ignore[union-attr]
        finally:
            await store.close()

    at = schema.LATEST - 1
    expected = {
        empty: (0, f"the job database's schema is at version 0, this release needs {schema.LATEST}"),
        behind: (at, f"the job database's schema is at version {at}, this release needs {schema.LATEST}"),
    }
    for db_url, (version, message) in expected.items():
        caplog.clear()
        versions, logged, state, refusal = asyncio.run(scenario(db_url))
        assert versions == [version, version] and state == "schema_behind"
        assert refusal.startswith(message + ": run `ocr-app db upgrade`")
        assert jobs_log(caplog) == ["job routes refused"]
        assert logged == [1, 1]  # by the first check, not again by the second


def test_a_ready_schema_logs_no_refusal(url, caplog):
    async def scenario(store: JobStore):
        with caplog.at_level(logging.ERROR, logger="ocr_app.jobs"):
            return await store.check_schema(), store.state(), store.refusal()

    assert run(url, scenario) == (schema.LATEST, "ready", None)
    assert not [r for r in caplog.records if r.name == "ocr_app.jobs"]


def test_bounded_answers_within_its_bound_and_leaves_the_work_to_end(url):
    """A database error is JobsUnavailable naming its class; work past timeout_s is JobsUnavailable now and
    is cancelled; a caller cancelled while it waits cancels the work too. Nothing is reported as lost."""
    from ocr_app.errors import JobsUnavailable

    async def scenario(store: JobStore):
        loop = asyncio.get_running_loop()
        reported: list[dict] = []
        loop.set_exception_handler(lambda _loop, context: reported.append(context))
        store.timeout_s = 0.2

        async def bad_statement():
            async with store.pool.connection() as conn:
                await conn.execute("SELECT * FROM no_such_table")

        with pytest.raises(JobsUnavailable) as err:
            await store.bounded(bad_statement())
        assert err.value.message == "the job database is unavailable (UndefinedTable); retry later"

        ended: list[str] = []

        async def slow():
            try:
                await asyncio.Event().wait()  # never set: only a cancel ends it
            except asyncio.CancelledError:
                ended.append("cancelled")
                raise

        with pytest.raises(JobsUnavailable) as err:
            await store.bounded(slow())
        assert err.value.message == (
            "the job database did not answer within 0.2 s (job_db_timeout_s); retry later"
        )
        for _ in range(5):
            await asyncio.sleep(0)
        assert ended == ["cancelled"] and not store._abandoned

        store.timeout_s = 30
        caller = asyncio.ensure_future(store.bounded(slow()))
        for _ in range(5):
            await asyncio.sleep(0)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        for _ in range(5):
            await asyncio.sleep(0)
        assert ended == ["cancelled", "cancelled"] and not store._abandoned

        async def failing():
            await asyncio.sleep(0)
            try:
                await asyncio.Event().wait()
            finally:
                raise RuntimeError("ended badly")

        store.timeout_s = 0.2
        with pytest.raises(JobsUnavailable):
            await store.bounded(failing())
        for _ in range(5):
            await asyncio.sleep(0)
        import gc

        gc.collect()
        assert await store.bounded(asyncio.sleep(0, "answer")) == "answer"
        return reported

    assert run(url, scenario) == []
