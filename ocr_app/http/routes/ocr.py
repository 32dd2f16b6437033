"""POST /v1/ocr: the request checked (engine ready, media type, pages, max_tokens, declared length), then one
call into the pipeline (ocr_app/ocr/pipeline.py: admission, decode, engine), which reads the body once the
request holds a slot. The answer leaves in the format asked for (`format=` or `Accept`: ocr_app/ocr/formats/),
chosen before any work is done."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Response

from ...documents.upload import parse_page_selection
from ...errors import NotReady
from ...fleet.shadow import SHADOW_HEADER, Offer
from ...ocr import formats
from ...ocr.formats.negotiate import choose
from ...ocr.pipeline import Job, Trace
from ...schemas import OcrResponse
from ..deps import (
    DOCUMENT_BODY,
    KEY_HEADERS,
    State,
    Upload,
    check_declared_length,
    check_max_tokens,
    check_media_type,
    require_caller,
)
from ..errors import ERROR_RESPONSES

router = APIRouter()


# OpenAPI: the other formats' media types beside JSON, and the errors of format= and Accept.
FORMAT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the result: JSON (OcrResponse) unless format= or Accept asks for another format",
        "content": {
            t: {"schema": {"type": "string"}}
            for t in ("text/plain", "text/markdown", "application/xhtml+xml", "application/alto+xml")
        }
        | {"application/pdf": {"schema": {"type": "string", "format": "binary"}}},
    },
    **ERROR_RESPONSES,
    406: {**ERROR_RESPONSES[422], "description": "not_acceptable: Accept allows none of the formats"},
    422: {
        **ERROR_RESPONSES[422],
        "description": "invalid_parameter (an unknown format= among them)",
    },
}


@router.post(
    "/v1/ocr",
    response_model=OcrResponse,
    responses=FORMAT_RESPONSES,
    openapi_extra=DOCUMENT_BODY,
    summary="OCR an image or a PDF",
)
async def ocr(
    request: Request,
    response: Response,
    state: State,
    caller: str = Depends(require_caller),
    pages: str | None = Query(None, description="PDF/TIFF pages, e.g. 1-3,5", max_length=200),
    preview: bool = Query(False, description="each page's image as the engine saw it, as a data URL"),
    max_tokens: int | None = Query(
        None, ge=1, description="vllm engine: the most tokens the model may write per page"
    ),
    format_name: str | None = Query(
        None,
        alias="format",
        description="the result's format: json (the default), text, markdown, hocr, alto or pdf (the "
        "document's pages with an invisible text layer: a searchable PDF); without it, Accept chooses",
        # The names in OpenAPI; the route checks them itself (ocr_app/ocr/formats/negotiate.py), so that an
        # unknown one is answered with the list.
        json_schema_extra={"enum": [*formats.FORMATS, *formats.UNAVAILABLE]},
    ),
) -> OcrResponse | Response:
    s = state.settings
    if state.status != "ready":
        raise NotReady(state.status)
    content_type = request.headers.get("content-type", "")
    check_media_type(content_type)
    fmt, media_type = choose(format_name, request.headers.get("accept"))
    job = Job(content_type, parse_page_selection(pages, s.max_pages), preview, max_tokens)
    check_max_tokens(max_tokens, s.vllm_max_tokens_cap)
    check_declared_length(request, s.max_upload_bytes)

    trace = Trace()
    try:
        async with Upload(request, s.max_upload_bytes) as upload:
            answer = await state.pipeline.run(upload.read, job, request.state.request_id, trace)
    finally:
        request.state.bytes, request.state.pages = trace.bytes, trace.pages
    # A replay is not replayed; nor is an answer in another format than JSON: the canary's comparison reads
    # JSON, and a request for hOCR is not turned into one for JSON.
    if s.shadow_file is not None and SHADOW_HEADER not in request.headers and fmt.render is None:
        request.state.shadow = _shadow_offer(request, upload.body, content_type, answer)
    response.headers["Vary"] = "Accept"
    if fmt.render is None:
        return answer  # JSON, serialised by FastAPI as it always was
    # Off the event loop, render_workers at once: pdf's work is seconds of CPU (the upload limit bounds the
    # document it copies).
    source = formats.Source(upload.body, content_type)
    body = await state.pipeline.renders.run(fmt.name, formats.render, fmt, answer, source)
    return Response(body, media_type=fmt.content_type(media_type), headers={"Vary": "Accept"})


def _shadow_offer(request: Request, body: bytes, content_type: str, answer: OcrResponse) -> Offer:
    """The request as it can be replayed to a canary (ocr_app/fleet/shadow.py), offered by RequestContext once
    the client has its answer."""
    return Offer(
        body=body,
        content_type=content_type,
        query=tuple((k, v) for k, v in request.query_params.multi_items() if k != "preview"),
        auth={h: request.headers[h] for h in KEY_HEADERS if h in request.headers},
        request_id=request.state.request_id,
        answer=answer,
    )
