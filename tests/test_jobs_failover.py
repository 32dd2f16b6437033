"""The job database failing over (`make test-app`): the app reaches it through a libpq multi-host URL with
target_session_attrs=read-write, as it reaches a Patroni pair (roles/ocr_app's ocr_app_database_hosts).

Two real local servers on 127.0.0.1: A, the primary, and B, a streaming hot standby of A (pg_basebackup -R).
The URL lists B first: libpq skips it while it is a standby (in_hot_standby) and keeps A. A job is held
mid-range in the engine; then the failover, in the order Patroni's makes it: A stops taking writes
(ALTER SYSTEM default_transaction_read_only + reload: its live sessions, the app's pool among them, now
answer writes with SQLSTATE 25006, and libpq skips it for a new connection); B replays A's WAL, is promoted.
No session is terminated: the app must leave A's live connections by itself. Replication, not a dump and
restore, puts the job on B: what the app had acknowledged is there because it was replicated before the
promotion, as with Patroni's synchronous mode.

The job ends with every page read (by the engine) and written once, every job route answered 200 or the
documented 503 jobs_unavailable with Retry-After, /healthz says job_store "unreachable" while no host takes
writes, and a new connection by the URL with A listed first lands on B.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import threading
import time
import uuid

import httpx
import psycopg
import pytest
from psycopg import errors

from ocr_app.jobs.store import JobStore, primary_lost

from .postgres import Cluster
from .test_errors import assert_error
from .test_jobs import StallServer, doc, submit, wait_status
from .test_jobs_db_away import wait_for

DB_TIMEOUT_S = 1.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def errors_of(url: str) -> dict[str, psycopg.Error]:
    """A real error of each class the boundary needs, made by the server: 25006 (a write in a read-only
    transaction), 23505 (a duplicate key), 25P02 (a statement in an aborted transaction: class 25 too)."""
    found: dict[str, psycopg.Error] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS u (k int PRIMARY KEY)")
        conn.execute("INSERT INTO u VALUES (1) ON CONFLICT DO NOTHING")
        for sqlstate, statements in {
            "25006": ["BEGIN READ ONLY", "INSERT INTO u VALUES (2)"],
            "23505": ["BEGIN", "INSERT INTO u VALUES (1)"],
            "25P02": ["BEGIN", "SELECT 1/0", "SELECT 1"],
        }.items():
            try:
                for s in statements:
                    with contextlib.suppress(errors.DivisionByZero):
                        conn.execute(s)
            except psycopg.Error as err:
                found[sqlstate] = err
            conn.execute("ROLLBACK")
    return found


def test_only_25006_is_a_lost_primary(postgres):
    found = errors_of(postgres.create_database("failover_classes"))
    assert {s: e.sqlstate for s, e in found.items()} == {s: s for s in ("25006", "23505", "25P02")}
    assert [s for s, e in found.items() if primary_lost(e)] == ["25006"]


def test_a_25006_drops_the_pools_connections_another_error_does_not(postgres):
    """Each error made on a pool connection, then which server session the next checkout gets: a new one
    after 25006 only (the pool was drained), the same one after 23505 and 25P02."""
    url = postgres.create_database("failover_pool")
    errors_of(url)  # the table

    async def scenario() -> dict[str, bool]:
        store = JobStore(url, max_connections=1, timeout_s=DB_TIMEOUT_S)
        await store.open()
        try:

            async def pid() -> int:
                async with store.pool.connection() as conn:
                    return conn.info.backend_pid

            async def fail(statements: list[str]) -> None:
                async with store.pool.connection() as conn, conn.transaction():
                    for s in statements:
                        try:
                            await conn.execute(s)
                        except errors.DivisionByZero:
                            await conn.execute("SELECT 1")  # 25P02

            changed = {}
            for sqlstate, statements in {
                "23505": ["INSERT INTO u VALUES (1)"],
                "25P02": ["SELECT 1/0"],  # the pool's own transaction: the error aborts it
                "25006": ["SET TRANSACTION READ ONLY", "INSERT INTO u VALUES (3)"],
            }.items():
                before = await pid()
                with pytest.raises(psycopg.Error) as caught:
                    await fail(statements)
                assert caught.value.sqlstate == sqlstate
                changed[sqlstate] = await pid() != before
            return changed
        finally:
            await store.close()

    assert asyncio.run(scenario()) == {"23505": False, "25P02": False, "25006": True}


def test_a_lost_connection_drops_the_others_to_the_same_server(postgres):
    """Two pooled connections, both ended by the server (pg_terminate_backend: as a killed primary's are):
    the first use fails, and the next gets a new connection, not the other dead one."""
    url = postgres.create_database("failover_lost")

    async def scenario() -> tuple[str, set[int], int]:
        store = JobStore(url, max_connections=2, timeout_s=DB_TIMEOUT_S)
        await store.open()
        try:
            both = asyncio.Event()
            pids: set[int] = set()

            async def hold() -> None:  # two at once: the pool holds two connections after
                async with store.pool.connection() as conn:
                    pids.add(conn.info.backend_pid)
                    if len(pids) == 2:
                        both.set()
                    await asyncio.wait_for(both.wait(), 10)

            await asyncio.gather(hold(), hold())
            with psycopg.connect(postgres.url("postgres"), autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(p) FROM unnest(%s::int[]) p", (sorted(pids),))
            with pytest.raises(psycopg.OperationalError) as lost:
                await store.job_state(uuid.uuid4())
            async with store.pool.connection() as conn:
                return lost.value.sqlstate or "", pids, conn.info.backend_pid
        finally:
            await store.close()

    sqlstate, dead, pid = asyncio.run(scenario())
    assert sqlstate == "57P01" and len(dead) == 2 and pid not in dead  # admin_shutdown


def test_a_read_only_database_is_unreachable_to_the_probe(postgres):
    """The probe reads only, and a read-only server answers reads: it asks whether writes are taken."""
    url = postgres.create_database("failover_probe")
    with psycopg.connect(postgres.url("postgres"), autocommit=True) as conn:
        conn.execute('ALTER DATABASE "failover_probe" SET default_transaction_read_only = on')

    async def scenario() -> tuple[str, str]:
        store = JobStore(url, max_connections=1, timeout_s=DB_TIMEOUT_S)
        await store.open()
        try:
            await store.probe()
            return store.state(), store.unreachable_why
        finally:
            await store.close()

    state, why = asyncio.run(scenario())
    assert state == "unreachable" and "ReadOnlySqlTransaction" in why, why


@pytest.fixture(scope="module")
def pair():
    a = Cluster(port=free_port()).start()
    try:
        with psycopg.connect(a.url("postgres"), autocommit=True) as conn:
            conn.execute('CREATE DATABASE "failover"')
        b = Cluster(port=free_port()).start(standby_of=a)
    except BaseException:
        a.stop()
        raise
    yield a, b
    b.stop()
    a.stop()


def hosts_url(*clusters: Cluster) -> str:
    hosts = ",".join(f"127.0.0.1:{c.port}" for c in clusters)
    return f"postgresql://ocr@{hosts}/failover?target_session_attrs=read-write"


def test_a_job_in_progress_survives_a_failover(tmp_path_factory, pair):
    a, b = pair
    srv = StallServer(
        tmp_path_factory.mktemp("failover"),
        database_url=hosts_url(b, a),  # the standby first: skipped
        job_poll_s=0.05,
        job_sweep_s=0.2,
        job_db_timeout_s=DB_TIMEOUT_S,
        engine="rapidocr",
        job_range_pages=2,
        job_max_inflight=1,
        # The held page's write is retried within it; were it given up, the range would be claimed again
        # once its lease expired and page 3 read twice.
        job_lease_s=8,
        max_job_pages=8,
    )
    # `ocr-app db upgrade` by the multi-host URL (on A), while the instance starts (it waits for the schema)
    upgrade = subprocess.Popen(
        [*srv.command, "db", "upgrade", "--config", str(srv.config_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    srv.control = tmp_path_factory.mktemp("failover-control")
    srv.start(env={"STALL_CONTROL": str(srv.control)})
    stop = threading.Event()
    try:
        out, err = upgrade.communicate(timeout=60)
        assert upgrade.returncode == 0 and "current" in out, err
        wait_for(lambda: srv.health().json()["job_store"] == "ready", "job_store ready", 30)
        c = srv.client(timeout=10)
        at = int(srv.metrics()["ocr_engine_pages_total"])
        (srv.control / "wedge_after").write_text(str(at + 2))  # pages 1 and 2 read, page 3 held
        r = submit(c, doc(6, "failover"))
        assert r.status_code == 202, r.text
        job_id = r.json()["job_id"]
        wait_status(c, job_id, lambda s: s["pages"]["done"] == 2)

        answers: list[httpx.Response] = []

        def poll() -> None:
            with srv.client(timeout=10) as pc:
                while not stop.is_set():
                    answers.append(pc.get(f"/v1/jobs/{job_id}"))
                    time.sleep(0.01)  # a poll interval: the machine's cores are shared

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()

        with psycopg.connect(a.url("postgres"), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET default_transaction_read_only = on")
            conn.execute("SELECT pg_reload_conf()")
            lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        # No host takes writes now: the job routes refuse, the instance says why and stays in service.
        wait_for(lambda: srv.health().json()["job_store"] == "unreachable", "job_store unreachable", 30)
        assert srv.health().status_code == 200
        refused = submit(c, doc(1, "between"))
        assert_error(refused, 503, "jobs_unavailable")
        assert refused.headers["retry-after"].isdigit()

        # Page 3 read now: its result cannot be written anywhere; the worker holds it and tries again.
        (srv.control / "wedge_after").unlink()
        wait_for(lambda: "write failed, retrying" in srv.logs(), "a page write retried", 20)

        with psycopg.connect(b.url("postgres"), autocommit=True) as conn:
            caught_up = "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn"
            wait_for(lambda: conn.execute(caught_up, (lsn,)).fetchone()[0], "B replayed A's WAL", 30)
            assert conn.execute("SELECT pg_promote(true, 30)").fetchone()[0] is True

        # (a 503 jobs_unavailable meanwhile: the pool reconnects with its back-off)
        wait_status(c, job_id, lambda s: s.get("status") == "done")
        stop.set()
        poller.join(10)

        codes = sorted({r.status_code for r in answers})
        assert codes == [200, 503], codes  # the window without a writable host, then B
        for r in answers:
            if r.status_code == 503:
                assert_error(r, 503, "jobs_unavailable")
                assert r.headers["retry-after"].isdigit()
        assert int(srv.metrics()["ocr_engine_pages_total"]) - at == 6  # every page read once
        # The job, acknowledged on A before the switch, is on B with every page once.
        with psycopg.connect(b.url("failover")) as conn:
            status = conn.execute("SELECT status FROM ocr_jobs WHERE id = %s", (job_id,)).fetchone()
            rows = conn.execute(
                "SELECT page FROM ocr_job_pages WHERE job_id = %s ORDER BY page", (job_id,)
            ).fetchall()
        assert status == ("done",) and [p for (p,) in rows] == [1, 2, 3, 4, 5, 6]
        # libpq skips a server whose default_transaction_read_only is on, listed first.
        with psycopg.connect(hosts_url(a, b)) as conn:
            assert conn.info.port == b.port
        logs = srv.logs()
        assert "job database read-only" in logs and "Traceback" not in logs
        refusals = sum(r.status_code == 503 for r in answers)
        print(f"[failover] {len(answers)} status reads during the failover, {refusals} answered 503")
    finally:
        stop.set()
        assert srv.stop() == 0, srv.logs()[-2000:]
