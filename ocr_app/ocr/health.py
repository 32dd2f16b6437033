"""What `/healthz` knows beyond loading/ready: whether this instance can take new work in reasonable time.

Three conditions, each measured by a background task on the event loop and read by `/healthz` as plain
numbers (a request never waits on a probe):

- event-loop lag: a periodic sleep that wakes late means every request waits that long; a lag over
  `health_loop_lag_s` keeps the instance out for `health_loop_lag_window_s` after it was seen;
- decode pool: a no-op task sent to the pool that has not come back within `health_decode_stall_s`
  (every worker busy past the bound, or a pool that cannot start workers), or that failed;
- engine: requests inside the engine and no page finished for `health_engine_stall_s` (wedged);
- device: the engine's driver refuses it (NVML's "Driver/library version mismatch": libraries upgraded under
  the loaded kernel module), read from the engine when /healthz asks;
- disk: a filesystem the request path writes to (the app's temp directory, `health_disk_paths`: nginx's body
  buffers, the journal) has less than `health_disk_min_free_mb` free, read every DISK_INTERVAL_S off the loop.

Each clears by itself when the cause is gone: the window passes, the probe comes back, a page finishes or
the engine's requests leave.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..config import MiB, Settings
from ..documents.decode import DecodePool
from ..engines.base import Engine
from ..metrics import Metrics
from ..schemas import HealthProblem, HealthProblemCode

log = logging.getLogger("ocr_app.health")

# How often the loop's lag is sampled: its cost is one timer; a block shorter than this still shows in full
# (the late wake-up measures it), only its start is known to this precision.
LAG_INTERVAL_S = 0.25
# How often the watched filesystems' free space is read (statvfs, in a thread: a hung mount never blocks the
# loop); with the load balancers' check interval it bounds how long a full disk keeps the instance in.
DISK_INTERVAL_S = 1.0


def problem(code: HealthProblemCode, message: str) -> HealthProblem:
    """One reason the instance cannot take new work: a code for machines, a sentence for people."""
    return HealthProblem(code=code, message=message)


def free_bytes(path: Path) -> tuple[Path, int]:
    """Free bytes for an unprivileged writer (nginx's workers, the app) on the filesystem `path` is on, or
    would be made on (its nearest existing ancestor), and the path measured."""
    while True:
        try:
            st = os.statvfs(path)
        except FileNotFoundError:
            if path.parent == path:
                raise
            path = path.parent
        else:
            return path, st.f_bavail * st.f_frsize


class HealthMonitor:
    def __init__(self, settings: Settings, metrics: Metrics, decode_pool: DecodePool, engine: Engine):
        self.settings = settings
        self.metrics = metrics
        self.decode_pool = decode_pool
        self.engine = engine
        # mutation: NumberReplacer here is equivalent because _lag_seen_s is read only once _lag_seen_at is
        # set, and _watch_lag sets both at once.
        self._lag_seen_s = 0.0  # the last lag over the bound, and when (monotonic) it was seen
        self._lag_seen_at: float | None = None
        self._probe_started: float | None = None  # the outstanding decode probe's start
        # The probe's future's done(): read without waiting on the loop's callbacks.
        # mutation: ReplaceTrueWithFalse here is equivalent because problems() calls it only while
        # _probe_started is set, and _probe_decode sets both at once.
        self._probe_done: Callable[[], bool] = lambda: True
        self._decode_error: str | None = None
        self.engine_requests = 0  # requests inside engine.recognize
        self._engine_pages = engine.pages_done
        self._engine_progress_at = time.monotonic()
        self.disk_paths = list(dict.fromkeys([Path(tempfile.gettempdir()), *settings.health_disk_paths]))
        self._disk_low: dict[Path, str] = {}  # watched path -> why it is low
        self._disk_unreadable: set[Path] = set()

    @contextmanager
    def engine_work(self) -> Iterator[None]:
        """Around a request's engine.recognize: the engine has work, and its progress is due."""
        if self.engine_requests == 0:
            self._engine_progress_at = time.monotonic()
        self.engine_requests += 1
        try:
            yield
        finally:
            self.engine_requests -= 1

    def problems(self) -> list[HealthProblem]:
        """Why this instance cannot take new work in reasonable time; empty when it can. Cheap: no I/O but the
        engine's one driver call."""
        s = self.settings
        now = time.monotonic()
        found = []
        if self._lag_seen_at is not None and now - self._lag_seen_at < s.health_loop_lag_window_s:
            found.append(
                problem(
                    "event_loop_lag",
                    f"event loop lag {self._lag_seen_s:.2f} s (over health_loop_lag_s "
                    f"{s.health_loop_lag_s:g}) {now - self._lag_seen_at:.0f} s ago",
                )
            )
        started = self._probe_started
        if started is not None and not self._probe_done() and now - started > s.health_decode_stall_s:
            found.append(
                problem(
                    "decode_pool_stalled",
                    f"decode pool stalled: a probe waited {now - started:.1f} s for one of "
                    f"{self.decode_pool.workers} workers (health_decode_stall_s {s.health_decode_stall_s:g})",
                )
            )
        if self._decode_error is not None:
            found.append(problem("decode_pool_failing", f"decode pool failing: {self._decode_error}"))
        self._note_engine_progress(now)
        if self.engine_requests and now - self._engine_progress_at > s.health_engine_stall_s:
            found.append(
                problem(
                    "engine_wedged",
                    f"engine wedged: {self.engine_requests} request(s) in it and no page finished for "
                    f"{now - self._engine_progress_at:.1f} s (health_engine_stall_s "
                    f"{s.health_engine_stall_s:g})",
                )
            )
        device = self.engine.device_problem()
        if device is not None:
            found.append(problem("device", device))
        found.extend(problem("disk_low", why) for why in self._disk_low.values())
        return found

    def _note_engine_progress(self, now: float) -> None:
        pages = self.engine.pages_done
        if pages != self._engine_pages or not self.engine_requests:
            self._engine_pages = pages
            self._engine_progress_at = now

    async def run(self) -> None:
        await asyncio.gather(self._watch_lag(), self._probe_decode(), self._watch_disk())

    async def _watch_lag(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(LAG_INTERVAL_S)
            lag = max(0.0, loop.time() - before - LAG_INTERVAL_S)
            self.metrics.loop_lag.observe(lag)
            if lag > self.settings.health_loop_lag_s:
                now, last = time.monotonic(), self._lag_seen_at
                if last is None or now - last >= self.settings.health_loop_lag_window_s:  # once per episode
                    log.warning(
                        "event loop lag %.2f s: /healthz degraded", lag, extra={"lag_s": round(lag, 2)}
                    )
                self._lag_seen_s, self._lag_seen_at = lag, now
            self._note_engine_progress(time.monotonic())

    async def _probe_decode(self) -> None:
        # Often enough that a stall is seen within about a quarter of its bound beyond it.
        interval = min(5.0, self.settings.health_decode_stall_s / 4)
        while True:
            try:
                future = self.decode_pool.probe()
            except Exception as err:  # the pool could not be (re)started
                self._decode_error = f"{type(err).__name__}: {err}"
            else:
                self._probe_started, self._probe_done = time.monotonic(), future.done
                try:
                    await asyncio.wrap_future(future)
                    self._decode_error = None
                except asyncio.CancelledError:
                    future.cancel()
                    raise
                except Exception as err:
                    self._decode_error = f"{type(err).__name__}: {err}"
                    log.error("decode pool probe failed: %s", self._decode_error)
                finally:
                    self._probe_started = None
            await asyncio.sleep(interval)

    async def _watch_disk(self) -> None:
        while True:
            self._note_disk(await asyncio.to_thread(self._read_disk))
            await asyncio.sleep(DISK_INTERVAL_S)

    def _read_disk(self) -> dict[Path, str]:
        """The watched paths whose filesystem is below the bound, and why; one that cannot be read (not a
        missing path: that is measured on its parent) is logged and left out."""
        bound = self.settings.health_disk_min_free_mb * MiB
        low = {}
        for path in self.disk_paths:
            try:
                measured, free = free_bytes(path)
            except OSError as err:
                if path not in self._disk_unreadable:
                    log.warning("cannot read the free space of %s: %s", path, err)
                    self._disk_unreadable.add(path)
                continue
            self._disk_unreadable.discard(path)
            if free < bound:
                low[path] = (
                    f"disk: {measured} has {free / MiB:.1f} MiB free (under health_disk_min_free_mb "
                    f"{self.settings.health_disk_min_free_mb})"
                )
        return low

    def _note_disk(self, low: dict[Path, str]) -> None:
        for path in low.keys() - self._disk_low.keys():
            log.warning("%s: /healthz degraded", low[path], extra={"path": str(path)})
        for path in self._disk_low.keys() - low.keys():
            log.info("disk: %s has room again", path, extra={"path": str(path)})
        self._disk_low = low
