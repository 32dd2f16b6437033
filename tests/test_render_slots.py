"""render_workers: results rendered in another format at once on an instance (ocr_app/ocr/formats/slots.py).
Renders held in their threads by an event the test sets: how many run is counted by the work itself."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from ocr_app.ocr.formats.slots import Renders


class Held:
    """Work that runs until released, counting how many run at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Semaphore(0)
        self._lock = threading.Lock()
        self.now = self.peak = 0

    def __call__(self, i: int) -> int:
        with self._lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        self.started.release()
        self.release.wait(30)
        with self._lock:
            self.now -= 1
        return i


async def _until(condition: Callable[[], bool]) -> None:
    """A cancelled request's thread returns on its own time: its slot is let go by the loop soon after."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, "the slot was never let go"
        await asyncio.sleep(0.001)


async def _settle() -> None:
    for _ in range(20):  # every task takes its first steps (to the slot it waits for)
        await asyncio.sleep(0)


def gauges(registry: CollectorRegistry) -> tuple[float | None, float | None]:
    return registry.get_sample_value("ocr_renders_running"), registry.get_sample_value("ocr_renders_waiting")


def test_at_most_the_limit_run_and_the_others_wait_in_turn():
    async def main() -> None:
        registry = CollectorRegistry()
        renders, work = Renders(2, registry), Held()
        tasks = [asyncio.create_task(renders.run("pdf", work, i)) for i in range(5)]
        for _ in range(2):
            await asyncio.to_thread(work.started.acquire)
        await _settle()
        assert (work.now, gauges(registry)) == (2, (2.0, 3.0))
        work.release.set()
        assert await asyncio.gather(*tasks) == [0, 1, 2, 3, 4]
        assert work.peak == 2 and gauges(registry) == (0.0, 0.0)
        assert registry.get_sample_value("ocr_render_seconds_count", {"format": "pdf"}) == 5

    asyncio.run(main())


def test_a_limit_of_one_runs_one():
    async def main() -> None:
        renders, work = Renders(1, None), Held()
        tasks = [asyncio.create_task(renders.run("hocr", work, i)) for i in range(3)]
        await asyncio.to_thread(work.started.acquire)
        await _settle()
        assert (work.now, renders.running, renders.waiting) == (1, 1, 2)
        work.release.set()
        assert await asyncio.gather(*tasks) == [0, 1, 2] and work.peak == 1

    asyncio.run(main())


def test_a_request_that_gives_up_keeps_its_slot_until_its_render_returns():
    """A deadline cancels the request; its thread cannot be stopped, so its slot is not let go before the
    thread is done, and a waiter that gave up takes none."""

    async def main() -> None:
        renders, work = Renders(2, None), Held()
        tasks = [asyncio.create_task(renders.run("pdf", work, i)) for i in range(4)]
        for _ in range(2):
            await asyncio.to_thread(work.started.acquire)
        await _settle()
        tasks[0].cancel()  # rendering
        tasks[3].cancel()  # waiting
        await _settle()
        assert (work.now, renders.running, renders.waiting) == (2, 2, 1)
        work.release.set()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(done[0], asyncio.CancelledError) and isinstance(done[3], asyncio.CancelledError)
        assert done[1:3] == [1, 2] and work.peak == 2
        await _until(lambda: renders.running == 0)
        assert renders.waiting == 0
        assert await renders.run("pdf", work, 4) == 4  # the slots are free again

    asyncio.run(main())
