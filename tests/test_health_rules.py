"""HealthMonitor's rules at their limits, on a clock of the test's own: each bound at the bound (still in) and
one past (out), what each problem's message says, how often each probe samples, and what the journal gets
once per episode. No server, no sleeping: the monitor's loops run against a stand-in for asyncio whose
sleep() advances the test's clock (and a loop clock, by a scripted lag) and ends the loop when the script
runs out. tests/test_health.py runs the same monitor in the real app over HTTP."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ocr_app.config import load_settings
from ocr_app.ocr import health

MiB = 1024 * 1024


class Stop(Exception):
    """Raised by the stand-in sleep when its script has run out: ends a monitor loop."""


class Clock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def monotonic(self) -> float:
        return self.now


class Engine:
    """What the monitor asks of an engine: the pages it finished and its device's problem."""

    def __init__(self) -> None:
        self.pages_done = 0
        self.device: str | None = None

    def device_problem(self) -> str | None:
        return self.device


class Pool:
    workers = 3

    def __init__(self, *probes: Any):
        self.probes = list(probes)  # each a Future to hand out, or an exception to raise

    def probe(self) -> Future[int]:
        item = self.probes.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item


class Observed:
    def __init__(self) -> None:
        self.samples: list[float] = []

    def observe(self, value: float) -> None:
        self.samples.append(value)


def make(
    monkeypatch, clock: Clock, pool: Any = None, **overrides: Any
) -> tuple[health.HealthMonitor, Engine]:
    values: dict[str, Any] = {
        "health_loop_lag_s": 0.5,
        "health_loop_lag_window_s": 3,
        "health_decode_stall_s": 2,
        "health_engine_stall_s": 1.5,
        "health_disk_min_free_mb": 100,
    }
    settings = load_settings(None, auth_disabled=True, **(values | overrides))
    monkeypatch.setattr(health, "time", SimpleNamespace(monotonic=clock.monotonic))
    engine = Engine()
    metrics = SimpleNamespace(loop_lag=Observed())
    return health.HealthMonitor(settings, metrics, pool or Pool(), engine), engine  # type: ignore[arg-type]


def fake_asyncio(monkeypatch, clock: Clock, lags: list[float], sleeps: list[float]) -> SimpleNamespace:
    """asyncio as health.py sees it: sleep(d) records d, then wakes `lags.pop(0)` late on both clocks (the
    loop's and time.monotonic's); with no lag left it raises Stop."""
    loop = SimpleNamespace(now=0.0)
    loop.time = lambda: loop.now

    async def sleep(delay: float) -> None:
        sleeps.append(delay)
        if not lags:
            raise Stop
        late = lags.pop(0)
        loop.now += delay + late
        clock.now += delay + late

    async def to_thread(fn: Any) -> Any:
        return fn()

    fake = SimpleNamespace(
        sleep=sleep,
        get_running_loop=lambda: loop,
        to_thread=to_thread,
        wrap_future=asyncio.wrap_future,
        CancelledError=asyncio.CancelledError,
        gather=asyncio.gather,
    )
    monkeypatch.setattr(health, "asyncio", fake)
    return fake


def run_until_stop(coro: Any) -> None:
    with pytest.raises(Stop):
        asyncio.run(coro)


def codes(monitor: health.HealthMonitor) -> list[str]:
    return [p.code for p in monitor.problems()]


# --- free_bytes ---------------------------------------------------------------------------------------


def test_free_bytes_measures_a_missing_path_on_its_nearest_ancestor(tmp_path):
    import shutil

    missing = tmp_path / "nginx" / "body"
    measured, free = health.free_bytes(missing)
    assert measured == tmp_path
    # Another process may write meanwhile: the same figure as shutil's, within a few MiB (f_bavail / f_frsize
    # or f_bfree would be far off).
    assert abs(free - shutil.disk_usage(tmp_path).free) < 16 * MiB
    assert health.free_bytes(tmp_path)[0] == tmp_path


# --- problems(): each bound at the bound and one past ------------------------------------------------


def test_a_fresh_monitor_has_no_problem_however_long_it_waits(monkeypatch):
    clock = Clock()
    monitor, _ = make(monkeypatch, clock)
    clock.now += 1000
    assert monitor.problems() == []
    assert monitor.engine_requests == 0


def test_the_lag_message_says_what_when_and_which_bound(monkeypatch):
    clock = Clock()
    monitor, _ = make(monkeypatch, clock)
    monitor._lag_seen_s, monitor._lag_seen_at = 0.876, 100.0
    clock.now = 102.0
    (p,) = monitor.problems()
    assert p.message == "event loop lag 0.88 s (over health_loop_lag_s 0.5) 2 s ago"


@pytest.mark.parametrize(("waited", "out"), [(1.0, False), (2.0, False), (2.001, True)])
def test_a_probe_out_past_the_decode_stall_bound_takes_the_instance_out(monkeypatch, waited, out):
    clock = Clock()
    monitor, _ = make(monkeypatch, clock)  # health_decode_stall_s 2
    monitor._probe_started, monitor._probe_done = 100.0, lambda: False
    clock.now = 100.0 + waited
    problems = monitor.problems()
    assert [p.code for p in problems] == (["decode_pool_stalled"] if out else [])
    if out:
        assert problems[0].message == (
            "decode pool stalled: a probe waited 2.0 s for one of 3 workers (health_decode_stall_s 2)"
        )


def test_a_probe_that_came_back_is_no_stall_however_old(monkeypatch):
    clock = Clock()
    monitor, _ = make(monkeypatch, clock)
    monitor._probe_started, monitor._probe_done = 100.0, lambda: True
    clock.now = 200.0
    assert codes(monitor) == []


def test_a_failing_pool_and_a_refused_device_are_problems(monkeypatch):
    clock = Clock()
    monitor, engine = make(monkeypatch, clock)
    monitor._decode_error = "BrokenProcessPool: gone"
    engine.device = "Driver/library version mismatch"
    problems = monitor.problems()
    assert [(p.code, p.message) for p in problems] == [
        ("decode_pool_failing", "decode pool failing: BrokenProcessPool: gone"),
        ("device", "Driver/library version mismatch"),
    ]


@pytest.mark.parametrize(("after", "out"), [(1.5, False), (1.501, True)])
def test_an_engine_with_work_and_no_page_past_its_bound_is_wedged(monkeypatch, after, out):
    clock = Clock()
    monitor, _ = make(monkeypatch, clock)  # health_engine_stall_s 1.5
    clock.now = 200.0  # the bound runs from the first request's entry, not from the monitor's start (100)
    with monitor.engine_work():
        clock.now = 200.0 + after
        problems = monitor.problems()
    assert [p.code for p in problems] == (["engine_wedged"] if out else [])
    if out:
        assert problems[0].message == (
            "engine wedged: 1 request(s) in it and no page finished for 1.5 s (health_engine_stall_s 1.5)"
        )
    assert codes(monitor) == []  # the request left: no work, no wedge


def test_a_finished_page_restarts_the_engine_bound_and_a_second_request_does_not(monkeypatch):
    clock = Clock()
    monitor, engine = make(monkeypatch, clock)
    with monitor.engine_work():
        assert monitor.engine_requests == 1
        clock.now = 101.0
        with monitor.engine_work():  # a second request joins: the bound still runs from 100
            assert monitor.engine_requests == 2
            clock.now = 101.625
            assert codes(monitor) == ["engine_wedged"]
            engine.pages_done += 1  # a page finished, seen at 101.625
            assert codes(monitor) == []
            clock.now = 103.125  # 1.5 s after that page: still in
            assert codes(monitor) == []
            clock.now = 103.25
            (p,) = monitor.problems()
            # 103.25 - 101.625 = 1.625 s, one place: 1.6
            assert p.message == (
                "engine wedged: 2 request(s) in it and no page finished for 1.6 s (health_engine_stall_s 1.5)"
            )
        assert monitor.engine_requests == 1
    assert monitor.engine_requests == 0


# --- the loops, on the stand-in asyncio ---------------------------------------------------------------


def test_the_lag_loop_samples_every_quarter_second_and_observes_the_lateness(monkeypatch, caplog):
    clock = Clock()
    monitor, _ = make(monkeypatch, clock)  # health_loop_lag_s 0.5
    sleeps: list[float] = []
    # on time, early by a clock tick, late under the bound, late at the bound: none over it
    fake_asyncio(monkeypatch, clock, [0.0, -0.001, 0.3, 0.5], sleeps)
    with caplog.at_level(logging.WARNING, logger="ocr_app.health"):
        run_until_stop(monitor._watch_lag())
    assert sleeps == [0.25] * 5  # LAG_INTERVAL_S, the documented sampling period
    assert monitor.metrics.loop_lag.samples == pytest.approx([0.0, 0.0, 0.3, 0.5])
    assert monitor._lag_seen_at is None and not caplog.records
    assert codes(monitor) == []


def test_a_lag_over_the_bound_is_seen_and_logged_rounded_to_hundredths(monkeypatch, caplog):
    clock = Clock()
    monitor, _ = make(monkeypatch, clock)
    fake_asyncio(monkeypatch, clock, [0.501], [])
    with caplog.at_level(logging.WARNING, logger="ocr_app.health"):
        run_until_stop(monitor._watch_lag())
    assert monitor.metrics.loop_lag.samples == pytest.approx([0.501])
    assert (monitor._lag_seen_s, monitor._lag_seen_at) == pytest.approx((0.501, 100.0 + 0.25 + 0.501))
    (record,) = [r for r in caplog.records if "event loop lag" in r.getMessage()]
    assert record.getMessage() == "event loop lag 0.50 s: /healthz degraded"
    assert record.lag_s == 0.5  # type: ignore[attr-defined]


def test_the_logged_lag_keeps_two_places(monkeypatch, caplog):
    clock = Clock()
    monitor, _ = make(monkeypatch, clock)
    fake_asyncio(monkeypatch, clock, [0.876], [])
    with caplog.at_level(logging.WARNING, logger="ocr_app.health"):
        run_until_stop(monitor._watch_lag())
    (record,) = [r for r in caplog.records if "event loop lag" in r.getMessage()]
    assert record.lag_s == 0.88  # type: ignore[attr-defined]


def lag_warnings(caplog) -> list[float]:
    return [r.lag_s for r in caplog.records if "event loop lag" in r.getMessage()]


def test_a_lag_a_window_after_the_last_is_a_new_episode(monkeypatch, caplog):
    clock = Clock()
    monitor, _ = make(monkeypatch, clock)  # health_loop_lag_window_s 3
    # Lags of 0.875 s wake 1.125 s apart: three in a row are one episode (each within 3 s of the last).
    # Then 7 samples on time (1.75 s) and one 1 s late: 1.75 + 0.25 + 1 = exactly 3 s after the last lag.
    # (Multiples of 1/8: exact in binary, so the sums are too.)
    fake_asyncio(monkeypatch, clock, [0.875] * 3 + [0.0] * 7 + [1.0], [])
    with caplog.at_level(logging.WARNING, logger="ocr_app.health"):
        run_until_stop(monitor._watch_lag())
    assert lag_warnings(caplog) == [0.88, 1.0]


def test_a_lag_just_inside_the_window_is_the_same_episode(monkeypatch, caplog):
    clock = Clock()
    monitor, _ = make(monkeypatch, clock)
    # The second lag wakes 1.75 + 0.25 + 0.875 = 2.875 s after the first: inside the 3 s window.
    fake_asyncio(monkeypatch, clock, [0.875] + [0.0] * 7 + [0.875], [])
    with caplog.at_level(logging.WARNING, logger="ocr_app.health"):
        run_until_stop(monitor._watch_lag())
    assert lag_warnings(caplog) == [0.88]
    assert monitor._lag_seen_at == 100.0 + 0.25 + 0.875 + 7 * 0.25 + 0.25 + 0.875  # the last lag's time


def test_the_lag_loop_notes_engine_progress(monkeypatch):
    clock = Clock()
    monitor, engine = make(monkeypatch, clock)
    fake_asyncio(monkeypatch, clock, [0.0], [])
    with monitor.engine_work():
        engine.pages_done = 4
        run_until_stop(monitor._watch_lag())  # wakes at 100.25: the new page is seen then
        assert monitor._engine_pages == 4
        assert monitor._engine_progress_at == 100.25


@pytest.mark.parametrize(("stall", "interval"), [(8, 2.0), (20, 5.0), (20.4, 5.0), (1.5, 0.375)])
def test_the_decode_probe_runs_every_quarter_of_its_bound_at_most_every_5_s(monkeypatch, stall, interval):
    clock = Clock()
    done: Future[int] = Future()
    done.set_result(0)
    monitor, _ = make(monkeypatch, clock, Pool(done, done), health_decode_stall_s=stall)
    sleeps: list[float] = []
    fake_asyncio(monkeypatch, clock, [0.0], sleeps)
    monitor._decode_error = "stale"
    run_until_stop(monitor._probe_decode())
    assert sleeps == [interval, interval]
    assert monitor._decode_error is None and monitor._probe_started is None


def test_a_probe_that_fails_or_cannot_start_is_a_failing_pool_until_one_comes_back(monkeypatch, caplog):
    clock = Clock()
    failed: Future[int] = Future()
    failed.set_exception(OSError("worker died"))
    done: Future[int] = Future()
    done.set_result(0)
    monitor, _ = make(monkeypatch, clock, Pool(failed, RuntimeError("cannot fork"), done))
    errors: list[str | None] = []

    async def sleep(delay: float) -> None:
        errors.append(monitor._decode_error)
        if len(errors) == 3:
            raise Stop

    fake = fake_asyncio(monkeypatch, clock, [], [])
    fake.sleep = sleep
    with caplog.at_level(logging.ERROR, logger="ocr_app.health"):
        run_until_stop(monitor._probe_decode())
    assert errors == ["OSError: worker died", "RuntimeError: cannot fork", None]
    assert "decode pool probe failed: OSError: worker died" in caplog.text


def test_a_probe_is_timed_while_out_and_cancelled_with_the_monitor(monkeypatch):
    clock = Clock()
    pending: Future[int] = Future()
    monitor, _ = make(monkeypatch, clock, Pool(pending))
    fake_asyncio(monkeypatch, clock, [], [])

    async def scenario() -> None:
        task = asyncio.ensure_future(monitor._probe_decode())
        for _ in range(3):
            await asyncio.sleep(0)
        assert monitor._probe_started == 100.0 and not monitor._probe_done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert pending.cancelled()  # the pool does not run a probe nobody waits for
    assert monitor._probe_started is None


# --- the disk ------------------------------------------------------------------------------------------


def disk(monkeypatch, readings: dict[Path, Any]) -> None:
    """free_bytes on a table: path -> free bytes (measured on path itself), or an OSError to raise."""

    def free_bytes(path: Path) -> tuple[Path, int]:
        value = readings[path]
        if isinstance(value, OSError):
            raise value
        return path, value

    monkeypatch.setattr(health, "free_bytes", free_bytes)


def test_a_filesystem_under_the_bound_is_low_at_the_bound_it_is_not(monkeypatch):
    clock = Clock()
    monitor, _ = make(monkeypatch, clock)  # health_disk_min_free_mb 100
    a, b, c = Path("/a"), Path("/b"), Path("/c")
    monitor.disk_paths = [a, b, c]
    disk(monkeypatch, {a: 100 * MiB, b: 100 * MiB - 1, c: 99 * MiB})
    assert monitor._read_disk() == {
        b: "disk: /b has 100.0 MiB free (under health_disk_min_free_mb 100)",
        c: "disk: /c has 99.0 MiB free (under health_disk_min_free_mb 100)",
    }


def test_an_unreadable_path_is_logged_once_per_streak_and_the_others_still_read(monkeypatch, caplog):
    clock = Clock()
    monitor, _ = make(monkeypatch, clock)
    bad, low = Path("/bad"), Path("/low")
    monitor.disk_paths = [bad, low]
    readings: dict[Path, Any] = {bad: PermissionError("denied"), low: 1}
    disk(monkeypatch, readings)
    with caplog.at_level(logging.WARNING, logger="ocr_app.health"):
        assert list(monitor._read_disk()) == [low]
        assert list(monitor._read_disk()) == [low]
        readings[bad] = 200 * MiB
        assert list(monitor._read_disk()) == [low]
        readings[bad] = PermissionError("denied")
        assert list(monitor._read_disk()) == [low]
    unreadable = [r for r in caplog.records if "cannot read the free space" in r.getMessage()]
    assert len(unreadable) == 2  # the first streak once, the second once


def test_the_disk_loop_reads_every_second_and_logs_each_change_once(monkeypatch, caplog):
    clock = Clock()
    monitor, _ = make(monkeypatch, clock)
    a = Path("/a")
    monitor.disk_paths = [a]
    frees = iter([1, 1, 200 * MiB])
    monkeypatch.setattr(health, "free_bytes", lambda path: (path, next(frees)))
    sleeps: list[float] = []
    seen: list[list[str]] = []
    fake = fake_asyncio(monkeypatch, clock, [], sleeps)
    original = fake.sleep

    async def sleep(delay: float) -> None:
        seen.append(codes(monitor))
        if len(seen) < 3:
            sleeps.append(delay)
        else:
            await original(delay)

    fake.sleep = sleep
    with caplog.at_level(logging.INFO, logger="ocr_app.health"):
        run_until_stop(monitor._watch_disk())
    assert sleeps == [1.0, 1.0, 1.0]  # DISK_INTERVAL_S, the documented period
    assert seen == [["disk_low"], ["disk_low"], []]
    messages = [r.getMessage() for r in caplog.records if r.getMessage().startswith("disk")]
    assert messages == [
        "disk: /a has 0.0 MiB free (under health_disk_min_free_mb 100): /healthz degraded",
        "disk: /a has room again",
    ]
