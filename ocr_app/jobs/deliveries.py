"""Webhook deliveries (ocr_job_webhooks): a finished job's POST, claimed with a lease by any instance's
webhook senders (worker.py), one attempt at a time, its outcome recorded. The row is written with its job
(JobStore.create) and becomes due once the job is finished; webhooks.py says what is sent and when again.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from psycopg_pool import AsyncConnectionPool


# mutation: ReplaceTrueWithFalse here is equivalent: nothing assigns to a delivery's fields.
@dataclass(frozen=True)
class Delivery:
    """A webhook delivery claimed for one attempt (this one: `attempts`, counted from 1)."""

    id: uuid.UUID
    job_id: uuid.UUID
    owner: str
    url: str
    attempts: int


class Deliveries:
    """The delivery rows, on the job store's connection pool."""

    def __init__(self, pool: AsyncConnectionPool):
        self.pool = pool

    async def claim(self, worker: str, lease_s: float) -> Delivery | None:
        """Lease the longest-due webhook delivery of a finished job: pending, its next attempt due, and not
        leased (or its sender's lease expired: that sender died). Its attempt is counted now."""
        async with self.pool.connection() as conn, conn.transaction():
            row = await (
                await conn.execute(
                    """
                    WITH c AS (
                        SELECT w.id, j.owner
                        FROM ocr_job_webhooks w JOIN ocr_jobs j ON j.id = w.job_id
                        WHERE w.state = 'pending' AND w.next_attempt_at <= now()
                          AND (w.lease_expires_at IS NULL OR w.lease_expires_at < now())
                          AND j.status IN ('done', 'failed', 'cancelled')
                        ORDER BY w.next_attempt_at
                        LIMIT 1
                        FOR UPDATE OF w SKIP LOCKED
                    )
                    UPDATE ocr_job_webhooks w
                    SET lease_owner = %s, lease_expires_at = now() + make_interval(secs => %s),
                        attempts = w.attempts + 1
                    FROM c WHERE w.id = c.id
                    RETURNING w.id, w.job_id, c.owner, w.url, w.attempts
                    """,
                    (worker, lease_s),
                )
            ).fetchone()
        return Delivery(*row) if row else None

    async def done(self, delivery: Delivery, state: str, status: int | None, error: str | None) -> None:
        """Record a final outcome: delivered or failed."""
        async with self.pool.connection() as conn:
            await conn.execute(
                "UPDATE ocr_job_webhooks SET state = %s, last_status = %s, last_error = %s,"
                " finished_at = now(), lease_owner = NULL, lease_expires_at = NULL"
                " WHERE id = %s AND state = 'pending'",
                (state, status, error, delivery.id),
            )

    async def retry(self, delivery: Delivery, after_s: float, status: int | None, error: str | None) -> None:
        """Another attempt after_s from now (by whichever instance claims it then)."""
        async with self.pool.connection() as conn:
            await conn.execute(
                "UPDATE ocr_job_webhooks SET last_status = %s, last_error = %s,"
                " next_attempt_at = now() + make_interval(secs => %s), lease_owner = NULL,"
                " lease_expires_at = NULL WHERE id = %s AND state = 'pending'",
                (status, error, after_s, delivery.id),
            )

    async def release(self, worker: str) -> int:
        """Give back the deliveries this sender was attempting when it stopped: due again at once, the
        interrupted attempt not counted."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "UPDATE ocr_job_webhooks SET lease_owner = NULL, lease_expires_at = NULL,"
                " attempts = greatest(attempts - 1, 0) WHERE lease_owner = %s AND state = 'pending'",
                (worker,),
            )
            return cur.rowcount
