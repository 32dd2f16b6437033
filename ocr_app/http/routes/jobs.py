"""POST /v1/jobs and /v1/jobs/{id}[/events|/result]: thin; the work is ocr_app/jobs/service.py's."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from ...documents.upload import normalise_media_type, parse_page_selection
from ...jobs.service import FAILED_PAGES_HEADER, check_webhook_url
from ...ocr import formats
from ...ocr.formats.negotiate import OFFERS, choose
from ...schemas import ErrorBody, JobCreated, JobList, JobState, JobStatus, job_urls
from ..deps import (
    JOB_DOCUMENT_BODY,
    JSON_TYPE,
    State,
    check_declared_length,
    check_max_tokens,
    check_media_type,
    read_body,
    read_document_url,
    require_caller,
)
from ..errors import ERROR_RESPONSES

router = APIRouter()

_JOB_ERRORS: dict[int | str, dict[str, Any]] = {
    **{k: v for k, v in ERROR_RESPONSES.items() if k in (401, 422)},
    404: {"model": ErrorBody, "description": "not_found: no such job for this API key"},
    503: {
        "model": ErrorBody,
        "description": "jobs_unavailable: no database configured, or its schema is behind",
    },
}
_SUBMIT_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    400: {
        "model": ErrorBody,
        "description": "invalid_image: undecodable or truncated document; "
        "invalid_webhook: webhook_url not under job_webhook_allowed_urls; a document by URL refused or "
        "not fetched: url_unsupported_scheme, url_invalid, url_unresolvable, url_loopback, url_private, "
        "url_link_local, url_unique_local, url_multicast, url_metadata, url_reserved, "
        "url_too_many_redirects, url_fetch_failed",
    },
    409: {"model": ErrorBody, "description": "idempotency_conflict: the key was used for another document"},
    429: {
        "model": ErrorBody,
        "description": "too_many_jobs: max_jobs_in_flight queued or running for this key",
    },
    503: _JOB_ERRORS[503],
}


@router.post(
    "/v1/jobs",
    status_code=202,
    response_model=JobCreated,
    responses=_SUBMIT_ERRORS,
    openapi_extra=JOB_DOCUMENT_BODY,
    summary="Submit a document as a bulk job (read page by page by the whole fleet)",
    description="The body is the document (raw, or multipart with a 'file' field), or JSON "
    '`{"url": "https://..."}`: the document is then fetched during this request (max_job_bytes, '
    "job_url_timeout_s, job_url_max_redirects; public addresses only, unless job_url_allowed_hosts opens "
    "a host; the Idempotency-Key covers the URL). The job is read by every instance; follow it at "
    "status_url or events_url, fetch its pages at result_url. With webhook_url (see the parameter: what "
    "is sent, how it is signed), "
    "`ocr_app.jobs.webhooks.verify` checks a delivery's signature. Unsigned when the server runs without "
    "API keys and job_webhook_secret is unset.",
)
async def submit_job(
    request: Request,
    state: State,
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
    by_url = normalise_media_type(content_type) == JSON_TYPE
    if not by_url:
        check_media_type(content_type)
    check_webhook_url(webhook_url, s.job_webhook_allowed_urls)
    selection = parse_page_selection(pages, s.max_job_pages)
    check_max_tokens(max_tokens, s.vllm_max_tokens_cap)
    if by_url:
        url = await read_document_url(request)
        job_id, created = await jobs.submit_url(
            caller, idempotency_key, url, selection, preview, max_tokens, webhook_url
        )
    else:
        check_declared_length(request, s.max_job_bytes)
        body = await read_body(request, s.max_job_bytes)
        request.state.bytes = len(body)
        job_id, created = await jobs.submit(
            caller, idempotency_key, body, content_type, selection, preview, max_tokens, webhook_url
        )
    headers = {"Location": f"/v1/jobs/{job_id}"} | ({} if created else {"Idempotent-Replayed": "true"})
    return JSONResponse(job_urls(str(job_id)).model_dump(), status_code=202, headers=headers)


# At most this many jobs per page of GET /v1/jobs.
MAX_LIST_LIMIT = 100


@router.get(
    "/v1/jobs",
    response_model=JobList,
    responses={k: v for k, v in _JOB_ERRORS.items() if k != 404},
    summary="This key's jobs, newest first, a page at a time",
    description="Jobs of the calling API key only (another key's are never listed), until they expire "
    "(job_result_ttl_s after they finished) or are purged. Follow next_cursor for older ones.",
)
async def list_jobs(
    state: State,
    caller: str = Depends(require_caller),
    status: Annotated[
        list[JobState] | None, Query(description="only jobs in these states (repeat: any of them)")
    ] = None,
    limit: int = Query(20, ge=1, le=MAX_LIST_LIMIT, description="jobs per page"),
    cursor: str | None = Query(
        None, max_length=200, description="next_cursor of the previous page: the jobs after it"
    ),
) -> JobList:
    return JobList(**await state.require_jobs().list_jobs(caller, status, limit, cursor))


@router.get("/v1/jobs/{job_id}", response_model=JobStatus, responses=_JOB_ERRORS, summary="A job's status")
async def job_status(job_id: str, state: State, caller: str = Depends(require_caller)) -> JobStatus:
    return JobStatus(**await state.require_jobs().status(caller, job_id))


@router.delete(
    "/v1/jobs/{job_id}",
    response_model=JobStatus,
    responses={**_JOB_ERRORS, 204: {"description": "purged (purge=true): the job is gone"}},
    summary="Cancel a job (its pages not yet started never run); with purge=true, delete it now",
    description="Cancel: no page of the job starts after this returns; a page being read at that moment is "
    "dropped (not written, not counted, not sent); the pages already read stay readable until the job "
    "expires; the webhook, if any, is sent once (status cancelled). Cancelling a finished job changes "
    "nothing. Returns the job's status. With purge=true: cancelled as above, then the job, its document, "
    "its pages and its webhook delivery are deleted at once (204); the job is then 404, as an expired one.",
)
async def cancel_job(
    job_id: str,
    state: State,
    caller: str = Depends(require_caller),
    purge: bool = Query(False, description="delete the job and its results now (204) instead of at expiry"),
) -> Response:
    jobs = state.require_jobs()
    if purge:
        await jobs.purge(caller, job_id)
        return Response(status_code=204)
    status = JobStatus(**await jobs.cancel(caller, job_id))
    return JSONResponse(status.model_dump())


@router.get(
    "/v1/jobs/{job_id}/events",
    responses={**_JOB_ERRORS, 200: {"content": {"text/event-stream": {}}, "description": "the events"}},
    response_class=StreamingResponse,
    summary="Server-Sent Events: progress, then a page event per page in order (id: the page), then done",
)
async def job_events(
    job_id: str,
    state: State,
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


_RESULT_TYPES = ("application/json", "application/x-ndjson", *(t for t, _ in OFFERS[1:]))


@router.get(
    "/v1/jobs/{job_id}/result",
    responses={
        **_JOB_ERRORS,
        400: {
            "model": ErrorBody,
            "description": "invalid_image: format=pdf of a document the PDF tools cannot rebuild",
        },
        406: {**ERROR_RESPONSES[422], "description": "not_acceptable: Accept allows none of the formats"},
        409: {"model": ErrorBody, "description": "job_not_finished"},
        410: {
            "model": ErrorBody,
            "description": "document_gone: format=pdf of a cancelled job (its document is not kept)",
        },
        200: {
            "content": {
                t: ({"schema": {"type": "string", "format": "binary"}} if t == "application/pdf" else {})
                for t in dict.fromkeys(_RESULT_TYPES)
            },
            "description": "the pages: JSON unless format= or Accept asks for another format; header "
            f"{FAILED_PAGES_HEADER}: the pages that could not be read (e.g. 3,7), absent when none",
        },
    },
    response_class=StreamingResponse,
    summary="A finished job's pages in order: JSON, JSON Lines (Accept: application/x-ndjson), or "
    "format= text, markdown, hocr, alto, pdf",
    description="Every format is streamed as the pages are read from the job database, a batch at a time. "
    "format=pdf is the job's document (kept until the job expires) with each read page's text layer, as "
    "POST /v1/ocr's format=pdf; it is built in a temporary file first, then sent. A page that could not "
    "be read has no part in the text formats and stays in the PDF without text; the "
    f"{FAILED_PAGES_HEADER} header lists them.",
)
async def job_result(
    job_id: str,
    request: Request,
    state: State,
    caller: str = Depends(require_caller),
    format_name: str | None = Query(
        None,
        alias="format",
        description="json (the default), text, markdown, hocr, alto or pdf; without it, Accept chooses "
        "(application/x-ndjson: JSON Lines, a page a line)",
        json_schema_extra={"enum": [*formats.FORMATS, *formats.UNAVAILABLE]},
    ),
) -> StreamingResponse:
    accept = request.headers.get("accept", "")
    # JSON Lines by Accept, as before formats; format= wins over it as over any Accept.
    ndjson = format_name is None and "application/x-ndjson" in accept
    fmt, media_type = (formats.JSON, "application/json") if ndjson else choose(format_name, accept)
    stream, headers = await state.require_jobs().result(caller, job_id, ndjson, fmt)
    content_type = "application/x-ndjson" if ndjson else fmt.content_type(media_type)
    if fmt.name == "json" and not ndjson:
        content_type = "application/json"  # as it always was
    return StreamingResponse(stream, media_type=content_type, headers={**headers, "Vary": "Accept"})
