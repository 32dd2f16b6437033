"""The FastAPI app, composed: its state (state.py), the request context around every request
(middleware.py), the one mapping of errors to HTTP (errors.py), and one router per concern (routes/).

A request's way through it: RequestContext (request id, access log) -> the route's dependencies (deps.py:
the caller's key) -> the route (routes/ocr.py: one call into ocr_app/ocr/pipeline.py) -> its answer, or
its error as the API's error body (errors.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI

from ..config import Settings
from ..engines import create_engine
from ..engines.base import Engine
from .errors import add_error_handlers
from .middleware import RequestContext
from .routes import jobs, ocr, openai, probes, web
from .state import VERSION, AppState

log = logging.getLogger("ocr_app.api")  # the name operators select in the journal (LOGGER=ocr_app.api)


def create_app(
    settings: Settings, engine: Engine | None = None, on_fatal: Callable[[str], None] | None = None
) -> FastAPI:
    state = AppState(settings, engine or create_engine(settings), on_fatal)
    if state.keys is None:
        log.warning("authentication is DISABLED (auth_disabled: true): any caller can use this service")
    app = FastAPI(
        title="ocrfleet OCR service",
        version=VERSION,
        description="OCR of images and PDFs: LightOnOCR-2-1B (vLLM) on GPU hosts, PP-OCRv6 on CPU hosts.",
        lifespan=lambda _: state.running(),
        # Served by routes/web.py from the app's own files (FastAPI's pages load them from a CDN).
        docs_url=None,
        redoc_url=None,
    )
    app.state.ocr = state  # what deps.app_state hands the routes
    app.add_middleware(RequestContext, state=state)
    add_error_handlers(app, state.metrics)
    app.include_router(ocr.router)
    app.include_router(openai.router)  # /v1/chat/completions, /v1/models: OpenAI's clients
    app.include_router(jobs.router)
    app.include_router(probes.router)
    app.include_router(web.router())  # the page at / (public: its own API calls carry the key)
    return app
