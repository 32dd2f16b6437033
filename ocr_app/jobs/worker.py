"""The in-process job worker: claims page ranges while this instance has spare capacity, reads their pages
through the Pipeline (as /v1/ocr reads them), keeps its leases alive, and gives them back when it stops.

Loops, one owner each: `job_max_inflight` claimers (a page each at most, started when
Admission.background_may_start() says so: interactive requests come first), the heartbeat (every lease
renewed at a third of job_lease_s), the timer (schema check, result expiry, fleet-wide metrics, every
job_sweep_s), and WEBHOOK_SENDERS webhook senders (a finished job's delivery each, leased like a range:
webhooks.py says what is sent and when again).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import suppress
from functools import partial
from typing import Any, TypeVar

import httpx
import psycopg

from .. import urls
from ..config import Settings
from ..egress import Policy, guarded_client
from ..errors import AddressRefused, OcrError, Unavailable, UrlUnresolvable
from ..metrics import Metrics
from ..ocr.pipeline import Job, Pipeline
from ..schemas import job_urls
from . import webhooks
from .deliveries import Delivery
from .ranges import Claim
from .store import JobStore, primary_lost

log = logging.getLogger("ocr_app.jobs")
T = TypeVar("T")

# A job owner's webhook secret: (found, secret); not found: its API key was removed since
# (ocr_app/http/state.py's AppState.webhook_secret).
SecretOf = Callable[[str], tuple[bool, str | None]]
# Deliveries attempted at once by an instance: a receiver slow to answer holds one sender only.
WEBHOOK_SENDERS = 4


class JobWorker:
    def __init__(
        self,
        settings: Settings,
        store: JobStore,
        pipeline: Pipeline,
        metrics: Metrics,
        may_work: Callable[[], bool],
        webhook_secret: SecretOf,
        egress: Policy,
    ):
        self.settings = settings
        self.egress = egress  # where a webhook may be delivered (ocr_app/egress.py)
        self.store = store
        self.pipeline = pipeline
        self.metrics = metrics
        self.may_work = may_work  # the engine is ready, the instance neither draining nor stopping
        self.webhook_secret = webhook_secret
        # Unique per process: a restarted instance never renews its predecessor's leases.
        self.id = f"{socket.gethostname()}:{settings.port}:{os.getpid()}"
        self._tasks: list[asyncio.Task[None]] = []
        # When a claim last found nothing: the claimers then wait job_poll_s together, so an idle instance
        # asks the database about once per job_poll_s however many claimers it runs.
        self._empty_at = -float("inf")
        # The ranges being read now: the heartbeat renews these only, so a range given up on an error is
        # never kept alive by the heartbeat; its lease expires and another worker takes it.
        self._held: dict[tuple[uuid.UUID, int], Claim] = {}
        self._hooks_empty_at = -float("inf")  # as _empty_at, for the webhook senders
        self._http: httpx.AsyncClient | None = None  # the webhooks' client, from start() to stop()

    def start(self) -> None:
        # Redirects are never followed (a receiver could point the app anywhere); no proxy from the
        # environment (a receiver is reached directly, as the allow-list says); every connection through the
        # request-forgery guard, as a document URL's.
        self._http = guarded_client(self.egress, self.settings.job_webhook_timeout_s)
        self.metrics.registry.register(self.metrics.job_store_up)
        self._tasks = [asyncio.create_task(self._watch(), name="jobs-watch")]
        self._tasks.append(asyncio.create_task(self._timer(), name="jobs-timer"))
        self._tasks.append(asyncio.create_task(self._heartbeat(), name="jobs-heartbeat"))
        self._tasks += [
            asyncio.create_task(self._claimer(), name=f"jobs-claimer-{i}")
            for i in range(self.settings.job_max_inflight or 1)
        ]
        self._tasks += [
            asyncio.create_task(self._webhook_sender(), name=f"jobs-webhook-{i}")
            for i in range(WEBHOOK_SENDERS)
        ]

    async def stop(self) -> None:
        """Stop working and give every lease back, so other instances take the ranges at once."""
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with suppress(psycopg.Error):
            released = await self.store.ranges.release(self.id)
            if released:
                log.info("job leases released", extra={"ranges": released})
            released = await self.store.deliveries.release(self.id)
            if released:
                log.info("webhook deliveries released", extra={"webhooks": released})
        if self._http is not None:
            await self._http.aclose()

    def wake(self) -> None:
        """A job was submitted here: look for ranges now, not after job_poll_s."""
        self._empty_at = -float("inf")

    def _claimable(self) -> bool:
        return (
            self.store.refusal() is None
            and self.may_work()
            and self.pipeline.admission.background_may_start()
        )

    async def _claimer(self) -> None:
        poll = self.settings.job_poll_s
        while True:
            if not self._claimable() or time.monotonic() - self._empty_at < poll:
                await asyncio.sleep(min(poll, 0.1))
                continue
            try:
                claim = await self.store.ranges.claim(self.id, self.settings.job_lease_s)
                if claim is None:
                    self._empty_at = time.monotonic()
                    continue
                if claim.reclaimed:
                    self.metrics.job_lease_expiries.inc()
                    log.warning(
                        "job range reclaimed after its lease expired",
                        extra={"job_id": str(claim.job_id), "first_page": claim.first_page},
                    )
                key = (claim.job_id, claim.first_page)
                self._held[key] = claim
                try:
                    await self._work(claim)
                finally:
                    del self._held[key]
            except psycopg.Error as err:  # the database is away: its leases expire, the ranges come back
                log.warning("job worker: database error: %s", err)
                await asyncio.sleep(poll)
            except Exception:  # a bug must not stop this instance's share of the work for good
                log.exception("job worker: unexpected error")
                await asyncio.sleep(poll)

    async def _work(self, claim: Claim) -> None:
        body = await self.store.ranges.document(claim.job_id)
        if body is None:  # cancelled (or finished) since the claim: nothing to read
            return
        written = await self.store.ranges.written(claim.job_id, claim.pages)
        for page in claim.pages:
            if page in written:  # the range's previous owner wrote it before it died
                continue
            # Renewed before each page, and again after any wait for a turn: a range lost meanwhile
            # (cancelled, purged or reclaimed) starts no page.
            give_up = time.monotonic() + self.settings.job_lease_s / 3
            while True:
                if not await self.store.ranges.keep(claim, self.id, self.settings.job_lease_s):
                    return
                if self.may_work() and self.pipeline.admission.background_may_start():
                    break
                if not await self._wait_for_turn(give_up):
                    await self.store.ranges.release(self.id, claim)
                    return
            opts = claim.options
            job = Job(claim.content_type, [page], opts.get("preview", False), opts.get("max_tokens"))
            try:  # no await between background_may_start() and run_background counting the page
                result = (await self.pipeline.run_background(body, job))[0].model_dump_json()
                error = None
            except OcrError as err:
                if isinstance(err, Unavailable):  # this instance's trouble (engine, decode pool, busy)
                    await self.store.ranges.release(self.id, claim)
                    await asyncio.sleep(self.settings.job_poll_s)
                    return
                result, error = None, {"code": err.code, "message": err.message}
            written_now = await self._retried(
                partial(self.store.ranges.write_page, claim.job_id, page, result, error, self.id)
            )
            if written_now:
                self.metrics.job_pages.labels("ok" if error is None else "failed").inc()
        status = await self._retried(
            partial(self.store.ranges.finish_range, claim, self.id, self.settings.job_result_ttl_s)
        )
        if status is not None:
            log.info("job finished", extra={"job_id": str(claim.job_id), "status": status})

    async def _retried(self, write: Callable[[], Awaitable[T]]) -> T:
        """A page's result (or a range's end) written, tried again each job_poll_s while the connection is
        lost or the primary moved (25006: the pool has reconnected meanwhile), so that a failover never
        makes a page be read twice. Both writes are idempotent (a page is written once; a range ended once).
        Bounded by job_lease_s: past it the range may be another instance's, and the error goes up (the
        range comes back to the queue when its lease expires)."""
        give_up = time.monotonic() + self.settings.job_lease_s
        while True:
            try:
                return await write()
            except psycopg.Error as err:
                lost = isinstance(err, psycopg.OperationalError) or primary_lost(err)
                if not lost or time.monotonic() >= give_up:
                    raise
                log.warning("job worker: write failed, retrying: %s", err)
                await asyncio.sleep(self.settings.job_poll_s)

    async def _wait_for_turn(self, give_up: float) -> bool:
        """Until a job page may start here; False when this instance stops working (drain, stop) or its
        interactive requests kept the range waiting until `give_up` (a heartbeat period, job_lease_s / 3):
        its other pages go back to the queue, for an instance with time to read them."""
        while not self.pipeline.admission.background_may_start():
            if not self.may_work() or time.monotonic() > give_up:
                return False
            await asyncio.sleep(0.02)  # a poll interval: interactive requests come first
        return self.may_work()

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.settings.job_lease_s / 3)
            for claim in list(self._held.values()):
                try:
                    await self.store.ranges.keep(claim, self.id, self.settings.job_lease_s)
                except psycopg.Error as err:
                    log.warning("job lease renewal failed: %s", err)

    async def _watch(self) -> None:
        """The job database's reachability and schema, each job_poll_s: the job routes refuse at once
        while it is away, the claimers and webhook senders wait, and /healthz says so (job_store)."""
        while True:
            await self.store.probe()
            self.metrics.job_store_up.set(1 if self.store.reachable else 0)
            await asyncio.sleep(self.settings.job_poll_s)

    async def _timer(self) -> None:
        await self.store.probed.wait()  # the schema version comes with the first probe
        while True:
            try:
                if self.store.refusal() is None:
                    deleted = await self.store.sweep()
                    if deleted:
                        log.info("expired jobs deleted", extra={"jobs": deleted})
                    by_status, pages_queued, oldest_s = await self.store.stats()
                    for status in ("queued", "running", "done", "failed", "cancelled"):
                        self.metrics.jobs.labels(status).set(by_status.get(status, 0))
                    self.metrics.job_pages_queued.set(pages_queued)
                    self.metrics.job_oldest_queued.set(oldest_s)
            except psycopg.Error as err:
                log.warning("job timer: database error: %s", err)
            await asyncio.sleep(self.settings.job_sweep_s)

    # --- webhooks ---------------------------------------------------------------------------------------

    async def _webhook_sender(self) -> None:
        poll = self.settings.job_poll_s
        lease_s = self.settings.job_webhook_timeout_s + self.settings.job_lease_s
        while True:
            if self.store.refusal() is not None or time.monotonic() - self._hooks_empty_at < poll:
                await asyncio.sleep(min(poll, 0.1))
                continue
            try:
                delivery = await self.store.deliveries.claim(self.id, lease_s)
                if delivery is None:
                    self._hooks_empty_at = time.monotonic()
                    continue
                await self._deliver(delivery)
            except psycopg.Error as err:  # its lease expires: another sender attempts it again
                log.warning("webhook sender: database error: %s", err)
                await asyncio.sleep(poll)
            except Exception:
                log.exception("webhook sender: unexpected error")
                await asyncio.sleep(poll)

    async def _deliver(self, d: Delivery) -> None:
        s = self.settings
        ctx = {
            "job_id": str(d.job_id),
            "webhook_id": str(d.id),
            "attempt": d.attempts,
            "receiver": urls.host_of(d.url),
        }
        if d.attempts > s.job_webhook_max_attempts:  # its senders died mid-attempt, each time
            return await self._webhook_failed(d, None, "job_webhook_max_attempts spent", ctx)
        if not urls.allowed(d.url, s.job_webhook_allowed_urls):
            return await self._webhook_failed(d, None, "no longer under job_webhook_allowed_urls", ctx)
        found, secret = self.webhook_secret(d.owner)
        if not found:
            return await self._webhook_failed(d, None, "the job's API key no longer exists", ctx)
        status = await self.store.status(d.owner, d.job_id)
        if status is None:  # expired meanwhile: its delivery went with it
            return
        links = job_urls(str(d.job_id))
        body = webhooks.payload(status, links.status_url, links.result_url)
        code: int | None = None
        error: str | None = None
        assert self._http is not None
        try:
            # The whole attempt, connect to status line: httpx's timeout is per read, a drip-fed answer
            # would outlast it.
            async with (
                asyncio.timeout(s.job_webhook_timeout_s),
                self._http.stream(
                    "POST", d.url, content=body, headers=webhooks.headers(str(d.id), body, secret)
                ) as r,
            ):
                code = r.status_code  # the answer's body is not read
            outcome = webhooks.classify(code)
        except TimeoutError:
            outcome, error = "retry", "timeout"
        except AddressRefused as err:  # the receiver's name resolves where the service never connects
            return await self._webhook_failed(d, None, err.message, ctx, err.code)
        except (httpx.HTTPError, httpx.InvalidURL, OSError, UrlUnresolvable) as err:
            outcome, error = "retry", getattr(err, "code", None) or type(err).__name__
        ctx["http_status"] = code
        if outcome == "delivered":
            await self.store.deliveries.done(d, "delivered", code, None)
            self.metrics.job_webhooks.labels("delivered").inc()
            log.info("webhook delivered", extra=ctx)
        elif outcome == "retry" and d.attempts < s.job_webhook_max_attempts:
            after_s = webhooks.backoff(d.attempts, s.job_webhook_retry_base_s)
            await self.store.deliveries.retry(d, after_s, code, error)
            self.metrics.job_webhooks.labels("retried").inc()
            log.info(
                "webhook attempt failed, retried later", extra=ctx | {"error": error, "retry_in_s": after_s}
            )
        else:
            why = (
                f"gave up after {d.attempts} attempt(s)"
                if outcome == "retry"
                else "the receiver answered a redirect or a client error (not retried)"
            )
            await self._webhook_failed(d, code, f"{why}: {error or code}", ctx, error)

    async def _webhook_failed(
        self, d: Delivery, code: int | None, why: str, ctx: dict[str, Any], error: str | None = None
    ) -> None:
        await self.store.deliveries.done(d, "failed", code, error or why)
        self.metrics.job_webhooks.labels("failed").inc()
        log.warning("webhook failed: %s", why, extra=ctx)
