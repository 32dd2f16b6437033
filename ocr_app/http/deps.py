"""What the routes depend on, in one place: the app's state, the caller (its API key), and the request's
body (its media type, its declared and actual length, and the client's leaving while its work runs)."""

from __future__ import annotations

import asyncio
import json
from types import TracebackType
from typing import Annotated, Any

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.requests import ClientDisconnect

from ..documents.upload import MULTIPART_TYPE, SUPPORTED_TYPES, normalise_media_type
from ..errors import ClientGone, InvalidParameter, PayloadTooLarge, Unauthorized, UnsupportedMediaType
from ..ocr.pipeline import CLIENT_GONE
from ..urls import MAX_URL_LENGTH
from .state import AppState


def app_state(request: Request) -> AppState:
    """FastAPI dependency: everything a request needs (built once by create_app)."""
    state: AppState = request.app.state.ocr
    return state


# A route's parameter `state: State` is the app's AppState.
State = Annotated[AppState, Depends(app_state)]


# --- the caller -----------------------------------------------------------------------------------------

# The headers a key may come in (require_caller reads both): what a request replayed on the caller's behalf
# carries over (ocr_app/fleet/shadow.py).
KEY_HEADERS = ("Authorization", "X-API-Key")
_bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <key>")
_api_key = APIKeyHeader(name=KEY_HEADERS[1], auto_error=False, description="the same key, as X-API-Key")


async def require_caller(
    request: Request,
    bearer: HTTPAuthorizationCredentials | None = Security(_bearer),  # noqa: B008 - FastAPI's idiom
    api_key: str | None = Security(_api_key),
) -> str:
    """FastAPI dependency: the caller's name, or Unauthorized. Runs before any of the body is read."""
    keys = app_state(request).keys
    if keys is None:  # auth_disabled: true, logged loudly at start
        caller = "anonymous"
    else:
        key = bearer.credentials if bearer is not None else api_key
        if not key:
            raise Unauthorized("missing API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'")
        found = keys.authenticate(key)
        if found is None:
            raise Unauthorized("invalid API key")
        caller = found
    request.state.caller = caller
    return caller


# --- the document in the body ---------------------------------------------------------------------------

# The body of POST /v1/ocr and /v1/jobs, as OpenAPI shows it (the routes read the body themselves).
DOCUMENT_BODY: dict[str, Any] = {
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


JSON_TYPE = "application/json"
# The largest JSON body of POST /v1/jobs: {"url": ...} and nothing else.
MAX_URL_BODY = 16 * 1024

# POST /v1/jobs takes the same, or a document by URL.
JOB_DOCUMENT_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            **DOCUMENT_BODY["requestBody"]["content"],
            JSON_TYPE: {
                "schema": {
                    "type": "object",
                    "properties": {"url": {"type": "string", "format": "uri", "maxLength": MAX_URL_LENGTH}},
                    "required": ["url"],
                    "additionalProperties": False,
                }
            },
        },
    }
}


async def read_document_url(request: Request) -> str:
    """The `url` of a JSON body `{"url": ...}`: that and nothing else (not a document beside it)."""
    body = await read_body(request, MAX_URL_BODY)
    try:
        data = json.loads(body)
    except ValueError:
        raise InvalidParameter('a JSON body must be {"url": "https://..."}: it is not JSON') from None
    if not isinstance(data, dict) or not isinstance(data.get("url"), str):
        raise InvalidParameter('a JSON body must be {"url": "https://..."} with the document\'s URL')
    if set(data) != {"url"}:
        extra = ", ".join(sorted(k for k in data if k != "url"))
        raise InvalidParameter(
            f"a JSON body holds the document's url and nothing else (not {extra}): send the document "
            "as the body, or its url, not both; options are query parameters"
        )
    url: str = data["url"]
    return url


def check_media_type(content_type: str) -> None:
    media_type = normalise_media_type(content_type)
    if media_type != MULTIPART_TYPE and media_type not in SUPPORTED_TYPES:
        raise UnsupportedMediaType(
            f"unsupported Content-Type {media_type or '(none)'!r}: send multipart/form-data "
            f"with a 'file' field, or one of {', '.join(SUPPORTED_TYPES)}"
        )


def check_max_tokens(max_tokens: int | None, cap: int) -> None:
    if max_tokens is not None and max_tokens > cap:
        raise InvalidParameter(f"max_tokens must be at most {cap} (vllm_max_tokens_cap)")


def check_declared_length(request: Request, limit: int) -> None:
    """A Content-Length over the limit is refused before a byte of the body is read."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"body of {declared} bytes exceeds {limit} bytes")


async def read_body(request: Request, limit: int) -> bytes:
    buf = bytearray()
    try:
        async for chunk in request.stream():
            buf += chunk
            if len(buf) > limit:  # chunked uploads: stop reading at the limit
                raise PayloadTooLarge(f"body exceeds {limit} bytes")
    except ClientDisconnect:  # an upload abandoned half way is the client's doing, not a 500
        raise ClientGone() from None
    return bytes(buf)


class Upload:
    """`async with Upload(request, limit) as upload:` around the work that calls `upload.read()`.

    The body is read when the work asks for it (the pipeline does once the request holds a slot: a queued
    client's upload waits in its socket). From then on a client that leaves cancels the work (its decode
    worker is killed, the engine's pages dropped), and the request ends as ClientGone."""

    def __init__(self, request: Request, limit: int) -> None:
        self.request = request
        self.limit = limit
        self.body = b""
        self._work: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Upload:
        self._work = asyncio.current_task()
        return self

    async def read(self) -> bytes:
        self.body = await read_body(self.request, self.limit)
        assert self._work is not None
        self._watcher = asyncio.create_task(_cancel_when_client_leaves(self.request, self._work))
        return self.body

    async def __aexit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        watcher = self._watcher
        # The work was cancelled by the watcher (its client left), not by the server stopping.
        left = (
            isinstance(err, asyncio.CancelledError)
            and watcher is not None
            and watcher.done()
            and not watcher.cancelled()
        )
        if watcher is not None:
            watcher.cancel()
        if left:
            assert self._work is not None
            self._work.uncancel()
            raise ClientGone() from None


async def _cancel_when_client_leaves(request: Request, work: asyncio.Task[Any]) -> None:
    """Once the body is read, the server's next ASGI message is http.disconnect, sent when the client closes
    the connection (or when the response is complete: this watcher is stopped before that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    work.cancel(CLIENT_GONE)
