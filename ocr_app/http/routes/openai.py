"""OpenAI's chat API, as LightOnOCR's own instructions serve the model (vLLM's OpenAI-compatible server):
`POST /v1/chat/completions` with page images, the page's Markdown back; `GET /v1/models`. Clients written for
that server (the `openai` package, plain HTTP) work unchanged. docs/api.md says what is taken and what not.

Behind what /v1/ocr is behind (the key, admission, the deadline, the limits, the request id, the metrics
and the access log): the body is read and checked first (nothing runs for a request that is refused), each
image is read by the pipeline (ocr_app/ocr/pipeline.py), in the order of the message, within one
request_timeout_s for the whole request, and the answer is the pages' Markdown (ocr_app/ocr/formats/
markdown.py: the reading-order Markdown of the rapidocr engine, the model's own text on vllm).

`stream: true` answers as OpenAI's server-sent events, the text as it comes (docs/api.md, Streaming): on
vllm each page's first attempt as the model writes it (Engine.recognize's `stream`; LiveText holds back a
repetition loop's copies), pages in order; on rapidocr a line at a time once the page is read. Text sent is
never taken back: a page the repetition guard ran again gets the rest of its final text if that continues
what was sent, else nothing more, and the last chunk names it (`ocr_pages_not_as_streamed`). The status goes
with the first piece of text, so an error before it is a JSON error with its status; one after it is the
stream's last event (`data: {"error": ...}`). Chat requests are not offered to a canary
(ocr_app/fleet/shadow.py replays /v1/ocr's JSON only).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from ...documents.upload import SUPPORTED_TYPES, normalise_media_type, sniff
from ...errors import (
    InvalidRequest,
    NotReady,
    OcrError,
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
from ..errors import ERROR_RESPONSES, error_body, http_status

log = logging.getLogger("ocr_app.http.openai")
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
    deadline = asyncio.get_running_loop().time() + s.request_timeout_s  # the whole request's, streamed too
    head = {"id": f"chatcmpl-{rid}", "created": int(time.time()), "model": s.openai_model_name}
    pages: list[Page] = []
    try:
        # The client's leaving stops the work as on /v1/ocr (Upload: from the body's end on).
        async with asyncio.timeout_at(deadline), Upload(request, limit) as upload:
            body = await upload.read()
            chat = _parse(body, s.vllm_max_tokens_cap, s.max_pages)
            del body
            upload.body = b""  # the images are in `chat` now: the JSON around them is not kept
            if chat.stream:
                return await _stream(request, state, chat, head, deadline, total)
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
    return JSONResponse(
        {
            **head,
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": _finish(pages),
                }
            ],
            "usage": usage(pages),
        }
    )


def _finish(pages: list[Page]) -> str:
    return "length" if any(w.startswith(LENGTH_WARNING) for p in pages for w in p.warnings) else "stop"


def usage(pages: list[Page]) -> dict[str, int]:
    """OpenAI's usage: the pages' tokens where the engine counts them (vllm: every attempt of every page);
    zeros otherwise (rapidocr counts none), which OpenAI's clients read as usage all the same."""
    counted = [p.usage for p in pages if p.usage is not None]
    if not pages or len(counted) != len(pages):
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    prompt = sum(u.prompt_tokens for u in counted)
    completion = sum(u.completion_tokens for u in counted)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


# --- stream: true ---------------------------------------------------------------------------------------

# What the work hands the answer: ("text", piece), ("end", (finish_reason, usage, pages not as streamed)),
# ("error", OcrError).
Event = tuple[str, Any]


async def _stream(
    request: Request, state: State, chat: Chat, head: dict[str, Any], deadline: float, total: Trace
) -> Response:
    """The answer as OpenAI's server-sent events, its text as the engine writes it. The status is sent
    with the first piece of text: until then an error is a JSON error with its status, as without
    `stream`; after it, the stream's last event is `data: {"error": {...}}` (which OpenAI's clients raise)."""
    events: asyncio.Queue[Event] = asyncio.Queue()
    work = asyncio.create_task(_produce(request, state, chat, deadline, total, events.put_nowait))
    try:
        first = await events.get()
    except BaseException:  # the deadline, the client gone: the work goes with the request
        work.cancel()
        raise
    if first[0] == "error":
        raise first[1]
    return StreamingResponse(
        _events(request, head, first, events, work, chat.include_usage),
        media_type="text/event-stream",
        # nginx passes each event on as it comes (its proxy_buffering is on for the rest).
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _produce(
    request: Request, state: State, chat: Chat, deadline: float, total: Trace, put: Callable[[Event], None]
) -> None:
    """The images read in order; each page's text put as it comes: the page's first attempt as the vllm
    engine writes it (Engine.recognize's `stream`), then what the finished page adds to what was sent, a line
    a piece (the whole page so on the rapidocr engine). A page whose final text does not continue what was
    sent of it (the repetition guard ran it again and the new answer reads otherwise) gets nothing more and
    is named in the end event."""
    s = state.settings
    rid: str = request.state.request_id
    writer = markdown.Writer(state.engine.name, state.engine.model, 0)
    pages: list[Page] = []
    diverged: list[int] = []
    try:
        async with asyncio.timeout_at(deadline):
            images = [await _image(ref, state) for ref in chat.images]  # a refused URL before any text
            for data, content_type in images:
                sent = ""  # of this image's first page, the one page that streams live (pages in order)

                def live(i: int, piece: str) -> None:
                    nonlocal sent
                    if i == 0:
                        piece = (writer.separator.decode() if pages and not sent else "") + piece
                        sent += piece
                        put(("text", piece))

                job = Job(content_type, None, False, chat.max_tokens)
                answer = await state.pipeline.run(_const(data), job, rid, stream=live)
                total.bytes, total.pages = (total.bytes or 0) + len(data), len(pages) + len(answer.pages)
                request.state.bytes, request.state.pages = total.bytes, total.pages
                if len(pages) + len(answer.pages) > s.max_pages:
                    raise TooManyPages(f"the images hold more than {s.max_pages} pages (max_pages)")
                for j, page in enumerate(answer.pages):
                    text = writer.page(page).decode("utf-8")
                    already = sent if j == 0 else ""
                    if text.startswith(already):
                        for line in text[len(already) :].splitlines(keepends=True):
                            put(("text", line))
                    else:
                        diverged.append(len(pages) + 1)
                    pages.append(page)
    except TimeoutError:
        put(("error", RequestTimeout(s.request_timeout_s)))
    except OcrError as err:
        put(("error", err))
    except Exception:
        log.exception("chat completion failed while streaming", extra={"request_id": rid})
        put(("error", OcrError("the answer failed; see the server's log")))
    else:
        put(("end", (_finish(pages), usage(pages), diverged)))


async def _events(
    request: Request,
    head: dict[str, Any],
    first: Event,
    events: asyncio.Queue[Event],
    work: asyncio.Task[None],
    include_usage: bool,
) -> AsyncIterator[str]:
    """OpenAI's chunks: the role first, then the text as it comes, the finish reason in the last chunk (with
    an empty delta, and `ocr_pages_not_as_streamed` where a page's streamed text is not its final text), the
    usage chunk if asked for (stream_options.include_usage), then [DONE]. The client's leaving cancels it,
    and the work with it."""

    def data(body: dict[str, Any]) -> str:
        return "data: " + json.dumps(body) + "\n\n"

    def chunk(delta: dict[str, str], finish_reason: str | None = None, **extra: Any) -> str:
        choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
        return data({**head, "object": "chat.completion.chunk", "choices": choices, **extra})

    try:
        yield chunk({"role": "assistant", "content": ""})
        event = first
        while event[0] == "text":
            yield chunk({"content": event[1]})
            event = await events.get()
        if event[0] == "error":
            err: OcrError = event[1]
            request.state.error = err.code
            yield data(
                error_body(http_status(err), err.code, err.message, request.state.request_id, err.param)
            )
            return
        finish, counted, diverged = event[1]
        yield chunk({}, finish, **({"ocr_pages_not_as_streamed": diverged} if diverged else {}))
        if include_usage:
            yield data({**head, "object": "chat.completion.chunk", "choices": [], "usage": counted})
        yield "data: [DONE]\n\n"
    finally:
        work.cancel()


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
