"""The FastAPI app: routes, request context, and the engine's lifecycle (errors -> HTTP: http/errors.py).

The OCR work itself (admission, decode, engine) is ocr_app/ocr/pipeline.py's; this module is HTTP."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import time
import uuid
from collections.abc import Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import __version__, systemd, web
from .auth import KEY_HEADERS, KeyStore, require_caller
from .config import Settings
from .documents.upload import MULTIPART_TYPE, SUPPORTED_TYPES, normalise_media_type, parse_page_selection
from .engines import create_engine
from .engines.base import Engine
from .errors import (
    ClientGone,
    InvalidParameter,
    JobsUnavailable,
    NotReady,
    PayloadTooLarge,
    UnsupportedMediaType,
)
from .fleet.shadow import SHADOW_HEADER, Offer, Shadow
from .http.errors import ERROR_RESPONSES, add_error_handlers, error_response
from .jobs.service import NO_DATABASE, Jobs, check_webhook_url
from .logs import request_id_var
from .metrics import Metrics
from .ocr.pipeline import CLIENT_GONE, Job, Pipeline, Trace
from .schemas import ErrorBody, Health, JobCreated, JobStatus, OcrResponse, job_urls

log = logging.getLogger("ocr_app.api")
access_log = logging.getLogger("ocr_app.access")

VERSION = __version__
_SANE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")
_PROBE_PATHS = ("/healthz", "/livez", "/metrics")


class AppState:
    """Everything a request needs, built once from Settings."""

    def __init__(self, settings: Settings, engine: Engine, on_fatal: Callable[[str], None] | None):
        self.metrics = Metrics()
        self.pipeline = Pipeline(settings, engine, self.metrics)
        # With the engine's defaults filled in (Settings.for_engine, applied by the pipeline).
        self.settings = settings = self.pipeline.settings
        self.engine = engine
        self.on_fatal = on_fatal
        self.keys = KeyStore(settings.api_keys_file) if not settings.auth_disabled else None
        self.metrics.info.labels(VERSION, engine.name, engine.model).set(1)
        self.shadow = Shadow(settings, self.metrics.registry)
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

    def health_status(self) -> tuple[str, str | None]:
        """/healthz's status and, when degraded, why."""
        if self.status != "ready":
            return self.status, None
        if self.stopping or self.admission.draining:
            return "draining", None
        problems = self.health.problems()
        return ("degraded", "; ".join(problems)) if problems else ("ready", None)

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

    async def monitor_health(self, engine_load: asyncio.Task) -> None:
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


def _free_memory_mb(engine: Engine) -> int:
    """The engine's device (a GPU's free memory), else the host's available memory."""
    device = engine.available_memory_mb()
    return device if device is not None else _available_memory_mb()


def _available_memory_mb() -> int:
    avail = None
    with suppress(OSError, ValueError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    # Inside a systemd unit with MemoryMax=, the cgroup's headroom is what matters.
    with suppress(OSError, ValueError):
        cg = Path("/sys/fs/cgroup")
        limit = (cg / "memory.max").read_text().strip()
        if limit != "max":
            room = int(limit) - int((cg / "memory.current").read_text())
            avail = room if avail is None else min(avail, room)
    return max(0, (avail or 0) // (1024 * 1024))


class RequestContext:
    """Request id, one access-log line, request metrics and last-resort 500s, around every request.

    A plain ASGI middleware: it does not buffer bodies, and it sees errors that escape the routes.
    """

    def __init__(self, app: ASGIApp, state: AppState):
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), "")
        rid = sent if _SANE_REQUEST_ID.match(sent) else uuid.uuid4().hex
        req_state = scope.setdefault("state", {})
        req_state["request_id"] = rid
        token = request_id_var.set(rid)
        started = time.perf_counter()
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
            # The client has its answer: only now may a replay to a canary start (ocr_app/fleet/shadow.py).
            offer = req_state.pop("shadow", None)
            if offer is not None and status == 200:
                self.state.shadow.offer(offer)
        except Exception:
            log.exception("unhandled error")
            if status == 0:
                status = 500
                await error_response(500, "internal_error", "internal server error", rid)(
                    scope, receive, send_with_id
                )
        finally:
            self._record(scope, req_state, status, time.perf_counter() - started)
            request_id_var.reset(token)

    def _access_level(self, path: str, status: int, seconds: float) -> int:
        """The access line's level, hence its journal priority: debug for probes; err for a failure of
        ours (500, 502); warning for a refusal under load, a passed deadline (503, 504), a slow request."""
        if path in _PROBE_PATHS:
            return logging.DEBUG
        if status >= 500 and status not in (503, 504):
            return logging.ERROR
        # An event stream lasts as long as its job: its length is no slowness.
        slow = seconds >= self.state.settings.slow_request_s and not path.endswith("/events")
        if status >= 500 or slow:
            return logging.WARNING
        return logging.INFO

    def _record(self, scope: Scope, req_state: dict, status: int, seconds: float) -> None:
        path = scope["path"]
        if path == "/v1/ocr":
            self.state.metrics.requests.labels(str(status)).inc()
            self.state.metrics.request_duration.observe(seconds)
        access_log.log(
            self._access_level(path, status, seconds),
            "request",
            extra={
                "caller": req_state.get("caller"),
                "engine": self.state.engine.name,
                "method": scope["method"],
                "route": path,
                "status": status,
                "duration_ms": round(seconds * 1000, 1),
                "pages": req_state.get("pages"),
                "bytes": req_state.get("bytes"),
                "error": req_state.get("error"),
            },
        )


def _check_media_type(content_type: str) -> None:
    media_type = normalise_media_type(content_type)
    if media_type != MULTIPART_TYPE and media_type not in SUPPORTED_TYPES:
        raise UnsupportedMediaType(
            f"unsupported Content-Type {media_type or '(none)'!r}: send multipart/form-data "
            f"with a 'file' field, or one of {', '.join(SUPPORTED_TYPES)}"
        )


def _check_max_tokens(max_tokens: int | None, cap: int) -> None:
    if max_tokens is not None and max_tokens > cap:
        raise InvalidParameter(f"max_tokens must be at most {cap} (vllm_max_tokens_cap)")


def _check_declared_length(request: Request, limit: int) -> None:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"body of {declared} bytes exceeds {limit} bytes")


async def _read_body(request: Request, limit: int) -> bytes:
    buf = bytearray()
    try:
        async for chunk in request.stream():
            buf += chunk
            if len(buf) > limit:  # chunked uploads: stop reading at the limit
                raise PayloadTooLarge(f"body exceeds {limit} bytes")
    except ClientDisconnect:  # an upload abandoned half way is the client's doing, not a 500
        raise ClientGone() from None
    return bytes(buf)


async def _cancel_when_client_leaves(request: Request, work: asyncio.Task) -> None:
    """Once the body is read, the server's next ASGI message is http.disconnect, sent when the client closes
    the connection (or when the response is complete: this watcher is stopped before that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    work.cancel(CLIENT_GONE)


_OCR_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            MULTIPART_TYPE: {
                "schema": {
                    "type": "object",
                    "properties": {"file": {"type": "string", "format": "binary"}},
                    "required": ["file"],
                }
            },
            **{t: {"schema": {"type": "string", "format": "binary"}} for t in SUPPORTED_TYPES},
        },
    }
}


def create_app(
    settings: Settings, engine: Engine | None = None, on_fatal: Callable[[str], None] | None = None
) -> FastAPI:
    state = AppState(settings, engine or create_engine(settings), on_fatal)
    if state.keys is None:
        log.warning("authentication is DISABLED (auth_disabled: true): any caller can use this service")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loop = asyncio.get_running_loop()
        with suppress(NotImplementedError, RuntimeError, ValueError):  # not in the main thread
            loop.add_signal_handler(signal.SIGHUP, state.reload_keys)
        tasks = [asyncio.create_task(state.start_engine(), name="engine-load")]
        tasks.append(asyncio.create_task(state.monitor_health(tasks[0]), name="health-monitor"))
        interval = systemd.watchdog_interval_s()
        if interval:
            tasks.append(asyncio.create_task(state.watchdog(interval), name="watchdog"))
        if state.jobs is not None:
            await state.jobs.start()
        try:
            yield
        finally:
            systemd.notify("STOPPING=1")
            await state.shadow.close()
            if state.jobs is not None:  # its leases go back before the engine goes away
                await state.jobs.stop()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await state.pipeline.close()

    app = FastAPI(
        title="ocrfleet OCR service",
        version=VERSION,
        description="OCR of images and PDFs: LightOnOCR-2-1B (vLLM) on GPU hosts, PP-OCRv6 on CPU hosts.",
        lifespan=lifespan,
        # Served by web.router() from the app's own files (FastAPI's pages load them from a CDN).
        docs_url=None,
        redoc_url=None,
    )
    app.state.ocr = state
    app.add_middleware(RequestContext, state=state)

    add_error_handlers(app, state.metrics)

    @app.post(
        "/v1/ocr",
        response_model=OcrResponse,
        responses=ERROR_RESPONSES,
        openapi_extra=_OCR_BODY,
        summary="OCR an image or a PDF",
    )
    async def ocr(
        request: Request,
        caller: str = Depends(require_caller),
        pages: str | None = Query(None, description="PDF/TIFF pages, e.g. 1-3,5", max_length=200),
        preview: bool = Query(False, description="each page's image as the engine saw it, as a data URL"),
        max_tokens: int | None = Query(
            None, ge=1, description="vllm engine: the most tokens the model may write per page"
        ),
    ) -> OcrResponse:
        s = state.settings
        if state.status != "ready":
            raise NotReady(state.status)
        content_type = request.headers.get("content-type", "")
        _check_media_type(content_type)
        job = Job(content_type, parse_page_selection(pages, s.max_pages), preview, max_tokens)
        _check_max_tokens(max_tokens, s.vllm_max_tokens_cap)
        _check_declared_length(request, s.max_upload_bytes)  # refused before a byte of it is read

        trace = Trace()
        work = asyncio.current_task()
        assert work is not None
        watcher: asyncio.Task | None = None
        body = b""

        async def read_body() -> bytes:
            nonlocal watcher, body
            body = await _read_body(request, s.max_upload_bytes)
            # A client that leaves stops its work (the decode worker is killed, the engine's pages dropped).
            watcher = asyncio.create_task(_cancel_when_client_leaves(request, work))
            return body

        try:
            answer = await state.pipeline.run(read_body, job, request.state.request_id, trace)
        except asyncio.CancelledError:
            if watcher is None or not watcher.done() or watcher.cancelled():
                raise  # not the client's leaving (the server is stopping)
            work.uncancel()
            raise ClientGone() from None
        finally:
            if watcher is not None:
                watcher.cancel()
            request.state.bytes, request.state.pages = trace.bytes, trace.pages
        # For a replay to a canary (ocr_app/fleet/shadow.py), offered by RequestContext once answered.
        if s.shadow_file is not None and SHADOW_HEADER not in request.headers:  # a replay is not replayed
            request.state.shadow = Offer(
                body=body,
                content_type=content_type,
                query=[(k, v) for k, v in request.query_params.multi_items() if k != "preview"],
                auth={h: request.headers[h] for h in KEY_HEADERS if h in request.headers},
                request_id=request.state.request_id,
                answer=answer,
            )
        return answer

    _job_routes(app, state)

    @app.get("/healthz", response_model=Health, responses={503: {"model": Health}})
    async def healthz() -> JSONResponse:
        status, reason = state.health_status()
        body = Health(
            status=status,  # type: ignore[arg-type]
            reason=reason,
            model_loaded=state.status == "ready",
            engine=state.engine.name,
            model=state.engine.model,
            device=state.engine.device,
            available_memory_mb=_free_memory_mb(state.engine),
            version=VERSION,
            inflight=state.admission.inflight,
            queued=state.admission.queued,
        )
        return JSONResponse(body.model_dump(), status_code=200 if status == "ready" else 503)

    @app.get("/livez")
    async def livez() -> dict[str, str]:
        return {"status": "alive"}

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(web.router())  # the page at / (public: its own API calls carry the key)
    return app


_JOB_ERRORS: dict[int | str, dict] = {
    **{k: v for k, v in ERROR_RESPONSES.items() if k in (401, 422)},
    404: {"model": ErrorBody, "description": "not_found: no such job for this API key"},
    503: {
        "model": ErrorBody,
        "description": "jobs_unavailable: no database configured, or its schema is behind",
    },
}
_SUBMIT_ERRORS: dict[int | str, dict] = {
    **ERROR_RESPONSES,
    400: {
        "model": ErrorBody,
        "description": "invalid_image: undecodable or truncated document; "
        "invalid_webhook: webhook_url not under job_webhook_allowed_urls",
    },
    409: {"model": ErrorBody, "description": "idempotency_conflict: the key was used for another document"},
    429: {
        "model": ErrorBody,
        "description": "too_many_jobs: max_jobs_in_flight queued or running for this key",
    },
    503: _JOB_ERRORS[503],
}


def _job_routes(app: FastAPI, state: AppState) -> None:
    """POST /v1/jobs and /v1/jobs/{id}[/events|/result]: thin; the work is ocr_app/jobs/service.py's."""

    @app.post(
        "/v1/jobs",
        status_code=202,
        response_model=JobCreated,
        responses=_SUBMIT_ERRORS,
        openapi_extra=_OCR_BODY,
        summary="Submit a document as a bulk job (read page by page by the whole fleet)",
        description="The job is read by every instance; follow it at status_url or events_url, fetch its "
        "pages at result_url. With webhook_url (see the parameter: what is sent, how it is signed), "
        "`ocr_app.jobs.webhooks.verify` checks a delivery's signature. Unsigned when the server runs without "
        "API keys and job_webhook_secret is unset.",
    )
    async def submit_job(
        request: Request,
        caller: str = Depends(require_caller),
        pages: str | None = Query(None, description="PDF/TIFF pages, e.g. 1-300", max_length=200),
        preview: bool = Query(False, description="each page's image as the engine saw it, as a data URL"),
        max_tokens: int | None = Query(
            None, ge=1, description="vllm engine: the most tokens the model may write per page"
        ),
        webhook_url: str | None = Query(
            None,
            max_length=2000,
            description="POSTed to once the job is finished (done, failed or cancelled), JSON "
            "{event: job.finished, job_id, status, pages_total, pages_done, pages_failed, finished_at, "
            "status_url, result_url}, headers X-OCR-Webhook-Id (the same on every retry) and "
            "X-OCR-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, '<t>.' + body)>, the secret "
            "being the hex sha256 of your API key. Must lie under the server's job_webhook_allowed_urls "
            "(else 400 invalid_webhook). Answer 2xx; a 5xx or no answer is retried with back-off, a 3xx "
            "(never followed) or 4xx is not",
        ),
        idempotency_key: str | None = Header(
            None,
            max_length=200,
            description="the same key and the same document (and options) return the same job",
        ),
    ) -> JSONResponse:
        s = state.settings
        jobs = state.require_jobs()
        content_type = request.headers.get("content-type", "")
        _check_media_type(content_type)
        check_webhook_url(webhook_url, s.job_webhook_allowed_urls)
        selection = parse_page_selection(pages, s.max_job_pages)
        _check_max_tokens(max_tokens, s.vllm_max_tokens_cap)
        _check_declared_length(request, s.max_job_bytes)
        body = await _read_body(request, s.max_job_bytes)
        request.state.bytes = len(body)
        job_id, created = await jobs.submit(
            caller, idempotency_key, body, content_type, selection, preview, max_tokens, webhook_url
        )
        headers = {"Location": f"/v1/jobs/{job_id}"} | ({} if created else {"Idempotent-Replayed": "true"})
        return JSONResponse(job_urls(str(job_id)).model_dump(), status_code=202, headers=headers)

    @app.get("/v1/jobs/{job_id}", response_model=JobStatus, responses=_JOB_ERRORS, summary="A job's status")
    async def job_status(job_id: str, caller: str = Depends(require_caller)) -> JobStatus:
        return JobStatus(**await state.require_jobs().status(caller, job_id))

    @app.delete(
        "/v1/jobs/{job_id}",
        response_model=JobStatus,
        responses=_JOB_ERRORS,
        summary="Cancel a job: its pages not yet started are not run",
    )
    async def cancel_job(job_id: str, caller: str = Depends(require_caller)) -> JobStatus:
        return JobStatus(**await state.require_jobs().cancel(caller, job_id))

    @app.get(
        "/v1/jobs/{job_id}/events",
        responses={**_JOB_ERRORS, 200: {"content": {"text/event-stream": {}}, "description": "the events"}},
        response_class=StreamingResponse,
        summary="Server-Sent Events: progress, then a page event per page in order (id: the page), then done",
    )
    async def job_events(
        job_id: str,
        caller: str = Depends(require_caller),
        last_event_id: str | None = Header(
            None, max_length=20, description="resume after this page (the id of the last page event)"
        ),
    ) -> StreamingResponse:
        stream = await state.require_jobs().events(caller, job_id, last_event_id)
        return StreamingResponse(
            stream,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    @app.get(
        "/v1/jobs/{job_id}/result",
        responses={
            **_JOB_ERRORS,
            409: {"model": ErrorBody, "description": "job_not_finished"},
            200: {
                "content": {"application/json": {}, "application/x-ndjson": {}},
                "description": "the pages",
            },
        },
        response_class=StreamingResponse,
        summary="A finished job's pages in order: JSON, or JSON Lines with Accept: application/x-ndjson",
    )
    async def job_result(
        job_id: str, request: Request, caller: str = Depends(require_caller)
    ) -> StreamingResponse:
        ndjson = "application/x-ndjson" in request.headers.get("accept", "")
        stream = await state.require_jobs().result(caller, job_id, ndjson)
        return StreamingResponse(stream, media_type="application/x-ndjson" if ndjson else "application/json")
