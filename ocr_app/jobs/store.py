"""The job store: every read and write of job state, on PostgreSQL (psycopg 3, a connection pool).

Leases are timed by the database's clock (now()), so the hosts' clocks never have to agree. A range is
`queued` -> `leased` (lease_owner, lease_expires_at) -> `done`; a lease not renewed in time lets any
instance claim the range again; a cancelled job's unfinished ranges become `cancelled`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from ..errors import IdempotencyConflict, JobsUnavailable, TooManyJobs
from . import schema
from .deliveries import Deliveries

log = logging.getLogger("ocr_app.jobs")

FINISHED = ("done", "failed", "cancelled")


@dataclass(frozen=True)
class Claim:
    job_id: uuid.UUID
    first_page: int
    pages: list[int]
    content_type: str
    options: dict[str, Any]
    reclaimed: bool  # its previous owner's lease had expired


@dataclass(frozen=True)
class PageRow:
    page: int
    result: str | None  # the page's JSON as /v1/ocr returns it
    error: dict[str, str] | None  # {code, message}


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


class JobStore:
    def __init__(self, database_url: str, max_connections: int = 8):
        # Opened in the background: an instance starts (and serves /v1/ocr) while the database is down.
        self.pool = AsyncConnectionPool(
            database_url,
            min_size=1,
            max_size=max_connections,
            open=False,
            kwargs={"autocommit": True},
            name="ocr-jobs",
        )
        self.schema_version: int | None = None  # None: not read yet
        self.deliveries = Deliveries(self.pool)  # the webhooks' rows, on the same pool

    async def open(self) -> None:
        await self.pool.open(wait=False)

    async def close(self) -> None:
        await self.pool.close()

    # The reasons the job routes refuse, checked on every request.
    def refusal(self) -> JobsUnavailable | None:
        if self.schema_version is None:
            return JobsUnavailable("the job database has not been reached yet (database_url)")
        if self.schema_version < schema.LATEST:
            return JobsUnavailable(schema.behind_message(self.schema_version))
        return None

    async def check_schema(self) -> int:
        async with self.pool.connection() as conn:
            row = await (await conn.execute(schema.HAS_VERSIONS_SQL)).fetchone()
            if row and row[0]:
                row = await (await conn.execute(schema.VERSION_SQL)).fetchone()
                version = int(row[0]) if row else 0
            else:
                version = 0
        if version != self.schema_version and version < schema.LATEST:
            log.error("job routes refused: %s", schema.behind_message(version))
        self.schema_version = version
        return version

    # --- the API's side -------------------------------------------------------------------------------

    async def create(
        self,
        owner: str,
        idempotency_key: str | None,
        fingerprint: str,
        content_type: str,
        options: dict[str, Any],
        pages: list[int],
        body: bytes,
        range_pages: int,
        max_in_flight: int,
        webhook_url: str | None = None,
    ) -> tuple[uuid.UUID, bool]:
        """The job's id and whether it was created now (False: the same key sent the same job before).
        With a webhook_url, its delivery row is written with the job: it is due once the job is finished."""
        job_id = uuid.uuid4()
        async with self.pool.connection() as conn, conn.transaction():
            # One caller's submissions take turns: the in-flight count and the key's lookup hold.
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext('ocr_jobs:' || %s))", (owner,))
            if idempotency_key is not None:
                row = await (
                    await conn.execute(
                        "SELECT id, fingerprint FROM ocr_jobs WHERE owner = %s AND idempotency_key = %s",
                        (owner, idempotency_key),
                    )
                ).fetchone()
                if row is not None:
                    if row[1] != fingerprint:
                        raise IdempotencyConflict()
                    return row[0], False
            row = await (
                await conn.execute(
                    "SELECT count(*) FROM ocr_jobs WHERE owner = %s AND status IN ('queued', 'running')",
                    (owner,),
                )
            ).fetchone()
            if row is not None and row[0] >= max_in_flight:
                raise TooManyJobs(max_in_flight)
            await conn.execute(
                "INSERT INTO ocr_jobs (id, owner, idempotency_key, fingerprint, content_type, options,"
                " status, pages) VALUES (%s, %s, %s, %s, %s, %s, 'queued', %s)",
                (job_id, owner, idempotency_key, fingerprint, content_type, Jsonb(options), pages),
            )
            await conn.execute("INSERT INTO ocr_job_documents (job_id, body) VALUES (%s, %s)", (job_id, body))
            ranges = [pages[i : i + range_pages] for i in range(0, len(pages), range_pages)]
            async with conn.cursor() as cur:
                await cur.executemany(
                    "INSERT INTO ocr_job_ranges (job_id, first_page, pages, state)"
                    " VALUES (%s, %s, %s, 'queued')",
                    [(job_id, r[0], r) for r in ranges],
                )
            if webhook_url is not None:
                await conn.execute(
                    "INSERT INTO ocr_job_webhooks (id, job_id, url) VALUES (%s, %s, %s)",
                    (uuid.uuid4(), job_id, webhook_url),
                )
        return job_id, True

    async def status(self, owner: str, job_id: uuid.UUID) -> dict[str, Any] | None:
        """The job as GET /v1/jobs/{id} shows it, or None (no such job, or another key's)."""
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            job = await (
                await cur.execute(
                    "SELECT id, status, cardinality(pages) AS total, created_at, started_at, finished_at,"
                    " expires_at FROM ocr_jobs WHERE id = %s AND owner = %s",
                    (job_id, owner),
                )
            ).fetchone()
            if job is None:
                return None
            counts = await (
                await cur.execute(
                    "SELECT count(*) FILTER (WHERE error IS NULL) AS done,"
                    " count(*) FILTER (WHERE error IS NOT NULL) AS failed"
                    " FROM ocr_job_pages WHERE job_id = %s",
                    (job_id,),
                )
            ).fetchone()
            errors = await (
                await cur.execute(
                    "SELECT page, error FROM ocr_job_pages"
                    " WHERE job_id = %s AND error IS NOT NULL ORDER BY page",
                    (job_id,),
                )
            ).fetchall()
        assert counts is not None
        return {
            "job_id": str(job["id"]),
            "status": job["status"],
            "pages": {"total": job["total"], "done": counts["done"], "failed": counts["failed"]},
            "created_at": _iso(job["created_at"]),
            "started_at": _iso(job["started_at"]),
            "finished_at": _iso(job["finished_at"]),
            "expires_at": _iso(job["expires_at"]),
            "errors": errors,
        }

    async def pages_of(self, owner: str, job_id: uuid.UUID) -> list[int] | None:
        async with self.pool.connection() as conn:
            row = await (
                await conn.execute("SELECT pages FROM ocr_jobs WHERE id = %s AND owner = %s", (job_id, owner))
            ).fetchone()
        return row[0] if row else None

    async def job_state(self, job_id: uuid.UUID) -> str | None:
        async with self.pool.connection() as conn:
            row = await (
                await conn.execute("SELECT status FROM ocr_jobs WHERE id = %s", (job_id,))
            ).fetchone()
        return row[0] if row else None

    async def finished_pages(self, job_id: uuid.UUID, after: int) -> list[PageRow]:
        """The pages written so far with a number above `after`, in page order."""
        async with self.pool.connection() as conn:
            rows = await (
                await conn.execute(
                    "SELECT page, result, error FROM ocr_job_pages"
                    " WHERE job_id = %s AND page > %s ORDER BY page",
                    (job_id, after),
                )
            ).fetchall()
        return [PageRow(*r) for r in rows]

    async def stream_pages(self, job_id: uuid.UUID, batch: int = 32) -> AsyncIterator[PageRow]:
        """Every written page in page order, a batch at a time (a server-side cursor: memory stays flat)."""
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(name="ocr_job_result")
            await cur.execute(
                "SELECT page, result, error FROM ocr_job_pages WHERE job_id = %s ORDER BY page", (job_id,)
            )
            while rows := await cur.fetchmany(batch):
                for r in rows:
                    yield PageRow(*r)

    async def cancel(self, owner: str, job_id: uuid.UUID, ttl_s: float) -> bool:
        """Cancel a queued or running job: its ranges not yet finished are not run. False: no such job."""
        async with self.pool.connection() as conn, conn.transaction():
            row = await (
                await conn.execute(
                    "SELECT status FROM ocr_jobs WHERE id = %s AND owner = %s FOR UPDATE", (job_id, owner)
                )
            ).fetchone()
            if row is None:
                return False
            if row[0] in FINISHED:
                return True
            await conn.execute(
                "UPDATE ocr_jobs SET status = 'cancelled', finished_at = now(),"
                " expires_at = now() + make_interval(secs => %s) WHERE id = %s",
                (ttl_s, job_id),
            )
            await conn.execute(
                "UPDATE ocr_job_ranges SET state = 'cancelled', lease_owner = NULL, lease_expires_at = NULL"
                " WHERE job_id = %s AND state IN ('queued', 'leased')",
                (job_id,),
            )
            await conn.execute("DELETE FROM ocr_job_documents WHERE job_id = %s", (job_id,))
        return True

    # --- the worker's side ----------------------------------------------------------------------------

    async def claim(self, worker: str, lease_s: float) -> Claim | None:
        """Lease the oldest claimable range: queued, or leased by an owner whose lease has expired."""
        async with self.pool.connection() as conn, conn.transaction():
            row = await (
                await conn.execute(
                    """
                    WITH c AS (
                        SELECT r.job_id, r.first_page, r.state AS was
                        FROM ocr_job_ranges r JOIN ocr_jobs j ON j.id = r.job_id
                        WHERE (r.state = 'queued' OR (r.state = 'leased' AND r.lease_expires_at < now()))
                          AND j.status IN ('queued', 'running')
                        ORDER BY r.queued_at, r.job_id, r.first_page
                        LIMIT 1
                        FOR UPDATE OF r SKIP LOCKED
                    )
                    UPDATE ocr_job_ranges r
                    SET state = 'leased', lease_owner = %s,
                        lease_expires_at = now() + make_interval(secs => %s), claims = r.claims + 1
                    FROM c WHERE r.job_id = c.job_id AND r.first_page = c.first_page
                    RETURNING r.job_id, r.first_page, r.pages, c.was
                    """,
                    (worker, lease_s),
                )
            ).fetchone()
            if row is None:
                return None
            job = await (
                await conn.execute(
                    "UPDATE ocr_jobs SET status = 'running', started_at = coalesce(started_at, now())"
                    " WHERE id = %s AND status IN ('queued', 'running') RETURNING content_type, options",
                    (row[0],),
                )
            ).fetchone()
            assert job is not None  # the claim's join saw it queued or running, and holds its range
        return Claim(row[0], row[1], row[2], job[0], job[1], reclaimed=row[3] == "leased")

    async def document(self, job_id: uuid.UUID) -> bytes | None:
        async with self.pool.connection() as conn:
            row = await (
                await conn.execute("SELECT body FROM ocr_job_documents WHERE job_id = %s", (job_id,))
            ).fetchone()
        return bytes(row[0]) if row else None

    async def written(self, job_id: uuid.UUID, pages: list[int]) -> set[int]:
        """Which of these pages have a result already (a reclaimed range's earlier owner wrote them)."""
        async with self.pool.connection() as conn:
            rows = await (
                await conn.execute(
                    "SELECT page FROM ocr_job_pages WHERE job_id = %s AND page = ANY(%s)", (job_id, pages)
                )
            ).fetchall()
        return {r[0] for r in rows}

    async def keep(self, claim: Claim, worker: str, lease_s: float) -> bool:
        """Renew this range's lease; False when it is no longer ours (expired and reclaimed, or the job was
        cancelled): the range's remaining pages are then not started."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "UPDATE ocr_job_ranges SET lease_expires_at = now() + make_interval(secs => %s)"
                " WHERE job_id = %s AND first_page = %s AND lease_owner = %s AND state = 'leased'",
                (lease_s, claim.job_id, claim.first_page, worker),
            )
            return cur.rowcount == 1

    async def write_page(
        self, job_id: uuid.UUID, page: int, result: str | None, error: dict[str, str] | None, worker: str
    ) -> bool:
        """Record a page's result once; a replay (the range ran twice) changes nothing. True: written now."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "INSERT INTO ocr_job_pages (job_id, page, result, error, worker) VALUES (%s, %s, %s, %s, %s)"
                " ON CONFLICT (job_id, page) DO NOTHING",
                (job_id, page, result, Jsonb(error) if error is not None else None, worker),
            )
            return cur.rowcount == 1

    async def finish_range(self, claim: Claim, worker: str, ttl_s: float) -> str | None:
        """Mark the range done; when it was the job's last, the job is done (failed: no page could be read).
        Returns the job's new status when this call finished it."""
        async with self.pool.connection() as conn, conn.transaction():
            # The job's row first: two workers finishing its last two ranges take turns, and the second
            # sees the first's range done.
            await conn.execute("SELECT 1 FROM ocr_jobs WHERE id = %s FOR UPDATE", (claim.job_id,))
            await conn.execute(
                "UPDATE ocr_job_ranges SET state = 'done', lease_owner = NULL, lease_expires_at = NULL"
                " WHERE job_id = %s AND first_page = %s AND lease_owner = %s AND state = 'leased'",
                (claim.job_id, claim.first_page, worker),
            )
            row = await (
                await conn.execute(
                    """
                    UPDATE ocr_jobs j SET
                        status = CASE WHEN EXISTS (
                            SELECT 1 FROM ocr_job_pages p WHERE p.job_id = j.id AND p.error IS NULL
                        ) THEN 'done' ELSE 'failed' END,
                        finished_at = now(), expires_at = now() + make_interval(secs => %s)
                    WHERE j.id = %s AND j.status IN ('queued', 'running')
                      AND NOT EXISTS (
                          SELECT 1 FROM ocr_job_ranges r WHERE r.job_id = j.id AND r.state <> 'done'
                      )
                    RETURNING j.status
                    """,
                    (ttl_s, claim.job_id),
                )
            ).fetchone()
            if row is not None:
                await conn.execute("DELETE FROM ocr_job_documents WHERE job_id = %s", (claim.job_id,))
        return row[0] if row else None

    async def release(self, worker: str, claim: Claim | None = None) -> int:
        """Give leases back (draining, stopping, a transient failure): the ranges are queued again at once."""
        sql = (
            "UPDATE ocr_job_ranges SET state = 'queued', lease_owner = NULL, lease_expires_at = NULL"
            " WHERE lease_owner = %s AND state = 'leased'"
        )
        params: tuple[object, ...] = (worker,)
        if claim is not None:
            sql += " AND job_id = %s AND first_page = %s"
            params += (claim.job_id, claim.first_page)
        async with self.pool.connection() as conn:
            return (await conn.execute(sql, params)).rowcount

    # --- the timer's side -----------------------------------------------------------------------------

    async def sweep(self) -> int:
        """Delete the jobs whose results have expired (their pages and ranges go with them)."""
        async with self.pool.connection() as conn:
            return (await conn.execute("DELETE FROM ocr_jobs WHERE expires_at < now()")).rowcount

    async def stats(self) -> tuple[dict[str, int], int, float]:
        """Fleet-wide: jobs by status, pages waiting for a worker, the oldest waiting range's age (s)."""
        async with self.pool.connection() as conn:
            by_status: dict[str, int] = dict(
                await (await conn.execute("SELECT status, count(*) FROM ocr_jobs GROUP BY status")).fetchall()
            )
            row = await (
                await conn.execute(
                    "SELECT coalesce(sum(cardinality(pages)), 0),"
                    " coalesce(extract(epoch FROM now() - min(queued_at)), 0)"
                    " FROM ocr_job_ranges"
                    " WHERE state = 'queued' OR (state = 'leased' AND lease_expires_at < now())"
                )
            ).fetchone()
        assert row is not None
        return by_status, int(row[0]), float(row[1])


def unavailable(err: psycopg.Error) -> JobsUnavailable:
    log.warning("job database error: %s", type(err).__name__)
    return JobsUnavailable("the job database is unavailable; retry later")
