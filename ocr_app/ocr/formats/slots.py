"""How many results are rendered in another format at once on an instance (`render_workers`).

A format's rendering is CPU and memory after the engine is done: pdf's seconds of a document's worth of pages
(its copy of the document, its layers), an XML format's string of every page. Admission's slots are let go
by then, so without a bound of its own every request that finished its OCR would render at once, up to the
thread pool's 40 threads. Each render runs in a thread while it holds one of `limit` slots; the others wait
for one in order, within their request's deadline (a wait past it is the request's 504). A thread cannot be
stopped: its slot is held until it returns, so the bound holds even for requests that gave up."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

from prometheus_client import CollectorRegistry, Gauge, Histogram
from starlette.concurrency import run_in_threadpool

T = TypeVar("T")

# From a page's text (milliseconds) to a long job's searchable PDF (minutes).
_SECONDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300)


class Renders:
    def __init__(self, limit: int, registry: CollectorRegistry | None) -> None:
        self._slots = asyncio.Semaphore(limit)
        self.running = 0
        self.waiting = 0
        Gauge(
            "ocr_renders_running", "Results being rendered in another format than JSON", registry=registry
        ).set_function(lambda: self.running)
        Gauge(
            "ocr_renders_waiting", "Results waiting for a render slot (render_workers)", registry=registry
        ).set_function(lambda: self.waiting)
        self._seconds = Histogram(
            "ocr_render_seconds",
            "Time rendering a result in a format (a job's pdf: each batch of pages and the save), by format",
            ["format"],
            buckets=_SECONDS,
            registry=registry,
        )

    async def run(self, fmt: str, fn: Callable[..., T], *args: object) -> T:
        """fn(*args) in a thread once a slot is free. Cancelled (the request's deadline, the client gone), the
        caller stops waiting; the thread cannot be stopped, so its slot is let go only when it returns."""
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        start = time.perf_counter()

        def done(task: asyncio.Future[T]) -> None:
            self.running -= 1
            self._slots.release()
            self._seconds.labels(fmt).observe(time.perf_counter() - start)
            if not task.cancelled():
                task.exception()  # retrieved: the caller may have gone

        work = asyncio.ensure_future(run_in_threadpool(fn, *args))
        work.add_done_callback(done)
        return await asyncio.shield(work)
