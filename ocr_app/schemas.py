"""The API contract: pydantic models of every response body (an error's too: ErrorBody). Which error answers
with which status is ocr_app/http/errors.py's."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer


class Word(BaseModel):
    text: str
    bbox: tuple[float, float, float, float] | None = Field(
        description="[x0, y0, x1, y1] normalised 0-1 to the page as sent, as the engine located the word"
    )
    confidence: float = Field(ge=0.0, le=1.0)


class Line(BaseModel):
    text: str
    bbox: tuple[float, float, float, float] | None = Field(
        description="[x0, y0, x1, y1] normalised 0-1 to the page as sent (after EXIF orientation); "
        "null when the engine cannot localise the line"
    )
    confidence: float = Field(ge=0.0, le=1.0)
    words: list[Word] | None = Field(
        default=None,
        description="the line's words (CJK: characters) with their own boxes and confidences, where the "
        "engine locates them (rapidocr), left to right; absent otherwise. Their texts, in order, spell the "
        "line's (its spaces aside)",
    )

    @model_serializer(mode="wrap")
    def _omit_words_unless_located(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        data: dict[str, Any] = handler(self)
        if self.words is None:
            data.pop("words", None)
        return data


class Cell(BaseModel):
    row: int = Field(ge=0, description="0-based row of the table")
    column: int = Field(ge=0, description="0-based column: the leftmost the cell covers")
    row_span: int = Field(1, ge=1)
    column_span: int = Field(1, ge=1)
    text: str = Field(description="its lines' text, left to right, apart by a space")
    bbox: tuple[float, float, float, float] | None = Field(
        description="[x0, y0, x1, y1] normalised 0-1 to the page as sent: the union of its lines' boxes"
    )
    lines: list[int] = Field(description="0-based indices into the page's lines")


# A table block's own fields: absent from other blocks (and from a table whose cells are not known).
_TABLE_FIELDS = ("rows", "columns", "cells")


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
    rows: int | None = Field(default=None, ge=0, description="table blocks only: its number of rows")
    columns: int | None = Field(default=None, ge=0, description="table blocks only: its number of columns")
    cells: list[Cell] | None = Field(
        default=None,
        description="table blocks only: its cells, row by row, left to right; a cell absent from the list "
        "is empty. The block's lines are read cell by cell",
    )

    @model_serializer(mode="wrap")
    def _omit_table_fields_elsewhere(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        data: dict[str, Any] = handler(self)
        for name in _TABLE_FIELDS:
            if getattr(self, name) is None:
                data.pop(name, None)
        return data


class Usage(BaseModel):
    prompt_tokens: int = Field(ge=0, description="the prompt's tokens, the page image's among them")
    completion_tokens: int = Field(ge=0, description="the tokens the model wrote")


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
    usage: Usage | None = Field(
        default=None,
        description="engine vllm only (absent otherwise): the tokens the page took, every attempt counted "
        "(a page run again after a degenerate answer counts each run)",
    )
    preview: str | None = Field(
        None,
        description="with preview=true only (absent otherwise): the page image the engine saw (EXIF "
        "applied, PDF rendered) as a JPEG data URL, longest side at most 1024 px; what bbox refers to",
    )

    # No return annotation: pydantic would take it for the serialised schema (OpenAPI's Page).
    @model_serializer(mode="wrap")
    def _omit_preview_unless_asked(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        # Absent rather than null: responses without preview=true stay exactly as they were.
        data: dict[str, Any] = handler(self)
        if self.preview is None:
            data.pop("preview", None)
        if self.usage is None:
            data.pop("usage", None)
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


JobStoreState = Literal["off", "connecting", "ready", "unreachable", "schema_behind"]
# Why an instance is degraded (ocr_app/ocr/health.py): the event loop woke late, the decode pool is stalled or
# failing, the engine is wedged, the device refuses it, a watched filesystem is nearly full.
HealthProblemCode = Literal[
    "event_loop_lag", "decode_pool_stalled", "decode_pool_failing", "engine_wedged", "device", "disk_low"
]


class HealthProblem(BaseModel):
    code: HealthProblemCode
    message: str


class Health(BaseModel):
    status: Literal["ready", "loading", "draining", "degraded", "unhealthy"]
    # degraded: why the instance cannot take new work in reasonable time (its conditions, "; "-joined)...
    reason: str | None = None
    # ...and each of them with a code for machines (empty unless degraded).
    problems: list[HealthProblem] = []
    model_loaded: bool
    engine: str
    model: str
    device: str
    available_memory_mb: int
    version: str
    inflight: int
    queued: int
    # The bulk jobs' database, as this instance last found it (each job_poll_s); its own field, never part of
    # `status`: /v1/ocr serves without it, so the load balancers keep the instance. off: no database_url;
    # connecting: not reached yet; unreachable: the last probe failed or timed out (job routes answer 503);
    # schema_behind: `ocr-app db upgrade` not run yet.
    job_store: JobStoreState = "off"


class ErrorDetail(BaseModel):
    code: str
    message: str
    request_id: str
    # OpenAI's error class for the status (ocr_app/http/errors.py: error_type), so that OpenAI clients raise
    # the right exception; and, where one request field is at fault, its name (the chat route's).
    type: str
    param: str | None = Field(None, description="the request field at fault, where one is")


class ErrorBody(BaseModel):
    error: ErrorDetail


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


JobState = Literal["queued", "running", "done", "failed", "cancelled"]


class JobSummary(BaseModel):
    """A job as GET /v1/jobs lists it."""

    job_id: str
    status: JobState
    pages: JobPages
    created_at: str
    started_at: str | None
    finished_at: str | None
    expires_at: str | None = Field(description="when the job and its results are deleted (job_result_ttl_s)")


class JobList(BaseModel):
    jobs: list[JobSummary] = Field(description="newest first")
    next_cursor: str | None = Field(
        description="pass as cursor= for the jobs after these; null when there are no more"
    )


class JobStatus(JobSummary):
    """A job as GET /v1/jobs/{id} shows it: its summary and the pages that could not be read."""

    errors: list[PageError]
