"""The workers' side of the job store: a job's page ranges claimed with a lease, kept alive, given back, and
its pages written once. On the job store's connection pool (JobStore.ranges); store.py says how leases are
timed (the database's clock).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool


@dataclass(frozen=True)
class Claim:
    job_id: uuid.UUID
    first_page: int
    pages: list[int]
    content_type: str
    options: dict[str, Any]
    reclaimed: bool  # its previous owner's lease had expired


class Ranges:
    """The ranges' and pages' rows, on the job store's connection pool."""

    def __init__(self, pool: AsyncConnectionPool):
        self.pool = pool

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
        """Record a page's result once; a replay (the range ran twice) changes nothing. True: written now.

        Only while the job is queued or running: a page still being read when its job was cancelled (or
        purged) is dropped. The job's row is read FOR SHARE, so a cancel (which locks it FOR UPDATE) and this
        write take turns: a page written first is kept and counted, one written after is never written."""
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "INSERT INTO ocr_job_pages (job_id, page, result, error, worker)"
                " SELECT id, %s, %s, %s, %s FROM ocr_jobs"
                " WHERE id = %s AND status IN ('queued', 'running') FOR SHARE"
                " ON CONFLICT (job_id, page) DO NOTHING",
                (page, result, Jsonb(error) if error is not None else None, worker, job_id),
            )
            return cur.rowcount == 1

    async def finish_range(self, claim: Claim, worker: str, ttl_s: float) -> str | None:
        """Mark the range done; when it was the job's last, the job is done (failed: no page could be read).
        Returns the job's new status when this call finished it."""
        async with self.pool.connection() as conn, conn.transaction():
            # The range's row, then the job's (store.py's lock order). Two workers finishing the job's last
            # two ranges take turns on the job's row; the second's next statement sees the first's range done.
            await conn.execute(
                "UPDATE ocr_job_ranges SET state = 'done', lease_owner = NULL, lease_expires_at = NULL"
                " WHERE job_id = %s AND first_page = %s AND lease_owner = %s AND state = 'leased'",
                (claim.job_id, claim.first_page, worker),
            )
            await conn.execute("SELECT 1 FROM ocr_jobs WHERE id = %s FOR UPDATE", (claim.job_id,))
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
            # The document stays until the job expires (sweep) or is purged: format=pdf of the result is
            # built from it. A cancel deletes it at once.
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
