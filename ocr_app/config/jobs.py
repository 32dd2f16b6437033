"""The bulk jobs' settings: the job database, the work's share of the instance, results and webhooks."""

from __future__ import annotations

from pydantic import BaseModel, Field

from .base import MiB, default_doc


class JobSettings(BaseModel):
    """Bulk jobs on PostgreSQL and their webhooks."""

    # Bulk jobs (ocr_app/jobs/): PostgreSQL holds their state, every instance works them. Without
    # database_url the /v1/jobs routes answer 503. A libpq URL, e.g. postgresql://ocr@db/ocr?sslmode=verify-full
    # (a secret when it holds a password: never logged); a replicated database's hosts all in one, the
    # writable one wanted: postgresql://ocr@db-1:5432,db-2:5432/ocr?target_session_attrs=read-write.
    database_url: str | None = Field(
        None,
        description="The bulk-job database (PostgreSQL), a libpq URL, e.g. "
        "postgresql://ocr@db/ocr?sslmode=verify-full (a secret when it holds a password: never logged); "
        "a replicated database (e.g. Patroni): every host, and target_session_attrs=read-write, e.g. "
        "postgresql://ocr@db-1:5432,db-2:5432/ocr?target_session_attrs=read-write&sslmode=verify-full; "
        "none: the /v1/jobs routes answer 503.",
    )
    # A job route waits this long on the database (a pool connection, a statement) before it answers 503
    # jobs_unavailable; the instance's probe of the database, each job_poll_s, is bounded by it too.
    job_db_timeout_s: float = Field(
        2.0,
        ge=0.5,
        le=30.0,
        description="Seconds a job route waits on the job database before it answers 503 jobs_unavailable; "
        "also the bound of each probe of the database (/healthz's job_store) and of a new connection "
        "(at least 2 s: libpq's minimum).",
    )
    job_range_pages: int = Field(8, ge=1, le=1000, description="Pages per claim (a lease covers one range).")
    job_lease_s: float = Field(
        60.0,
        ge=1.0,
        description="Seconds a range's lease may go unrenewed before another instance claims the range.",
    )
    job_poll_s: float = Field(
        1.0,
        gt=0,
        description="Seconds between an idle worker's looks for ranges, an event stream's for pages, and the "
        "instance's probes of the job database.",
    )
    # Result-expiry timer and fleet-wide metrics run this often.
    job_sweep_s: float = Field(
        30.0,
        gt=0,
        description="Seconds between runs of the result-expiry timer and the fleet-wide job metrics.",
    )
    job_result_ttl_s: float = Field(
        24 * 3600.0,
        gt=0,
        description="Seconds a finished job (status, pages) is kept after it finished.",
    )
    # A finished job's pdf is built whole before its first byte (ocr_app/jobs/results.py: about 23 ms a dense
    # page on one core, so most of a minute for a job of max_job_pages). Past this its request is a 504 and
    # the build stops before its next step. nginx (+15 s) and HAProxy (+30 s) wait this long on a job's
    # result only (roles/nginx_tls, roles/ocr_lb: ocr_app_extra_config's, else this default).
    job_result_timeout_s: float = Field(
        300.0,
        gt=0,
        description="The longest a job's result may take to its first byte in seconds (a pdf is built whole "
        "first); past it the request is a 504 timeout. The proxies wait this long on a job's result.",
    )
    max_job_bytes: int = Field(200 * MiB, ge=1024, description="Largest job document in bytes.")
    max_job_pages: int = Field(2000, ge=1, le=100_000, description="Pages per job document.")
    max_jobs_in_flight: int = Field(8, ge=1, le=10_000, description="Jobs queued or running per API key.")
    # Job pages share the engine with interactive requests, which come first (Admission.background_may_start
    # is the rule): a job page starts only while at most job_max_interactive interactive requests are in
    # flight or waiting, an interactive request counting for job_yield_s after it ends (a client's next
    # request usually follows at once). None: the engine's (Settings.for_engine): on rapidocr 0, as a job page
    # (nice 19) started beside busy interactive ones would crawl, its range held; on vllm half the batch,
    # which has room beside them.
    job_max_interactive: int | None = Field(
        None,
        ge=0,
        le=4096,
        description="A job page starts only while at most this many interactive requests are in flight or "
        "waiting.",
        json_schema_extra=default_doc("the engine's: 0 on rapidocr, vllm_max_num_seqs / 2 on vllm"),
    )
    job_yield_s: float = Field(
        0.25,
        ge=0,
        le=60,
        description="Seconds an interactive request still counts after it ended (its client's next one "
        "usually follows).",
    )
    # Job pages in flight per instance (their own count: they never take an interactive slot); None: the
    # engine's, as max_concurrency's, so that job pages alone fill the batch (the CPU engine's pipeline).
    job_max_inflight: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="Job pages in flight per instance (a count of their own, not /v1/ocr slots).",
        json_schema_extra=default_doc("max_concurrency's"),
    )
    # The longest a job page may take, decode and engine: both run behind interactive work (decode workers
    # of their own and, on rapidocr, engine threads at nice 19; vLLM's queue), so on a busy instance a
    # job page may take longer than a request's deadline and still be read. Past it: a page error `timeout`.
    job_page_timeout_s: float = Field(
        120.0,
        gt=0,
        description="The longest a job page may take in seconds, decode and engine (both behind interactive "
        "work, so longer than request_timeout_s); past it the page's error is timeout.",
    )
    # Job pages at nice 19 (ocr_app/sched.py): decoded in workers of their own (preprocess_workers / 2) and,
    # on rapidocr, read on rapidocr_job_workers instances. False: they decode in the shared pool and take
    # turns on the workers at normal priority (for hosts that share one kernel's CPUs, where the lowest
    # priority is the lowest across all of them).
    job_idle_priority: bool = Field(
        True,
        description="Job pages at nice 19: decoded in workers of their own (preprocess_workers / 2) and, on "
        "rapidocr, read on rapidocr_job_workers instances; false: the shared decode pool and turns on the "
        "workers at normal priority (hosts that share one kernel's CPUs).",
    )
    # Webhooks (ocr_app/jobs/webhooks.py): a job's webhook_url must lie under one of these URL prefixes
    # (same scheme, host and port; the path at or below the prefix's). Empty: webhooks refused. An
    # allow-list, as the app POSTs from inside the fleet's network: a client must not make it call arbitrary
    # internal addresses.
    job_webhook_allowed_urls: list[str] = Field(
        default_factory=list,
        max_length=100,
        description="URL prefixes a job's webhook_url must lie under (same scheme, host and port; the path "
        "at or below the prefix's); empty: webhooks refused.",
    )
    # Signs the deliveries of jobs submitted without authentication (auth_disabled); None: sent unsigned. With
    # API keys each delivery is signed with its key's sha256 hex, never with this. A secret: never logged.
    job_webhook_secret: str | None = Field(
        None,
        min_length=16,
        description="Signs the webhooks of jobs submitted without authentication (with API keys each key's "
        "sha256 hex signs); none: unsigned. A secret: never logged.",
    )
    # Attempts per delivery: a 5xx, a time-out or no connection is retried after job_webhook_retry_base_s,
    # doubled each time (capped at 15 min, jittered): the default 8 spans about 10 min of receiver outage.
    job_webhook_max_attempts: int = Field(
        8,
        ge=1,
        le=100,
        description="Attempts per webhook delivery (a 5xx, a time-out or no connection is retried).",
    )
    job_webhook_retry_base_s: float = Field(
        5.0,
        gt=0,
        le=900,
        description="Seconds before a webhook's first retry, doubled for each next one (capped at 15 min, "
        "jittered).",
    )
    # Per attempt, connect to last byte: a receiver should answer at once and do its work afterwards.
    job_webhook_timeout_s: float = Field(
        10.0, gt=0, le=300, description="Seconds per webhook attempt, connect to last byte."
    )
    # A job's document by URL (ocr_app/jobs/fetch.py), fetched during POST /v1/jobs, and where the service
    # connects for a client (document URLs and webhooks, ocr_app/egress.py): public addresses only, unless a
    # host is opened here (an object store, an intranet server).
    job_url_timeout_s: float = Field(
        30.0,
        gt=0,
        le=600,
        description="Seconds to fetch a job's document by URL, redirects included (the submit waits for it).",
    )
    job_url_max_redirects: int = Field(
        5, ge=0, le=20, description="Redirects followed when fetching a job's document by URL."
    )
    job_url_allowed_hosts: list[str] = Field(
        default_factory=list,
        max_length=100,
        description="Hosts the service may reach for a client although not public (document URLs, "
        "webhooks): host names (exact) or IP networks (10.0.5.0/24, fd00::/8); none: public addresses only.",
    )
