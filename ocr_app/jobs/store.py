"""The job store: every read and write of job state, on PostgreSQL (psycopg 3, a connection pool).

Leases are timed by the database's clock (now()), so the hosts' clocks never have to agree. A range is
`queued` -> `leased` (lease_owner, lease_expires_at) -> `done`; a lease not renewed in time lets any
instance claim the range again; a cancelled job's unfinished ranges become `cancelled`.

Several database hosts (a libpq multi-host URL with target_session_attrs=read-write, e.g.
postgresql://ocr@db-1:5432,db-2:5432/ocr?target_session_attrs=read-write): libpq keeps the first host that
accepts writes, but checks that only when a connection is made. A primary demoted under live connections
answers their writes with SQLSTATE 25006 (read_only_sql_transaction); a killed one drops them. On a 25006
(and when the probe finds the server read-only), and on a connection found broken, every connection of the
pool is dropped (AsyncConnectionPool.drain: they all lead to the server that is gone), and the new ones go
to whichever host is writable now. Meanwhile the error is the unavailable path's: 503
jobs_unavailable for a request, a retry for a worker.

Lock order: a transaction that locks both a job's ranges and its job row takes the ranges' rows first
(claim, finish_range, cancel, purge), so that two of them wait for each other in turn and never deadlock
(PostgreSQL would abort one after deadlock_timeout: a cancel answered 503, a claim lost).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg import errors, sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from ..errors import IdempotencyConflict, JobsUnavailable, TooManyJobs
from ..schemas import JobStoreState
from . import schema
from .deliveries import Deliveries
from .ranges import Ranges

log = logging.getLogger("ocr_app.jobs")

T = TypeVar("T")
# A TCP connection to the database that stops answering (a cut, a host gone) fails within seconds instead of
# waiting on TCP's retransmissions (minutes): sent data unacknowledged for 10 s, or an idle connection whose
# keepalive probes go unanswered for 10 + 3 x 2 s. The pool then drops it and opens a fresh one once the
# database answers, so no statement waits on a connection from before a cut. Unix sockets ignore these.
_TCP_LIVENESS = {
    "tcp_user_timeout": 10_000,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 2,
    "keepalives_count": 3,
}
FINISHED = ("done", "failed", "cancelled")

# The job a key's Idempotency-Key made, and its fingerprint: read by create (in its transaction)
# and by idempotent.
_BY_IDEMPOTENCY_KEY = "SELECT id, fingerprint FROM ocr_jobs WHERE owner = %s AND idempotency_key = %s"


def primary_lost(err: BaseException) -> bool:
    """The server no longer takes writes (a demoted primary, a standby, default_transaction_read_only):
    SQLSTATE 25006 alone. Any other error, of class 25 or not, says nothing of the server."""
    return isinstance(err, errors.ReadOnlySqlTransaction)


class _Pool(AsyncConnectionPool):
    """The pool, dropping all its connections when one of them finds its server read-only or gone."""

    @asynccontextmanager
    async def connection(
        self,
        timeout: float | None = None,  # noqa: ASYNC109 (the base class's signature)
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        held: psycopg.AsyncConnection[Any] | None = None
        try:
            async with super().connection(timeout) as conn:
                held = conn
                yield conn
        except psycopg.Error as err:
            if primary_lost(err):
                await self.primary_moved()
            elif held is not None and held.broken:
                # Its server went away (killed, restarted as a standby by Patroni): the pool's other
                # connections to it are dead too, and each would fail a request before being discarded.
                await self.drain()
            raise

    # mutation: ReplaceUnaryOperator_USub_Not equivalent because 0 logs the first warning too: monotonic()
    # (the host's uptime) is past a minute before a job database can have been demoted.
    _moved_logged_at = -math.inf

    async def primary_moved(self) -> None:
        # Once a minute at most: a URL without target_session_attrs=read-write reconnects to the same
        # read-only server, and the probe finds it so each job_poll_s (its own warning says when that ends).
        # mutation: NumberReplacer equivalent because it moves a log line's rate by a second a minute.
        # mutation: ReplaceComparisonOperator_Gt_GtE equivalent likewise (a tie of floats to the ns).
        if time.monotonic() - self._moved_logged_at > 60:
            self._moved_logged_at = time.monotonic()
            log.warning("job database read-only (a demoted primary?): reconnecting to the writable host")
        await self.drain()  # idle connections closed now, those in use when given back


# mutation: ReplaceTrueWithFalse here is equivalent because nothing assigns to a page row's fields.
@dataclass(frozen=True)
class PageRow:
    page: int
    result: str | None  # the page's JSON as /v1/ocr returns it
    error: dict[str, str] | None  # {code, message}


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


class JobStore:
    # mutation: NumberReplacer here is equivalent because the service passes both (ocr_app/jobs/service.py):
    # the defaults are the tests' only.
    def __init__(self, database_url: str, max_connections: int = 8, timeout_s: float = 2.0):
        self.timeout_s = timeout_s
        # Opened in the background: an instance starts (and serves /v1/ocr) while the database is down. A
        # connection is waited for at most timeout_s, and made within it (libpq counts less than 2 s as 2 s;
        # this overrides a connect_timeout in the URL). With several hosts psycopg tries them in turn, each
        # within that time: a host that does not answer delays each new connection by it.
        self.pool = _Pool(
            database_url,
            min_size=1,
            max_size=max_connections,
            open=False,
            timeout=timeout_s,
            kwargs={"autocommit": True, "connect_timeout": max(2, math.ceil(timeout_s)), **_TCP_LIVENESS},
            name="ocr-jobs",
        )
        self.schema_version: int | None = None  # None: not read yet
        self.reachable: bool | None = None  # the last probe's answer; None: not probed yet
        self.unreachable_why = ""
        self.probed = asyncio.Event()  # set once the first probe has answered, either way
        self.deliveries = Deliveries(self.pool)  # the webhooks' rows, on the same pool
        self.ranges = Ranges(self.pool)  # the workers' side: claims, leases, page writes
        self._abandoned: set[asyncio.Future[Any]] = set()

    async def open(self) -> None:
        await self.pool.open(wait=False)

    async def close(self) -> None:
        await self.pool.close()

    async def bounded(self, work: Awaitable[T]) -> T:
        """work's result within timeout_s, else JobsUnavailable (a database error too). A statement on a
        frozen or cut-off server outlives its cancellation (psycopg asks the server to cancel it and waits up
        to 10 s before it drops the connection): it is left to end on its own; the caller is answered now."""
        task = asyncio.ensure_future(work)
        try:
            done, _ = await asyncio.wait({task}, timeout=self.timeout_s)
        except asyncio.CancelledError:
            self._abandon(task)
            raise
        if not done:
            self._abandon(task)
            raise JobsUnavailable(
                f"the job database did not answer within {self.timeout_s:g} s (job_db_timeout_s); retry later"
            )
        try:
            return task.result()
        except psycopg.Error as err:  # the pool's own timeout (PoolTimeout) included
            raise unavailable(err) from None

    def _abandon(self, task: asyncio.Future[Any]) -> None:
        task.cancel()
        self._abandoned.add(task)  # referenced until it ends; its outcome read, so never reported as lost
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Future[Any]) -> None:
        self._abandoned.discard(task)
        if not task.cancelled():
            task.exception()  # read, so that asyncio never reports it as lost

    async def probe(self) -> None:
        """Whether the database answers, and its schema version: /healthz's job_store, the job routes'
        and the workers' go-ahead. Logged when the answer changes, never once per probe."""
        try:
            await self.bounded(self.check_schema())
        except JobsUnavailable as err:
            if self.reachable is not False:
                log.warning("job database unreachable: %s", err.message)
            self.reachable, self.unreachable_why = False, err.message
        else:
            if self.reachable is False:
                log.warning("job database reachable again")
            self.reachable = True
        self.probed.set()

    def state(self) -> JobStoreState:  # /healthz's job_store (ocr_app/schemas.py says what each means)
        if self.reachable is False:
            return "unreachable"
        if self.schema_version is None:
            return "connecting"
        if self.schema_version < schema.LATEST:
            return "schema_behind"
        return "ready"

    # The reasons the job routes refuse, checked on every request.
    def refusal(self) -> JobsUnavailable | None:
        if self.reachable is False:
            return JobsUnavailable(self.unreachable_why)
        if self.schema_version is None:
            return JobsUnavailable("the job database has not been reached yet (database_url)")
        if self.schema_version < schema.LATEST:
            return JobsUnavailable(schema.behind_message(self.schema_version))
        return None

    async def check_schema(self) -> int:
        async with self.pool.connection() as conn:
            # A read-only server answers reads: found here, not at the next write (an idle instance).
            row = await (await conn.execute("SHOW transaction_read_only")).fetchone()
            # mutation: NumberReplacer to `row[ -1]` equivalent because the row has one column.
            if row is not None and row[0] == "on":
                raise errors.ReadOnlySqlTransaction("the job database is read-only (a standby?)")
            row = await (await conn.execute(schema.HAS_VERSIONS_SQL)).fetchone()
            # mutation: NumberReplacer to `row[ -1]` equivalent because the row has one column.
            if row and row[0]:
                row = await (await conn.execute(schema.VERSION_SQL)).fetchone()
                # mutation: NumberReplacer to `row[ -1]` equivalent because the row has one column.
                # mutation: NumberReplacer to `else 1` equivalent because an aggregate without GROUP BY
                # always returns its one row: the else is never taken.
                # mutation: NumberReplacer to `else -1` equivalent likewise.
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
                        _BY_IDEMPOTENCY_KEY,
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
            # mutation: NumberReplacer to `row[ -1]` equivalent because the row has one column.
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

    async def idempotent(self, owner: str, idempotency_key: str) -> tuple[uuid.UUID, str] | None:
        """The job this key already made, with its fingerprint (create checks again, in its transaction)."""
        async with self.pool.connection() as conn:
            row = await (
                await conn.execute(
                    _BY_IDEMPOTENCY_KEY,
                    (owner, idempotency_key),
                )
            ).fetchone()
        return (row[0], row[1]) if row else None

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
        # mutation: NumberReplacer to `row[ -1]` equivalent because the row has one column.
        return row[0] if row else None

    async def job_state(self, job_id: uuid.UUID) -> str | None:
        async with self.pool.connection() as conn:
            row = await (
                await conn.execute("SELECT status FROM ocr_jobs WHERE id = %s", (job_id,))
            ).fetchone()
        # mutation: NumberReplacer to `row[ -1]` equivalent because the row has one column.
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

    # mutation: NumberReplacer here is equivalent because the batch sets how many rows one round trip
    # fetches, not which rows or in what order.
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

    async def document_info(self, job_id: uuid.UUID) -> tuple[str, int] | None:
        """The job's document's content type and length in bytes; None when it is gone (cancelled)."""
        async with self.pool.connection() as conn:
            row = await (
                await conn.execute(
                    "SELECT j.content_type, octet_length(d.body) FROM ocr_jobs j"
                    " JOIN ocr_job_documents d ON d.job_id = j.id WHERE j.id = %s",
                    (job_id,),
                )
            ).fetchone()
        return (row[0], row[1]) if row else None

    async def document_chunks(self, job_id: uuid.UUID, length: int, chunk: int) -> AsyncIterator[bytes]:
        """The job's document, `chunk` bytes at a time (substring: never the whole body in this process).
        Ends early if the document goes meanwhile (a purge): the caller checks the length it got."""
        async with self.pool.connection() as conn:
            for offset in range(0, length, chunk):
                row = await (
                    await conn.execute(
                        "SELECT substring(body FROM %s FOR %s) FROM ocr_job_documents WHERE job_id = %s",
                        (offset + 1, chunk, job_id),
                    )
                ).fetchone()
                if row is None:
                    return
                # mutation: NumberReplacer to `row[ -1]` equivalent because the row has one column.
                yield bytes(row[0])

    async def cancel(self, owner: str, job_id: uuid.UUID, ttl_s: float) -> bool:
        """Cancel a queued or running job: its ranges not yet finished are not run, and a page being read now
        is not written (write_page). False: no such job."""
        async with self.pool.connection() as conn, conn.transaction():
            # The ranges first (the lock order above): a claim or a finish under way ends before this goes on.
            await conn.execute(
                "UPDATE ocr_job_ranges r SET state = 'cancelled', lease_owner = NULL, lease_expires_at = NULL"
                " FROM ocr_jobs j WHERE j.id = r.job_id AND j.id = %s AND j.owner = %s"
                " AND j.status IN ('queued', 'running') AND r.state IN ('queued', 'leased')",
                (job_id, owner),
            )
            row = await (
                await conn.execute(
                    "SELECT status FROM ocr_jobs WHERE id = %s AND owner = %s FOR UPDATE", (job_id, owner)
                )
            ).fetchone()
            if row is None:
                return False
            # mutation: NumberReplacer to `row[ -1]` equivalent because the row has one column.
            if row[0] in FINISHED:
                # Finished between the two statements (its last range was done: none was cancelled above).
                return True
            await conn.execute(
                "UPDATE ocr_jobs SET status = 'cancelled', finished_at = now(),"
                " expires_at = now() + make_interval(secs => %s) WHERE id = %s",
                (ttl_s, job_id),
            )
            await conn.execute("DELETE FROM ocr_job_documents WHERE job_id = %s", (job_id,))
        return True

    async def purge(self, owner: str, job_id: uuid.UUID) -> bool:
        """Delete the job now, with its document, pages, ranges and webhook delivery (ON DELETE CASCADE):
        a worker reading one of its pages loses its lease and writes nothing. False: no such job."""
        async with self.pool.connection() as conn, conn.transaction():
            # The ranges first (the lock order above), then the job and, by cascade, the rest.
            await conn.execute(
                "DELETE FROM ocr_job_ranges r USING ocr_jobs j"
                " WHERE j.id = r.job_id AND j.id = %s AND j.owner = %s",
                (job_id, owner),
            )
            cur = await conn.execute("DELETE FROM ocr_jobs WHERE id = %s AND owner = %s", (job_id, owner))
            return cur.rowcount == 1

    async def list_jobs(
        self,
        owner: str,
        statuses: Sequence[str] | None,
        limit: int,
        before: tuple[datetime, uuid.UUID] | None,
    ) -> list[dict[str, Any]]:
        """The owner's jobs, newest first (created_at, then id, both descending), at most `limit`, those
        older than `before` (the last one of the previous page) only. Index ocr_jobs_owner_created."""
        where = [sql.SQL("owner = %s")]
        params: list[Any] = [owner]
        if statuses:
            where.append(sql.SQL("status = ANY(%s)"))
            params.append(list(statuses))
        if before is not None:
            where.append(sql.SQL("(created_at, id) < (%s, %s)"))
            params += [before[0], before[1]]
        params.append(limit)
        query = sql.SQL(
            "SELECT j.id, j.status, cardinality(j.pages) AS total, j.created_at, j.started_at,"
            " j.finished_at, j.expires_at, c.done, c.failed"
            " FROM (SELECT * FROM ocr_jobs WHERE {} ORDER BY created_at DESC, id DESC LIMIT %s) j,"
            " LATERAL (SELECT count(*) FILTER (WHERE error IS NULL) AS done,"
            "  count(*) FILTER (WHERE error IS NOT NULL) AS failed"
            "  FROM ocr_job_pages p WHERE p.job_id = j.id) c"
            " ORDER BY j.created_at DESC, j.id DESC"
        ).format(sql.SQL(" AND ").join(where))
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            rows = await (await cur.execute(query, params)).fetchall()
        return [
            {
                "job_id": str(r["id"]),
                "status": r["status"],
                "pages": {"total": r["total"], "done": r["done"], "failed": r["failed"]},
                "created_at": r["created_at"],
                "started_at": _iso(r["started_at"]),
                "finished_at": _iso(r["finished_at"]),
                "expires_at": _iso(r["expires_at"]),
            }
            for r in rows
        ]

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
    # The error's class only: its message may name the host, never the password, but it is the operator's.
    return JobsUnavailable(f"the job database is unavailable ({type(err).__name__}); retry later")
