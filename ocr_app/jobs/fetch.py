"""A job's document by URL (`POST /v1/jobs` with `{"url": ...}`), fetched during the request: bounded in
bytes (max_job_bytes: the same 413 as an upload), in time (job_url_timeout_s, the whole fetch, redirects
included) and in redirects (job_url_max_redirects), every connection through the request-forgery guard
(ocr_app/egress.py). What comes back is a document as an upload is: its type from its own bytes.
"""

from __future__ import annotations

import asyncio

import httpx

from .. import urls
from ..documents.upload import PDF_TYPE, SUPPORTED_TYPES, normalise_media_type, sniff
from ..egress import Policy, Resolver, guarded_client
from ..errors import (
    DocumentUrlError,
    PayloadTooLarge,
    UnsupportedMediaType,
    UrlFetchFailed,
    UrlTooManyRedirects,
    UrlUnsupportedScheme,
)

REDIRECTS = (301, 302, 303, 307, 308)


def check_url(url: str) -> httpx.URL:
    """The URL as httpx reads it, if the service may fetch it at all (before any address is looked at)."""
    # mutation: NumberReplacer to `split(":", 2)` is equivalent: part 0 is what precedes the first ":"
    # whatever the number of splits past the first.
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme not in ("http", "https"):
        raise UrlUnsupportedScheme(
            f"url must be an http or https URL, not {scheme or 'one without a scheme'}"
        )
    parsed = urls.parse(url)
    if parsed is None:
        raise DocumentUrlError(
            "url must be an http(s) URL with a host, without user info or whitespace, of at most "
            f"{urls.MAX_URL_LENGTH} characters"
        )
    return parsed


async def fetch(
    url: str,
    limit_bytes: int,
    timeout_s: float,
    max_redirects: int,
    policy: Policy,
    resolver: Resolver | None = None,
) -> tuple[bytes, str]:
    """The document's bytes and media type. Raises DocumentUrlError (its kind), PayloadTooLarge or
    UnsupportedMediaType."""
    target = check_url(url)
    try:
        async with asyncio.timeout(timeout_s), guarded_client(policy, timeout_s, resolver) as client:
            for _ in range(max_redirects + 1):
                async with client.stream(
                    "GET", target, headers={"Accept": ", ".join(SUPPORTED_TYPES)}
                ) as response:
                    if response.status_code in REDIRECTS and "location" in response.headers:
                        target = check_url(str(target.join(response.headers["location"])))
                        continue
                    if response.status_code != 200:
                        raise UrlFetchFailed(
                            f"{urls.host_of(str(target))} answered {response.status_code}, not the document"
                        )
                    body = await _read(response, limit_bytes)
                    return body, _media_type(body, response.headers.get("content-type"))
    except TimeoutError:
        raise UrlFetchFailed(
            f"the document was not fetched within {timeout_s:g} s (job_url_timeout_s)"
        ) from None
    except httpx.HTTPError as err:
        raise UrlFetchFailed(f"the document could not be fetched: {_why(err)}") from None
    raise UrlTooManyRedirects(f"more than {max_redirects} redirects (job_url_max_redirects)")


async def _read(response: httpx.Response, limit: int) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"the document of {declared} bytes exceeds {limit} bytes")
    buf = bytearray()
    async for chunk in response.aiter_raw():
        buf += chunk
        if len(buf) > limit:
            raise PayloadTooLarge(f"the document exceeds {limit} bytes")
    return bytes(buf)


def _media_type(body: bytes, declared: str | None) -> str:
    found = sniff(body)
    if found is not None:
        return found
    declared_type = normalise_media_type(declared)
    if declared_type in SUPPORTED_TYPES and declared_type != PDF_TYPE:
        return declared_type  # the decoder says what is wrong with it
    raise UnsupportedMediaType(
        f"the document at the URL is {declared_type or 'of no declared type'} and not one of "
        f"{', '.join(SUPPORTED_TYPES)}"
    )


def _why(err: httpx.HTTPError) -> str:
    text = str(err)
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return "its TLS certificate was not trusted"
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
