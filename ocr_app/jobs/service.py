"""What the job routes call: validation against the job limits, the store, the worker's lifecycle.

Every read filters by the caller's key name: another key's job is a 404, as one that does not exist.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime
from typing import Any

from .. import urls
from ..config import Settings
from ..documents.decode import DecodeRequest
from ..egress import Policy
from ..errors import (
    IdempotencyConflict,
    InvalidParameter,
    InvalidWebhook,
    JobNotFinished,
    JobNotFound,
    TooManyPages,
)
from ..metrics import Metrics
from ..ocr.formats import JSON, Format
from ..ocr.pipeline import Pipeline
from . import events, fetch, results
from .store import FINISHED, JobStore
from .worker import JobWorker, SecretOf

# A job's result: the pages that could not be read (comma-separated page numbers); absent when none.
FAILED_PAGES_HEADER = "OCR-Failed-Pages"

NO_DATABASE = (
    "bulk jobs need a PostgreSQL database: set database_url (env OCR_APP_DATABASE_URL) and run "
    "`ocr-app db upgrade` once"
)


def check_webhook_url(url: str | None, allowed: list[str]) -> None:
    """InvalidWebhook unless the URL lies under one of job_webhook_allowed_urls."""
    if url is None:
        return
    if not allowed:
        raise InvalidWebhook("webhooks are not enabled on this server (job_webhook_allowed_urls is empty)")
    if not urls.allowed(url, allowed):
        raise InvalidWebhook(
            "webhook_url must be an http(s) URL without user info under one of the server's "
            "job_webhook_allowed_urls"
        )


def _fingerprint(
    document: dict[str, str],
    selection: list[int] | None,
    preview: bool,
    max_tokens: int | None,
    webhook_url: str | None,
) -> str:
    """What an Idempotency-Key compares: the document (its bytes' digest, or its URL) and the options. The
    webhook is part of what was asked for; without one the fingerprint is as before webhooks."""
    hook = {"webhook_url": webhook_url} if webhook_url is not None else {}
    what = {**document, "pages": selection, "preview": preview, "max_tokens": max_tokens, **hook}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def _encode_cursor(created_at: datetime, job_id: str) -> str:
    raw = json.dumps([created_at.isoformat(), job_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    """The (created_at, id) a cursor stands for; InvalidParameter for anything GET /v1/jobs did not write."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, job_id = json.loads(raw)
        at = datetime.fromisoformat(created_at)
        if at.tzinfo is None:
            raise ValueError("naive")
        return at, uuid.UUID(job_id)
    except (binascii.Error, ValueError, TypeError, AttributeError):
        raise InvalidParameter("cursor is not one that GET /v1/jobs returned (next_cursor)") from None


def _job_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise JobNotFound() from None


def last_page_sent(last_event_id: str | None) -> int:
    """The page a Last-Event-ID names (0: none). ASCII digits only: str.isdigit() also takes "²" (the header
    is read as Latin-1), which int() refuses."""
    if not last_event_id:
        return 0
    value = last_event_id.strip()
    if not (value.isascii() and value.isdigit()):
        raise InvalidParameter("Last-Event-ID must be a page number (the id of the last page event)")
    return int(value)


class Jobs:
    def __init__(
        self,
        settings: Settings,
        pipeline: Pipeline,
        metrics: Metrics,
        may_work: Callable[[], bool],
        stopping: Callable[[], bool],
        webhook_secret: SecretOf,
    ):
        assert settings.database_url is not None
        self.settings = settings
        self.pipeline = pipeline
        self.stopping = stopping
        # Every use of a connection is one short statement or transaction (never held across a page's OCR),
        # so a few serve many claimers: a GPU instance's 64 must not take 132 of the server's connections.
        assert settings.max_concurrency is not None  # resolved for the engine (Settings.for_engine)
        self.store = JobStore(
            settings.database_url,
            max_connections=4 + min(2 * settings.max_concurrency, 12),
            timeout_s=settings.job_db_timeout_s,
        )
        # Where the service may connect for a client: document URLs and webhooks (ocr_app/egress.py).
        self.egress = Policy.of(settings.job_url_allowed_hosts)
        self.worker = JobWorker(
            settings, self.store, pipeline, metrics, may_work, webhook_secret, self.egress
        )

    async def start(self) -> None:
        await self.store.open()
        self.worker.start()

    async def stop(self) -> None:
        await self.worker.stop()
        await self.store.close()

    def check(self) -> None:
        refusal = self.store.refusal()
        if refusal is not None:
            raise refusal

    async def submit_url(
        self,
        owner: str,
        idempotency_key: str | None,
        url: str,
        selection: list[int] | None,
        preview: bool,
        max_tokens: int | None,
        webhook_url: str | None = None,
    ) -> tuple[uuid.UUID, bool]:
        """A job of the document at `url`, fetched now. The Idempotency-Key covers the URL (and the options):
        the same key and URL return the job made before without fetching again."""
        s = self.settings
        fetch.check_url(url)
        fingerprint = _fingerprint({"url": url}, selection, preview, max_tokens, webhook_url)
        if idempotency_key is not None:
            found = await self.store.bounded(self.store.idempotent(owner, idempotency_key))
            if found is not None:
                if found[1] != fingerprint:
                    raise IdempotencyConflict()
                return found[0], False
        body, content_type = await fetch.fetch(
            url, s.max_job_bytes, s.job_url_timeout_s, s.job_url_max_redirects, self.egress
        )
        return await self.submit(
            owner,
            idempotency_key,
            body,
            content_type,
            selection,
            preview,
            max_tokens,
            webhook_url,
            fingerprint,
        )

    async def submit(
        self,
        owner: str,
        idempotency_key: str | None,
        body: bytes,
        content_type: str,
        selection: list[int] | None,
        preview: bool,
        max_tokens: int | None,
        webhook_url: str | None = None,
        fingerprint: str | None = None,
    ) -> tuple[uuid.UUID, bool]:
        """A job of this document; `fingerprint`: what Idempotency-Key compares, when not the document's
        bytes (a document by URL: its URL)."""
        s = self.settings
        bound = selection[-1] if selection else s.max_job_pages + 1
        count, digest = await self.pipeline.decode_pool.count_pages(
            DecodeRequest(body, content_type), bound, time.monotonic() + s.request_timeout_s
        )
        if selection is None:
            if count > s.max_job_pages:
                raise TooManyPages(f"the document has more than {s.max_job_pages} pages (max_job_pages)")
            selection = list(range(1, count + 1))
        elif selection[-1] > count:
            raise InvalidParameter(f"page {selection[-1]} is out of range: the document has {count} page(s)")
        options = {"preview": preview, "max_tokens": max_tokens}
        if fingerprint is None:
            fingerprint = _fingerprint({"document": digest}, selection, preview, max_tokens, webhook_url)
        # Told 503 when the database is slower than job_db_timeout_s, the job may still be written: a retry
        # with the same Idempotency-Key finds it.
        job_id, created = await self.store.bounded(
            self.store.create(
                owner,
                idempotency_key,
                fingerprint,
                content_type,
                options,
                selection,
                body,
                s.job_range_pages,
                s.max_jobs_in_flight,
                webhook_url,
            )
        )
        if created:
            self.worker.wake()
        return job_id, created

    async def status(self, owner: str, job_id: str) -> dict[str, Any]:
        found = await self.store.bounded(self.store.status(owner, _job_id(job_id)))
        if found is None:
            raise JobNotFound()
        return found

    async def cancel(self, owner: str, job_id: str) -> dict[str, Any]:
        ttl = self.settings.job_result_ttl_s
        if not await self.store.bounded(self.store.cancel(owner, _job_id(job_id), ttl)):
            raise JobNotFound()
        return await self.status(owner, job_id)

    async def purge(self, owner: str, job_id: str) -> None:
        """Cancel and delete now: the job, its document, pages and webhook delivery. Then 404, as expired."""
        if not await self.store.bounded(self.store.purge(owner, _job_id(job_id))):
            raise JobNotFound()

    async def list_jobs(
        self, owner: str, statuses: Sequence[str] | None, limit: int, cursor: str | None
    ) -> dict[str, Any]:
        """{jobs: [newest first], next_cursor}: next_cursor (None on the last page) asks for the next."""
        before = _decode_cursor(cursor) if cursor is not None else None
        rows = await self.store.bounded(self.store.list_jobs(owner, statuses, limit + 1, before))
        more = len(rows) > limit
        rows = rows[:limit]
        next_cursor = _encode_cursor(rows[-1]["created_at"], rows[-1]["job_id"]) if more else None
        jobs = [r | {"created_at": r["created_at"].isoformat()} for r in rows]
        return {"jobs": jobs, "next_cursor": next_cursor}

    async def events(self, owner: str, job_id: str, last_event_id: str | None) -> AsyncIterator[str]:
        after = last_page_sent(last_event_id)
        jid = _job_id(job_id)
        pages = await self.store.bounded(self.store.pages_of(owner, jid))
        if pages is None:
            raise JobNotFound()
        return events.sse(self.store, jid, pages, after, self.settings.job_poll_s, self.stopping)

    async def result(
        self, owner: str, job_id: str, ndjson: bool, fmt: Format = JSON
    ) -> tuple[AsyncIterator[str] | AsyncIterator[bytes], dict[str, str]]:
        """The finished job's result (JSON, JSON Lines when `ndjson`, else `fmt`) and the headers that go
        with it: OCR-Failed-Pages lists the pages that could not be read (absent when none)."""
        found = await self.status(owner, job_id)
        if found["status"] not in FINISHED:
            raise JobNotFinished(found["status"])
        jid = _job_id(job_id)
        failed = [e["page"] for e in found["errors"]]
        headers = {FAILED_PAGES_HEADER: ",".join(map(str, failed))} if failed else {}
        if ndjson:
            return events.result_ndjson(self.store, jid), headers
        if fmt.writer is not None:
            engine = self.pipeline.engine
            count = found["pages"]["done"]
            return results.text_format(self.store, jid, fmt, engine.name, engine.model, count), headers
        if fmt.name == "pdf":
            pages = await self.store.bounded(self.store.pages_of(owner, jid))
            if pages is None:
                raise JobNotFound()
            path = await results.pdf_within(
                self.store, self.pipeline.renders, jid, pages, self.settings.job_result_timeout_s
            )
            headers["Content-Length"] = str(path.stat().st_size)
            return results.stream_file(path), headers
        return events.result_json(self.store, jid, found["status"]), headers
