"""Everything a request needs, built once from Settings (AppState: the pipeline, the keys, the job service,
the shadow replays, the metrics), and the instance's lifecycle: the engine's load, health, the watchdog and
the stop (AppState.running, the app's lifespan)."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress

from .. import __version__, systemd
from ..auth import KeyStore
from ..config import Settings
from ..egress import Policy
from ..engines.base import Engine
from ..errors import JobsUnavailable
from ..fleet.shadow import Shadow
from ..jobs.service import NO_DATABASE, Jobs
from ..metrics import Metrics
from ..ocr.pipeline import Pipeline
from ..schemas import HealthProblem

log = logging.getLogger("ocr_app.api")  # the name operators select in the journal (LOGGER=ocr_app.api)

VERSION = __version__


class AppState:
    """Everything a request needs, built once from Settings."""

    def __init__(self, settings: Settings, engine: Engine, on_fatal: Callable[[str], None] | None):
        self.metrics = Metrics()
        self.pipeline = Pipeline(settings, engine, self.metrics)
        # With the engine's defaults filled in (Settings.for_engine, applied by the pipeline).
        self.settings = settings = self.pipeline.settings
        self.engine = engine
        self.on_fatal = on_fatal
        self.keys: KeyStore | None = None
        if not settings.auth_disabled:
            assert settings.api_keys_file is not None  # Settings requires it unless auth_disabled
            self.keys = KeyStore(settings.api_keys_file)
        self.metrics.info.labels(VERSION, engine.name, engine.model).set(1)
        self.shadow = Shadow(settings, self.metrics.registry)
        # Where the service may connect for a client: a chat request's image URLs (ocr_app/egress.py), as
        # a job's document URLs.
        self.egress = Policy.of(settings.job_url_allowed_hosts)
        self.admission = self.pipeline.admission
        self.health = self.pipeline.health
        self.status = "loading"  # -> ready | unhealthy
        self.stopping = False
        engine.on_fatal = self.fatal  # a backend that dies between requests (vLLM's engine core)
        self.jobs = (
            Jobs(
                settings,
                self.pipeline,
                self.metrics,
                self.may_work_jobs,
                lambda: self.stopping,
                self.webhook_secret,
            )
            if settings.database_url
            else None
        )

    def may_work_jobs(self) -> bool:
        return self.status == "ready" and not self.stopping and not self.admission.draining

    def webhook_secret(self, owner: str) -> tuple[bool, str | None]:
        """The secret that signs the webhooks of owner's jobs: (found, secret). With API keys, the hex sha256
        of the owner's key (the client computes it from its key); not found once that key was removed.
        Without, job_webhook_secret (None: unsigned)."""
        if self.keys is None:
            return True, self.settings.job_webhook_secret
        digest = self.keys.digest_of(owner)
        return digest is not None, digest

    def require_jobs(self) -> Jobs:
        """The job service, or the 503 that says what is missing (a database, its schema)."""
        if self.jobs is None:
            raise JobsUnavailable(NO_DATABASE)
        self.jobs.check()
        return self.jobs

    def health_status(self) -> tuple[str, list[HealthProblem]]:
        """/healthz's status and, when degraded, why."""
        if self.status != "ready":
            return self.status, []
        if self.stopping or self.admission.draining:
            return "draining", []
        problems = self.health.problems()
        return ("degraded" if problems else "ready"), problems

    def fatal(self, reason: str) -> None:
        self.status = "unhealthy"
        self.metrics.model_loaded.set(0)
        log.critical("engine unusable, exiting so the supervisor restarts us: %s", reason)
        if self.on_fatal is not None:
            self.on_fatal(reason)

    async def start_engine(self) -> None:
        started = time.perf_counter()
        try:
            await self.pipeline.start()
        except Exception as err:
            log.exception("engine failed to load")
            self.fatal(f"{type(err).__name__}: {err}")
            return
        self.status = "ready"
        self.metrics.model_loaded.set(1)
        log.info(
            "engine ready",
            extra={
                "engine": self.engine.name,
                "model": self.engine.model,
                "load_s": round(time.perf_counter() - started, 2),
            },
        )
        systemd.notify("READY=1")

    async def monitor_health(self, engine_load: asyncio.Task[None]) -> None:
        """From ready on: a slow start (the engine's load) is no reason to take a ready instance out."""
        await asyncio.shield(engine_load)
        if self.status == "ready":
            await self.health.run()

    async def watchdog(self, interval: float) -> None:
        # Pinged from the event loop itself: a blocked loop or a dead engine stops the pings.
        while True:
            if self.status == "ready" and not self.engine.healthy():
                self.fatal("engine reported unhealthy")
            if self.status != "unhealthy":
                systemd.notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    def reload_keys(self) -> None:
        if self.keys is not None:
            self.keys.reload(force=True)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The app's lifespan: the engine loads in the background (/healthz says loading meanwhile), then
        health checks and the watchdog; the job worker from the start. On the way out the job leases go back
        before the engine goes away."""
        loop = asyncio.get_running_loop()
        with suppress(NotImplementedError, RuntimeError, ValueError):  # not in the main thread
            loop.add_signal_handler(signal.SIGHUP, self.reload_keys)
        tasks = [asyncio.create_task(self.start_engine(), name="engine-load")]
        tasks.append(asyncio.create_task(self.monitor_health(tasks[0]), name="health-monitor"))
        interval = systemd.watchdog_interval_s()
        if interval:
            tasks.append(asyncio.create_task(self.watchdog(interval), name="watchdog"))
        if self.jobs is not None:
            await self.jobs.start()
        try:
            yield
        finally:
            systemd.notify("STOPPING=1")
            await self.shadow.close()
            if self.jobs is not None:  # its leases go back before the engine goes away
                await self.jobs.stop()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.pipeline.close()
