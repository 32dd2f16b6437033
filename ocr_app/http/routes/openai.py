"""OpenAI's chat API, as LightOnOCR's own instructions serve the model (vLLM's OpenAI-compatible server):
`POST /v1/chat/completions` with page images, the page's Markdown back; `GET /v1/models`. Clients written for
that server (the `openai` package, plain HTTP) work unchanged. docs/api.md says what is taken and what not.

Behind what /v1/ocr is behind (the key, admission, the deadline, the limits, the request id, the metrics
and the access log): the body is read and checked first (nothing runs for a request that is refused), each
image is read by the pipeline (ocr_app/ocr/pipeline.py), in the order of the message, within one
request_timeout_s for the whole request, and the answer is the pages' Markdown (ocr_app/ocr/formats/
markdown.py: the reading-order Markdown of the rapidocr engine, the model's own text on vllm).

`stream: true` answers as OpenAI's server-sent events once every page is read: nothing is sent before the
text is final (a degenerate vllm page run again never contradicts what the client already has), so an error
is still a JSON error with its status. Chat requests are not offered to a canary (ocr_app/fleet/shadow.py
replays /v1/ocr's JSON only).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from ...documents.upload import SUPPORTED_TYPES, normalise_media_type, sniff
from ...errors import (
    InvalidRequest,
    NotReady,
    PayloadTooLarge,
    RequestTimeout,
    TooManyPages,
    UnsupportedMediaType,
    UnsupportedOption,
)
from ...jobs import fetch
from ...ocr.formats import markdown
from ...ocr.pipeline import Job, Trace
from ...schemas import OcrResponse, Page, Timings
from ..deps import JSON_TYPE, State, Upload, check_declared_length, require_caller
from ..errors import ERROR_RESPONSES

router = APIRouter(tags=["OpenAI-compatible"])

# The JSON around the images: the messages, their text, the options.
JSON_SLACK = 64 * 1024
# Options of OpenAI's chat API that change what is answered, and that this service does not offer.
UNSUPPORTED = ("tools", "tool_choice", "functions", "function_call", "logprobs", "top_logprobs", "audio")
# Options taken and ignored: they do not change the answer's text (documented in docs/api.md).
SAMPLING_BOUNDS = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0)}
# Where the answer ends: a page cut at max_tokens (the vllm engine's warning, "max_tokens_reached: ...") ends
# it as "length".
LENGTH_WARNING = "max_tokens_reached"


def body_limit(max_upload_bytes: int) -> int:
    """The largest JSON body: the decoded images together at most max_upload_bytes, in base64 (4/3), and the
    rest of the request."""
    return -(-max_upload_bytes * 4 // 3) + JSON_SLACK


@router.get("/v1/models", summary="The model this service serves (OpenAI's list of models)")
async def models(state: State, caller: str = Depends(require_caller)) -> dict[str, Any]:
    return {"object": "list", "data": [_model(state)]}


def _model(state: State) -> dict[str, Any]:
    return {
        "id": state.settings.openai_model_name,
        "object": "model",
        "created": 0,
        "owned_by": f"ocrfleet-{state.engine.name}",
        "engine": state.engine.name,  # rapidocr or vllm
        "engine_model": state.engine.model,  # what reads the pages, as /v1/ocr's `model` says it
    }


# The body, as OpenAPI shows it (the route reads and checks it itself: its errors name the field).
_CONTENT_PART = {
    "type": "object",
    "properties": {
        "type": {"type": "string", "enum": ["text", "image_url"]},
        "text": {"type": "string"},
        "image_url": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]},
    },
    "required": ["type"],
}
CHAT_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            JSON_TYPE: {
                "schema": {
                    "type": "object",
                    "required": ["messages"],
                    "properties": {
                        "model": {"type": "string"},
                        "messages": {
                            "type": "array",
                            "minItems": 1,
                            "items": {
                                "type": "object",
                                "required": ["role"],
                                "properties": {
                                    "role": {"type": "string"},
                                    "content": {
                                        "anyOf": [
                                            {"type": "string"},
                                            {"type": "array", "items": _CONTENT_PART},
                                        ]
                                    },
                                },
                            },
                        },
                        "stream": {"type": "boolean"},
                        "stream_options": {
                            "type": "object",
                            "properties": {"include_usage": {"type": "boolean"}},
                        },
                        "max_tokens": {"type": "integer", "minimum": 1},
                        "max_completion_tokens": {"type": "integer", "minimum": 1},
                        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
                        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
                        "n": {"type": "integer", "enum": [1]},
                    },
                }
            }
        },
    }
}


@router.post(
    "/v1/chat/completions",
    openapi_extra=CHAT_BODY,
    summary="OCR page images sent as OpenAI chat messages; the pages' Markdown back",
    response_model=None,
    responses={
        **ERROR_RESPONSES,
        400: {
            **ERROR_RESPONSES[400],
            "description": "invalid_parameter, "
            "unsupported_option (naming the field in `param`), invalid_image, url_* (an image URL)",
        },
    },
)
async def chat_completions(request: Request, state: State, caller: str = Depends(require_caller)) -> Response:
    s = state.settings
    if state.status != "ready":
        raise NotReady(state.status)
    media_type = normalise_media_type(request.headers.get("content-type"))
    if media_type != JSON_TYPE:
        raise UnsupportedMediaType(f"send the chat request as {JSON_TYPE}, not {media_type or '(none)'}")
    limit = body_limit(s.max_upload_bytes)
    check_declared_length(request, limit)
    rid: str = request.state.request_id
    total = Trace(bytes=0, pages=0)  # the access log's: the images' bytes and pages read, all together
    started = time.monotonic()
    pages: list[Page] = []
    try:
        # The client's leaving stops the work as on /v1/ocr (Upload: from the body's end on).
        async with asyncio.timeout(s.request_timeout_s), Upload(request, limit) as upload:
            body = await upload.read()
            chat = _parse(body, s.vllm_max_tokens_cap, s.max_pages)
            del body
            upload.body = b""  # the images are in `chat` now: the JSON around them is not kept
            for ref in chat.images:
                data, content_type = await _image(ref, state)
                job = Job(content_type, None, False, chat.max_tokens)
                answer = await state.pipeline.run(_const(data), job, rid)
                pages += answer.pages
                total.bytes, total.pages = (total.bytes or 0) + len(data), len(pages)
                if len(pages) > s.max_pages:  # PDFs among the images: max_pages for the request
                    raise TooManyPages(f"the images hold more than {s.max_pages} pages (max_pages)")
    except TimeoutError:
        raise RequestTimeout(s.request_timeout_s) from None
    finally:
        request.state.bytes, request.state.pages = total.bytes, total.pages
    text = markdown.render(
        OcrResponse(
            request_id=rid,
            engine=state.engine.name,
            model=state.engine.model,
            pages=pages,
            timings_ms=Timings(queue=0, preprocess=0, inference=0, total=0),
        )
    )
    finish = "length" if any(w.startswith(LENGTH_WARNING) for p in pages for w in p.warnings) else "stop"
    head = {
        "id": f"chatcmpl-{rid}",
        "created": int(time.time() - (time.monotonic() - started)),
        "model": s.openai_model_name,
    }
    if not chat.stream:
        return JSONResponse(
            {
                **head,
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": None,
                        "finish_reason": finish,
                    }
                ],
                "usage": usage(pages),
            }
        )
    return StreamingResponse(
        _events(head, text, finish, usage(pages) if chat.include_usage else None),
        media_type="text/event-stream",
        # nginx passes each event on as it comes (its proxy_buffering is on for the rest).
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def usage(pages: list[Page]) -> dict[str, int]:
    """OpenAI's usage: the pages' tokens where the engine counts them (vllm: every attempt of every page);
    zeros otherwise (rapidocr counts none), which OpenAI's clients read as usage all the same."""
    counted = [p.usage for p in pages if p.usage is not None]
    if not pages or len(counted) != len(pages):
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    prompt = sum(u.prompt_tokens for u in counted)
    completion = sum(u.completion_tokens for u in counted)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _events(
    head: dict[str, Any], text: str, finish: str, usage: dict[str, int] | None
) -> AsyncIterator[str]:
    """OpenAI's chunks: the role first, then the text a line at a time, the finish reason in the last chunk
    (with an empty delta), the usage chunk if asked for (stream_options.include_usage), then [DONE]."""

    def chunk(delta: dict[str, str], finish_reason: str | None = None, **extra: Any) -> str:
        choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
        return (
            "data: "
            + json.dumps({**head, "object": "chat.completion.chunk", "choices": choices, **extra})
            + "\n\n"
        )

    yield chunk({"role": "assistant", "content": ""})
    for line in text.splitlines(keepends=True):
        yield chunk({"content": line})
    yield chunk({}, finish)
    if usage is not None:
        yield (
            "data: "
            + json.dumps({**head, "object": "chat.completion.chunk", "choices": [], "usage": usage})
            + "\n\n"
        )
    yield "data: [DONE]\n\n"


def _const(data: bytes) -> Any:
    async def read() -> bytes:
        return data

    return read


# --- the request ------------------------------------------------------------------------------------------


class Chat:
    def __init__(self) -> None:
        self.images: list[str] = []  # data: or http(s) URLs, in the order of the messages
        self.max_tokens: int | None = None
        self.stream = False
        self.include_usage = False


def _parse(body: bytes, max_tokens_cap: int, max_images: int) -> Chat:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # nested deeper than the parser goes: not a request either
        raise InvalidRequest("body", "the body is not JSON") from None
    if not isinstance(data, dict):
        raise InvalidRequest("body", "the body must be a JSON object")
    chat = Chat()
    for name in UNSUPPORTED:
        if data.get(name) not in (None, False, [], {}):
            raise UnsupportedOption(
                name, f"{name} is not supported: this service answers with the pages' text"
            )
    n = data.get("n")
    if n is not None and n != 1:
        raise UnsupportedOption("n", "n must be 1: one answer per request")
    fmt = data.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise UnsupportedOption("response_format", 'response_format must be {"type": "text"}')
    for name, (low, high) in SAMPLING_BOUNDS.items():
        value = data.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high
        ):
            raise InvalidRequest(name, f"{name} must be a number from {low:g} to {high:g}")
    for name in ("max_tokens", "max_completion_tokens"):
        value = data.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= max_tokens_cap:
            raise InvalidRequest(
                name, f"{name} must be an integer from 1 to {max_tokens_cap} (vllm_max_tokens_cap)"
            )
        chat.max_tokens = value
    stream = data.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise InvalidRequest("stream", "stream must be true or false")
    chat.stream = bool(stream)
    options = data.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise InvalidRequest("stream_options", "stream_options must be an object")
        chat.include_usage = options.get("include_usage") is True
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages", "messages must be a non-empty list of messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidRequest(f"messages[{i}]", "each message must be an object with a role")
        content = message.get("content")
        if isinstance(content, str) or content is None or message["role"] != "user":
            continue  # text alone (a prompt, a system message): not what is read
        if not isinstance(content, list):
            raise InvalidRequest(f"messages[{i}].content", "content must be a string or a list of parts")
        for j, part in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise InvalidRequest(where, "each part must be an object with a type")
            if part["type"] == "text":
                continue  # the prompt: the engines read the page as the model card says (docs/api.md)
            if part["type"] != "image_url":
                raise UnsupportedOption(f"{where}.type", f"a part of type {part['type']!r} is not supported")
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if not isinstance(url, str) or not url:
                raise InvalidRequest(
                    f"{where}.image_url", 'image_url must be {"url": "data:..." or "https://..."}'
                )
            chat.images.append(url)
    if not chat.images:
        raise InvalidRequest("messages", "no image in the messages: send the page as an image_url part")
    if len(chat.images) > max_images:
        raise InvalidRequest("messages", f"at most {max_images} images per request (max_pages)")
    return chat


async def _image(url: str, state: State) -> tuple[bytes, str]:
    """An image's bytes and media type: a data: URL decoded, an http(s) URL fetched through the
    request-forgery guard as a job's document by URL is (ocr_app/jobs/fetch.py, ocr_app/egress.py)."""
    s = state.settings
    if url[:5].lower() == "data:":
        header, sep, payload = url[5:].partition(",")
        if not sep or not header.lower().endswith(";base64"):
            raise InvalidRequest("image_url", "a data: URL must be data:<type>;base64,<data>")
        if len(payload) > -(-s.max_upload_bytes * 4 // 3) + 4:
            raise PayloadTooLarge(f"the image exceeds {s.max_upload_bytes} bytes (max_upload_bytes)")
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest("image_url", "the data: URL's data is not base64") from None
        if len(data) > s.max_upload_bytes:
            raise PayloadTooLarge(f"the image of {len(data)} bytes exceeds {s.max_upload_bytes} bytes")
        declared = normalise_media_type(header[: -len(";base64")])
    else:
        data, declared = await fetch.fetch(
            url, s.max_upload_bytes, s.job_url_timeout_s, s.job_url_max_redirects, state.egress
        )
    found = sniff(data) or declared
    if found not in SUPPORTED_TYPES:
        raise UnsupportedMediaType(
            f"the image is {found or 'of no known type'}, not one of {', '.join(SUPPORTED_TYPES)}"
        )
    return data, found
