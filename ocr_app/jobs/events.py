"""A job's pages as they are written: Server-Sent Events and the result stream, read from the job store.

Page events go out in page order with the page number as the event id, so `Last-Event-ID: N` means
"every page up to N arrived": a reconnecting client gets the pages after N. A page is held back until the
pages before it are written (ranges are claimed in order, so the wait is short). A cancelled job's pages
that were never run are skipped before `done`.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable

from ..errors import JobsUnavailable
from .store import FINISHED, JobStore, PageRow

# A comment line at least this often: proxies (nginx's proxy_read_timeout, 60 s) keep a quiet stream open.
KEEPALIVE_S = 15.0


def _event(name: str, data: str, event_id: int | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {name}\ndata: {data}\n\n"


def _progress(status: str, sent: int, total: int) -> str:
    return _event("progress", json.dumps({"status": status, "pages_sent": sent, "pages_total": total}))


def _page_event(row: PageRow) -> str:
    if row.result is not None:
        return _event("page", row.result, row.page)
    return _event("page_error", json.dumps({"page": row.page, "error": row.error}), row.page)


async def sse(
    store: JobStore,
    job_id: uuid.UUID,
    pages: list[int],
    after: int,
    poll_s: float,
    stopping: Callable[[], bool],
) -> AsyncIterator[str]:
    """`progress` when the job's status changes, `page` (or `page_error`) per page after `after`, `done`.

    Ends early when the instance stops (a stream would hold its graceful shutdown), and with `unavailable`
    when the job database is away: the client reconnects with Last-Event-ID, to any instance."""
    try:
        async for event in _events(store, job_id, pages, after, poll_s, stopping):
            yield event
    except JobsUnavailable as err:
        # The job database went away (or stopped answering in time): the stream ends cleanly with an event
        # that says so, and the client comes back after `retry` with Last-Event-ID, as after any drop.
        body = {"code": err.code, "message": err.message, "retry_after_s": err.retry_after_s}
        yield f"retry: {(err.retry_after_s or 5) * 1000}\n" + _event("unavailable", json.dumps(body))


async def _events(
    store: JobStore,
    job_id: uuid.UUID,
    pages: list[int],
    after: int,
    poll_s: float,
    stopping: Callable[[], bool],
) -> AsyncIterator[str]:
    nxt = bisect.bisect_right(pages, after)  # index of the next page to send
    last_status = None
    last_sent = time.monotonic()
    while True:
        refusal = store.refusal()  # the probe found the database away: no wait for a time-out
        if refusal is not None:
            raise refusal
        status = await store.bounded(store.job_state(job_id))
        if status is None:  # its results expired (job_result_ttl_s) while the client listened
            yield _event("done", json.dumps({"job_id": str(job_id), "status": "expired"}))
            return
        if status != last_status and status not in FINISHED:
            last_status = status
            yield _progress(status, nxt, len(pages))
            last_sent = time.monotonic()
        written = {
            r.page: r
            for r in await store.bounded(store.finished_pages(job_id, pages[nxt - 1] if nxt else after))
        }
        while nxt < len(pages) and pages[nxt] in written:
            yield _page_event(written[pages[nxt]])
            nxt += 1
            last_sent = time.monotonic()
        if status in FINISHED:
            # Read after the status: every page of a done job is in `written`; a cancelled job's gaps stay
            # gaps (its pages never run). Only then is the job said to be finished, twice: its last
            # `progress`, then `done`.
            for page in pages[nxt:]:
                if page in written:
                    yield _page_event(written[page])
                    nxt += 1
            yield _progress(status, nxt, len(pages))
            yield _event("done", json.dumps({"job_id": str(job_id), "status": status}))
            return
        if stopping():
            return
        if time.monotonic() - last_sent >= KEEPALIVE_S:
            yield ": keepalive\n\n"
            last_sent = time.monotonic()
        await asyncio.sleep(poll_s)


async def result_json(store: JobStore, job_id: uuid.UUID, status: str) -> AsyncIterator[str]:
    """{"job_id", "status", "pages": [each as /v1/ocr returns it], "errors": [{page, error}]}, streamed."""
    yield json.dumps({"job_id": str(job_id), "status": status})[:-1] + ', "pages": ['
    errors = []
    first = True
    async for row in store.stream_pages(job_id):
        if row.result is None:
            errors.append({"page": row.page, "error": row.error})
            continue
        yield ("" if first else ",") + row.result
        first = False
    yield '], "errors": ' + json.dumps(errors) + "}"


async def result_ndjson(store: JobStore, job_id: uuid.UUID) -> AsyncIterator[str]:
    """One line per page in page order: the page as /v1/ocr returns it, or {"page", "error"}."""
    async for row in store.stream_pages(job_id):
        yield (
            row.result if row.result is not None else json.dumps({"page": row.page, "error": row.error})
        ) + "\n"
