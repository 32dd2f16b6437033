"""The job store's guarantees, on the real PostgreSQL (tests/postgres.py), below the HTTP layer: a page is
written once whoever replays it, a lease that is not renewed lets another worker claim its range, two
workers never hold the same range, and a cancelled job's ranges are not claimed."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import time

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
