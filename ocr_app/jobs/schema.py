"""The job store's schema: versioned migrations, applied only by `ocr-app db upgrade`.

The app never migrates at start: an instance whose release expects a newer schema refuses job requests
(503, saying to run the upgrade) until an operator has run it, and an older release keeps working on a
newer schema only as far as each migration keeps it compatible (add, never rename or drop in place).
"""

from __future__ import annotations

import psycopg

# (version, what it does, SQL). Append only: a released migration is never edited.
MIGRATIONS: list[tuple[int, str, str]] = [
    (
        1,
        "jobs, their documents, page ranges with leases, page results",
        """
        CREATE TABLE ocr_jobs (
            id uuid PRIMARY KEY,
            owner text NOT NULL,                 -- the API key's name: a job is visible to it only
            idempotency_key text,
            fingerprint text NOT NULL,           -- sha256 of the document and its options
            content_type text NOT NULL,
            options jsonb NOT NULL,              -- preview, max_tokens
            status text NOT NULL CHECK (status IN ('queued', 'running', 'done', 'failed', 'cancelled')),
            pages int[] NOT NULL,                -- the selected 1-based page numbers, ascending
            created_at timestamptz NOT NULL DEFAULT now(),
            started_at timestamptz,
            finished_at timestamptz,
            expires_at timestamptz,              -- finished_at + job_result_ttl_s: deleted then
            UNIQUE (owner, idempotency_key)
        );
        CREATE INDEX ocr_jobs_owner_status ON ocr_jobs (owner, status);
        CREATE INDEX ocr_jobs_expires_at ON ocr_jobs (expires_at) WHERE expires_at IS NOT NULL;

        -- Deleted as soon as the job is finished: no longer needed, and the largest rows.
        CREATE TABLE ocr_job_documents (
            job_id uuid PRIMARY KEY REFERENCES ocr_jobs (id) ON DELETE CASCADE,
            body bytea NOT NULL
        );

        CREATE TABLE ocr_job_ranges (
            job_id uuid NOT NULL REFERENCES ocr_jobs (id) ON DELETE CASCADE,
            first_page int NOT NULL,
            pages int[] NOT NULL,
            state text NOT NULL CHECK (state IN ('queued', 'leased', 'done', 'cancelled')),
            lease_owner text,
            lease_expires_at timestamptz,
            claims int NOT NULL DEFAULT 0,
            queued_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (job_id, first_page)
        );
        CREATE INDEX ocr_job_ranges_open ON ocr_job_ranges (queued_at) WHERE state IN ('queued', 'leased');

        -- One row per page, written once: a replayed range's INSERT ... ON CONFLICT DO NOTHING is a no-op.
        CREATE TABLE ocr_job_pages (
            job_id uuid NOT NULL REFERENCES ocr_jobs (id) ON DELETE CASCADE,
            page int NOT NULL,
            result text,                         -- the page's JSON exactly as /v1/ocr returns it
            error jsonb,                         -- {code, message} when the page could not be read
            worker text NOT NULL,                -- which instance wrote it
            finished_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (job_id, page),
            CHECK ((result IS NULL) <> (error IS NULL))
        );
        """,
    ),
    (
        2,
        "webhook deliveries of finished jobs",
        # A new table only: a release at version 1 neither reads nor writes it. The row is written with the
        # job (at submit) and becomes due when the job is finished, whichever release finishes it.
        """
        CREATE TABLE ocr_job_webhooks (
            id uuid PRIMARY KEY,                 -- X-OCR-Webhook-Id: the same on every attempt
            job_id uuid NOT NULL UNIQUE REFERENCES ocr_jobs (id) ON DELETE CASCADE,
            url text NOT NULL,
            state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
            attempts int NOT NULL DEFAULT 0,     -- counted when claimed: an attempt whose sender died counts
            next_attempt_at timestamptz NOT NULL DEFAULT now(),
            lease_owner text,
            lease_expires_at timestamptz,
            last_status int,                     -- the receiver's HTTP status at the last attempt
            last_error text,                     -- or why there was none (time-out, connection)
            finished_at timestamptz
        );
        CREATE INDEX ocr_job_webhooks_pending ON ocr_job_webhooks (next_attempt_at) WHERE state = 'pending';
        """,
    ),
    (
        3,
        "a key's jobs newest first (GET /v1/jobs)",
        # An index only: a release at version 2 writes the same rows and never sees it. Built in the
        # upgrade's transaction (a short write lock on ocr_jobs, whose finished rows expire).
        """
        CREATE INDEX ocr_jobs_owner_created ON ocr_jobs (owner, created_at DESC, id DESC);
        """,
    ),
]
LATEST = MIGRATIONS[-1][0]

_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS ocr_schema_migrations (
    version int PRIMARY KEY,
    description text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


# Two statements: a relation is resolved when a statement is planned, whatever its CASE would run.
HAS_VERSIONS_SQL = "SELECT to_regclass('ocr_schema_migrations') IS NOT NULL"
VERSION_SQL = "SELECT coalesce(max(version), 0) FROM ocr_schema_migrations"


def status(conn: psycopg.Connection) -> int:
    """The schema version the database is at (0: none)."""
    row = conn.execute(HAS_VERSIONS_SQL).fetchone()
    if not row or not row[0]:
        return 0
    row = conn.execute(VERSION_SQL).fetchone()
    return int(row[0]) if row else 0


def upgrade(conn: psycopg.Connection) -> list[int]:
    """Apply the migrations the database lacks, all or none (one transaction); returns those applied.
    Upgrades run at once take turns (an advisory lock), so each migration runs once."""
    applied = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('ocr_schema_migrations'))")
        conn.execute(_VERSION_TABLE)
        at = status(conn)
        for version, description, sql in MIGRATIONS:
            if version <= at:
                continue
            conn.execute(sql)
            conn.execute(
                "INSERT INTO ocr_schema_migrations (version, description) VALUES (%s, %s)",
                (version, description),
            )
            applied.append(version)
    return applied


def behind_message(at: int) -> str:
    return (
        f"the job database's schema is at version {at}, this release needs {LATEST}: "
        "run `ocr-app db upgrade` (with this instance's settings)"
    )
