"""Admission: at most `max_concurrency` interactive requests in flight, `max_queue` waiting; the rest get 503.

Bulk-job pages (ocr_app/jobs/worker.py) have a count of their own and never take an interactive slot, so an
interactive request never waits here for them; background_may_start() is the one rule for when they start,
and the engine serves interactive pages first (Engine.recognize's `background`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from ..errors import Overloaded


class Admission:
    def __init__(
        self,
        max_concurrency: int,
        max_queue: int,
        drain_file: Path | None,
        background_max: int = 1,
        background_max_interactive: int = 0,
        # mutation: NumberReplacer to `-1.0` is equivalent: the time since the last interactive one is >= 0.
        yield_s: float = 0.0,
    ):
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self.drain_file = drain_file
        self.background_max = background_max
        self.background_max_interactive = background_max_interactive
        self.yield_s = yield_s
        self._slots = asyncio.Semaphore(max_concurrency)
        self.inflight = 0  # interactive requests
        self.queued = 0
        self.background = 0  # job pages in flight
        self._interactive_ended = -float("inf")  # monotonic time the last interactive request ended

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
            # mutation: NumberReplacer to `max(self.max_concurrency, 0)` is equivalent: the setting is >= 1.
            raise Overloaded(retry_after_s=1 + self.queued // max(self.max_concurrency, 1))
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
            self._interactive_ended = time.monotonic()
            self._slots.release()

    def background_may_start(self) -> bool:
        """Whether a job page may start now: fewer than background_max run, and at most
        background_max_interactive interactive requests are in flight or waiting, one that ended less than
        yield_s ago counting as still there (an interactive client's next request usually follows at once:
        a job page started in that gap would hold it up)."""
        interactive = self.inflight + self.queued
        if interactive == 0 and time.monotonic() - self._interactive_ended < self.yield_s:
            interactive = 1
        return self.background < self.background_max and interactive <= self.background_max_interactive

    @asynccontextmanager
    async def background_slot(self) -> AsyncIterator[None]:
        """Count one job page in flight; background_may_start() said yes (no await between them)."""
        if self.background >= self.background_max:
            raise Overloaded(retry_after_s=1)
        self.background += 1
        try:
            yield
        finally:
            self.background -= 1
