"""Who goes first: the rule for when a bulk-job page may start (Admission.background_may_start) and the engine
gate that hands a free worker to an interactive page before a job page (PriorityGate)."""

from __future__ import annotations

import asyncio
import time
import types

import pytest

from ocr_app.engines.base import PriorityGate
from ocr_app.errors import Overloaded
from ocr_app.http.errors import http_status
from ocr_app.ocr import admission
from ocr_app.ocr.admission import Admission


def test_job_pages_start_only_while_interactive_requests_leave_room():
    async def scenario() -> None:
        a = Admission(2, 4, None, background_max=2, background_max_interactive=0, yield_s=60)
        assert a.background_may_start()  # nothing interactive yet
        async with a.slot():
            assert not a.background_may_start()  # an interactive request in flight
        # Ended, but its client's next request is likely on its way: still not, for yield_s.
        assert not a.background_may_start()
        a.yield_s = 0
        assert a.background_may_start()
        async with a.background_slot(), a.background_slot():
            assert not a.background_may_start()  # background_max job pages run
            with pytest.raises(Overloaded) as err:
                async with a.background_slot():
                    pass
            assert (http_status(err.value), err.value.code, err.value.retry_after_s) == (503, "overloaded", 1)
            # Job pages never take an interactive slot: two interactive requests still get in at once.
            async with a.slot(), a.slot():
                assert (a.inflight, a.queued) == (2, 0)
        assert a.background == 0

        # Beside interactive requests up to background_max_interactive (the batching engine's default).
        b = Admission(4, 4, None, background_max=4, background_max_interactive=1, yield_s=0)
        async with b.slot():
            assert b.background_may_start()
            async with b.slot():
                assert not b.background_may_start()

        # A queued interactive request counts as much as one in flight.
        c = Admission(1, 4, None, background_max=4, background_max_interactive=1, yield_s=0)
        async with c.slot():
            assert c.background_may_start()
            waiting = asyncio.create_task(c.slot().__aenter__())
            await asyncio.sleep(0)
            assert c.queued == 1 and not c.background_may_start()
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            assert c.queued == 0 and c.background_may_start()

    asyncio.run(scenario())


def test_a_waiting_interactive_page_goes_before_waiting_job_pages():
    async def scenario() -> list[str]:
        gate = PriorityGate(1)
        order: list[str] = []
        await gate.acquire()  # a page runs on the one worker

        async def page(name: str, background: bool) -> None:
            await gate.acquire(background)
            order.append(name)
            gate.release()

        waiting = [asyncio.create_task(page("job-1", True)), asyncio.create_task(page("job-2", True))]
        await asyncio.sleep(0)  # both job pages wait before the interactive one arrives
        waiting.append(asyncio.create_task(page("interactive", False)))
        await asyncio.sleep(0)
        gate.release()
        await asyncio.gather(*waiting)
        return order

    assert asyncio.run(scenario()) == ["interactive", "job-1", "job-2"]


def test_a_cancelled_waiter_passes_its_turn_on():
    async def scenario() -> list[str]:
        gate = PriorityGate(1)
        order: list[str] = []
        await gate.acquire()

        async def page(name: str) -> None:
            await gate.acquire()
            order.append(name)
            gate.release()

        gone, next_one = asyncio.create_task(page("gone")), asyncio.create_task(page("next"))
        await asyncio.sleep(0)
        gate.release()  # the turn is handed to `gone`...
        gone.cancel()  # ...which is cancelled before it runs: `next` must still get the worker
        await asyncio.gather(gone, next_one, return_exceptions=True)
        await gate.acquire()  # and the worker is free again afterwards (nothing leaked)
        return order

    assert asyncio.run(scenario()) == ["next"]


def test_interactive_requests_queue_up_to_max_queue_then_get_503():
    async def scenario() -> None:
        a = Admission(2, 2, None)
        release = asyncio.Event()

        async def hold() -> float:
            async with a.slot() as waited:
                await release.wait()
                return waited

        started = time.perf_counter()
        tasks = [asyncio.create_task(hold()) for _ in range(4)]  # 2 in flight, 2 queued: at the limit
        await asyncio.sleep(0)
        assert (a.inflight, a.queued) == (2, 2)
        with pytest.raises(Overloaded) as err:  # one past it
            async with a.slot():
                pass
        # Retry after 1 s plus a second for each max_concurrency requests queued: 1 + 2 // 2.
        assert err.value.retry_after_s == 2
        release.set()
        waited = await asyncio.gather(*tasks)
        # The seconds each spent queued: within the time since they were started.
        assert all(0 <= w <= time.perf_counter() - started for w in waited)
        assert (a.inflight, a.queued) == (0, 0)
        # By default one job page at a time (background_max 1), at once (yield_s 0).
        assert a.background_may_start()
        async with a.background_slot():
            assert not a.background_may_start()

        # Queued requests wait while a slot is free to take: only a full house refuses.
        b = Admission(1, 0, None)
        async with b.slot():
            with pytest.raises(Overloaded) as err:
                async with b.slot():
                    pass
            assert err.value.retry_after_s == 1
        async with b.slot():
            assert b.inflight == 1

        # The retry hint divides by max_concurrency: 1 + 2 // 1 with one slot and two queued.
        c = Admission(1, 2, None)
        gate = asyncio.Event()

        async def hold_c() -> None:
            async with c.slot():
                await gate.wait()

        held = [asyncio.create_task(hold_c()) for _ in range(3)]
        await asyncio.sleep(0)
        with pytest.raises(Overloaded) as err:
            async with c.slot():
                pass
        assert err.value.retry_after_s == 3
        gate.set()
        await asyncio.gather(*held)

    asyncio.run(scenario())


def test_draining_follows_the_drain_file(tmp_path):
    assert not Admission(1, 1, None).draining
    a = Admission(1, 1, tmp_path / "drain")
    assert not a.draining
    (tmp_path / "drain").touch()
    assert a.draining


def test_job_pages_wait_yield_s_after_an_interactive_request_and_no_longer(monkeypatch):
    # The module's clock, set by hand: the last interactive request ended at 40 s, yield_s is 60.
    now = {"t": 0.0}
    monkeypatch.setattr(admission, "time", types.SimpleNamespace(monotonic=lambda: now["t"]))
    now["t"] = 10.0  # a clock that started less than yield_s ago: no interactive request yet, no wait
    a = Admission(1, 1, None, yield_s=60)
    assert a.background_may_start()
    a._interactive_ended = 40.0
    now["t"] = 99.5
    assert not a.background_may_start()
    now["t"] = 100.0  # yield_s since it ended: at the limit, no longer held up
    assert a.background_may_start()
    # One that just ended counts as one interactive request: allowed beside background_max_interactive=1.
    b = Admission(1, 1, None, background_max_interactive=1, yield_s=60)
    b._interactive_ended = 99.5
    assert b.background_may_start()
