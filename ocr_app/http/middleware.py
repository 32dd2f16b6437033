"""Around every request: its id, one access-log line, the request metrics, and the last-resort 500."""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..logs import request_id_var
from .errors import error_response
from .state import AppState

# The names operators select in the journal (LOGGER=ocr_app.access, LOGGER=ocr_app.api).
access_log = logging.getLogger("ocr_app.access")
log = logging.getLogger("ocr_app.api")

_SANE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")
_PROBE_PATHS = ("/healthz", "/livez", "/metrics")
# The OCR requests (ocr_requests_total, ocr_request_duration_seconds): /v1/ocr's and OpenAI's chat route's
# (counted also on their own, in ocr_chat_requests_total).
CHAT_PATH = "/v1/chat/completions"
OCR_PATHS = ("/v1/ocr", CHAT_PATH)


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

    def _record(self, scope: Scope, req_state: dict[str, Any], status: int, seconds: float) -> None:
        path = scope["path"]
        if path in OCR_PATHS:
            self.state.metrics.requests.labels(str(status)).inc()
            self.state.metrics.request_duration.observe(seconds)
        if path == CHAT_PATH:
            self.state.metrics.chat_requests.labels(str(status)).inc()
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
