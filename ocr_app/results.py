"""The API contract: pydantic models of every response body, and the errors the API returns."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer


class Line(BaseModel):
    text: str
    bbox: tuple[float, float, float, float] | None = Field(
        description="[x0, y0, x1, y1] normalised 0-1 to the page as sent (after EXIF orientation); "
        "null when the engine cannot localise the line"
    )
    confidence: float = Field(ge=0.0, le=1.0)


class Block(BaseModel):
    type: str = Field(
        description="text, title, table, header or footer (the rapidocr engine); the vllm engine's from "
        "its Markdown: text, title, table, list, formula, figure"
    )
    bbox: tuple[float, float, float, float] | None = Field(
        description="[x0, y0, x1, y1] normalised 0-1 to the page as sent: the union of its lines' boxes; "
        "null when none of its lines is localised"
    )
    lines: list[int] = Field(description="0-based indices into the page's lines, in reading order")


class Page(BaseModel):
    page: int = Field(ge=1, description="1-based page (or TIFF frame) number in the document")
    width: int = Field(description="pixels of the page as sent; PDF pages at pdf_dpi")
    height: int
    text: str = Field(
        description="the page's text in reading order: each block's lines joined by newlines, blocks apart "
        "by a blank line (the vllm engine: the model's Markdown)"
    )
    rotation: int = Field(
        0,
        description="degrees (0, 90, 180, 270) the engine turned the page clockwise to read it upright; "
        "bbox stays on the page as sent",
    )
    lines: list[Line]
    blocks: list[Block] = Field(
        default_factory=list,
        description="the lines grouped as the page lays them out (columns, paragraphs, titles, tables, "
        "headers and footers), in reading order; every line in exactly one block, blocks in the order "
        "of their lines. Empty when the engine cannot group them",
    )
    warnings: list[str] = Field(default_factory=list)
    preview: str | None = Field(
        None,
        description="with preview=true only (absent otherwise): the page image the engine saw (EXIF "
        "applied, PDF rendered) as a JPEG data URL, longest side at most 1024 px; what bbox refers to",
    )

    @model_serializer(mode="wrap")
    def _omit_preview_unless_asked(self, handler: SerializerFunctionWrapHandler):
        # Absent rather than null: responses without preview=true stay exactly as they were.
        data = handler(self)
        if self.preview is None:
            data.pop("preview", None)
        return data


class Timings(BaseModel):
    queue: float
    preprocess: float
    inference: float
    total: float


class OcrResponse(BaseModel):
    request_id: str
    engine: str
    model: str
    pages: list[Page]
    timings_ms: Timings


class Health(BaseModel):
    status: Literal["ready", "loading", "draining", "degraded", "unhealthy"]
    # degraded: why the instance cannot take new work in reasonable time (its conditions, "; "-joined)
    reason: str | None = None
    model_loaded: bool
    engine: str
    model: str
    device: str
    available_memory_mb: int
    version: str
    inflight: int
    queued: int


class ErrorDetail(BaseModel):
    code: str
    message: str
    request_id: str


class ErrorBody(BaseModel):
    error: ErrorDetail


class ApiError(Exception):
    """An error with its HTTP status and stable machine-readable code."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}

    def __reduce__(self):
        # Raised in decode workers and pickled back to the server.
        return (type(self), (self.status, self.code, self.message, self.headers))


def unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message, {"WWW-Authenticate": 'Bearer realm="ocr"'})


def invalid_image(message: str) -> ApiError:
    return ApiError(400, "invalid_image", message)


def invalid_parameter(message: str) -> ApiError:
    return ApiError(422, "invalid_parameter", message)


def too_large(code: str, message: str) -> ApiError:
    return ApiError(413, code, message)


def unsupported_media_type(message: str) -> ApiError:
    return ApiError(415, "unsupported_media_type", message)


def overloaded(retry_after_s: int) -> ApiError:
    return ApiError(
        503, "overloaded", "server is at capacity; retry later", {"Retry-After": str(retry_after_s)}
    )


def not_ready(status: str) -> ApiError:
    return ApiError(503, "not_ready", f"engine is not ready ({status})", {"Retry-After": "5"})


def client_gone() -> ApiError:
    # nginx's code for it: nobody reads this answer; the access log and ocr_requests_total do.
    return ApiError(499, "client_closed_request", "the client closed the connection; its work was stopped")


def timeout(seconds: float) -> ApiError:
    return ApiError(504, "timeout", f"request did not finish within {seconds:g} s and was cancelled")


def job_page_timeout(seconds: float) -> ApiError:
    """A bulk-job page not read within job_page_timeout_s (Pipeline.run_background): the page's error."""
    return ApiError(504, "timeout", f"the page was not read within {seconds:g} s (job_page_timeout_s)")


def jobs_unavailable(message: str) -> ApiError:
    return ApiError(503, "jobs_unavailable", message, {"Retry-After": "5"})


def invalid_webhook(message: str) -> ApiError:
    return ApiError(400, "invalid_webhook", message)


def job_not_found() -> ApiError:
    return ApiError(404, "not_found", "no such job for this API key")


def idempotency_conflict() -> ApiError:
    return ApiError(
        409, "idempotency_conflict", "this Idempotency-Key was used for another document or other options"
    )


def job_not_finished(status: str) -> ApiError:
    return ApiError(409, "job_not_finished", f"the job is {status}: its result is ready once it is finished")


def too_many_jobs(limit: int) -> ApiError:
    return ApiError(
        429,
        "too_many_jobs",
        f"this API key has {limit} jobs queued or running (max_jobs_in_flight); retry once one finishes",
        {"Retry-After": "10"},
    )


class JobCreated(BaseModel):
    job_id: str
    status_url: str
    events_url: str
    result_url: str


def job_urls(job_id: str) -> JobCreated:
    """A job's URLs, relative to the service: the 202 of POST /v1/jobs and a webhook's body carry them."""
    base = f"/v1/jobs/{job_id}"
    return JobCreated(
        job_id=job_id, status_url=base, events_url=f"{base}/events", result_url=f"{base}/result"
    )


class JobPages(BaseModel):
    total: int
    done: int = Field(description="pages read")
    failed: int = Field(description="pages that could not be read (see errors)")


class PageError(BaseModel):
    page: int
    error: dict[str, str] = Field(description="{code, message}: as /v1/ocr would have answered the page")


class JobStatus(BaseModel):
    job_id: str
    status: Literal["queued", "running", "done", "failed", "cancelled"]
    pages: JobPages
    created_at: str
    started_at: str | None
    finished_at: str | None
    expires_at: str | None = Field(description="when the job and its results are deleted (job_result_ttl_s)")
    errors: list[PageError]


# Documented in OpenAPI for /v1/ocr.
ERROR_RESPONSES: dict[int | str, dict] = {
    s: {"model": ErrorBody, "description": d}
    for s, d in {
        400: "invalid_image: undecodable or truncated document",
        401: "unauthorized: missing or wrong API key",
        413: "payload_too_large, image_too_large, too_many_pages, decode_cpu_limit or decode_memory_limit",
        415: "unsupported_media_type",
        422: "invalid_parameter",
        503: "overloaded (with Retry-After) or not_ready",
        504: "timeout: the request deadline passed; the work was cancelled",
    }.items()
}
