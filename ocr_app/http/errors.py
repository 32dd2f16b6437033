"""The one place where an error becomes HTTP: each kind of error's status (STATUS), and the API's JSON error
body `{"error": {"code", "message", "request_id", "type", "param"?}}` for our errors (ocr_app/errors.py),
FastAPI's validation errors and Starlette's own 404/405. `type` is OpenAI's error class for the status (what
OpenAI's clients and /v1/chat/completions' users read; `code` stays ours), `param` the field at fault where
the error names one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import (
    ClientGone,
    DocumentGone,
    DocumentUrlError,
    IdempotencyConflict,
    InvalidDocument,
    InvalidParameter,
    InvalidRequest,
    InvalidWebhook,
    JobNotFinished,
    JobNotFound,
    NotAcceptable,
    OcrError,
    Timeout,
    TooLarge,
    TooManyJobs,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
)
from ..metrics import Metrics
from ..schemas import ErrorBody, ErrorDetail

# Each kind of error's status: an error takes the status of the nearest of its classes in this table.
STATUS: dict[type[OcrError], int] = {
    OcrError: 500,
    InvalidDocument: 400,
    InvalidWebhook: 400,
    DocumentUrlError: 400,
    Unauthorized: 401,
    JobNotFound: 404,
    NotAcceptable: 406,
    IdempotencyConflict: 409,
    JobNotFinished: 409,
    DocumentGone: 410,
    TooLarge: 413,
    UnsupportedMediaType: 415,
    InvalidParameter: 422,
    InvalidRequest: 400,  # the chat route's fields: OpenAI's API answers them with 400
    TooManyJobs: 429,
    # nginx's code for it: nobody reads this answer; the access log and ocr_requests_total do.
    ClientGone: 499,
    Unavailable: 503,
    Timeout: 504,
}


def http_status(err: OcrError) -> int:
    return next(STATUS[cls] for cls in type(err).__mro__ if cls in STATUS)


def http_headers(err: OcrError) -> dict[str, str]:
    headers = {}
    if isinstance(err, Unauthorized):
        headers["WWW-Authenticate"] = 'Bearer realm="ocr"'
    if err.retry_after_s is not None:
        headers["Retry-After"] = str(err.retry_after_s)
    return headers


# OpenAI's error `type` by status; any other 4xx is invalid_request_error, any 5xx server_error.
ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(
    status: int, code: str, message: str, request_id: str, param: str | None = None
) -> dict[str, Any]:
    """The API's error body, as JSON's dict (a streamed chat answer sends it as its last event)."""
    detail = ErrorDetail(
        code=code, message=message, request_id=request_id, type=error_type(status), param=param
    )
    return ErrorBody(error=detail).model_dump(exclude_none=True)


def error_response(
    status: int,
    code: str,
    message: str,
    request_id: str,
    headers: Mapping[str, str] | None = None,
    param: str | None = None,
) -> JSONResponse:
    body = error_body(status, code, message, request_id, param)
    return JSONResponse(body, status_code=status, headers=headers)


def add_error_handlers(app: FastAPI, metrics: Metrics) -> None:
    """Our errors (counted in ocr_rejected_total by code), FastAPI's validation errors (as invalid_parameter)
    and Starlette's HTTP errors (404, 405), each as the API's error body."""

    async def ocr_error(request: Request, err: OcrError) -> JSONResponse:
        request.state.error = err.code
        metrics.rejected.labels(err.code).inc()
        return error_response(
            http_status(err), err.code, err.message, request.state.request_id, http_headers(err), err.param
        )

    async def validation_error(request: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0] if err.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return await ocr_error(request, InvalidParameter(f"{where}: {first.get('msg', 'invalid')}"))

    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code, "http_error")
        return error_response(
            err.status_code, code, str(err.detail), request.state.request_id, getattr(err, "headers", None)
        )

    app.add_exception_handler(OcrError, ocr_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]


# Documented in OpenAPI for /v1/ocr.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
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
