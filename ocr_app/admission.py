"""Admission: at most `max_concurrency` requests in flight and `max_queue` waiting; the rest get 503.

Bulk-job pages (ocr_app/jobs/worker.py) take the same slots, but only a slot that is free right now: they
never queue, so an interactive request waits at most for the job pages already running."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from .results import overloaded


class Admission:
    def __init__(self, max_concurrency: int, max_queue: int, drain_file: Path | None):
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self.drain_file = drain_file
        self._slots = asyncio.Semaphore(max_concurrency)
        self.inflight = 0
        self.queued = 0

    @property
    def draining(self) -> bool:
        # Checked on every /healthz: a load balancer stops sending, but requests are still served.
        return self.drain_file is not None and self.drain_file.exists()

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[float]:
        """Hold one in-flight slot; yields the seconds spent queued. Raises 503 when full.

        The caller's deadline (asyncio.timeout) covers the wait: a request that times out in the
        queue leaves it without ever running.
        """
        if self._slots.locked() and self.queued >= self.max_queue:
            raise overloaded(retry_after_s=1 + self.queued // max(self.max_concurrency, 1))
        start = time.perf_counter()
        self.queued += 1
        try:
            await self._slots.acquire()
        finally:
            self.queued -= 1
        self.inflight += 1
        try:
            yield time.perf_counter() - start
        finally:
            self.inflight -= 1
            self._slots.release()

    def spare(self, max_queued: int = 0) -> bool:
        """A slot is free and at most `max_queued` interactive requests wait: background work may start."""
        return not self._slots.locked() and self.queued <= max_queued

    @asynccontextmanager
    async def spare_slot(self) -> AsyncIterator[None]:
        """Hold a slot that spare() found free (no await between them: taking it does not wait)."""
        if self._slots.locked():
            raise overloaded(retry_after_s=1)
        await self._slots.acquire()
        self.inflight += 1
        try:
            yield
        finally:
            self.inflight -= 1
            self._slots.release()
