"""An upload as the client sent it: its media type (declared, then sniffed from the document's own bytes), a
multipart body's `file`, and the pages it selects. Nothing here decodes a document."""

from __future__ import annotations

import re
from typing import Any

from python_multipart.multipart import MultipartParser, parse_options_header

from ..errors import InvalidDocument, InvalidParameter, TooManyPages, UnsupportedMediaType

RASTER_TYPES = {
    "image/png": "PNG",
    "image/jpeg": "JPEG",
    "image/webp": "WEBP",
    "image/tiff": "TIFF",
    "image/bmp": "BMP",
}
PDF_TYPE = "application/pdf"
SUPPORTED_TYPES = (*RASTER_TYPES, PDF_TYPE)
MULTIPART_TYPE = "multipart/form-data"

# ASCII digits and spaces only, matched whole: Python's `\d`/`\s` take any Unicode digit or separator (the
# fuzzer's "0\x1f", which int() refuses: a 500), `$` a trailing newline; int() refuses over 4300 digits.
_N = r"[ \t]*[0-9]{1,18}[ \t]*"
_SELECTION_RE = re.compile(rf"{_N}(-{_N})?(,{_N}(-{_N})?)*")


def normalise_media_type(header: str | None) -> str:
    # mutation: NumberReplacer to `split(";", 2)` equivalent because the first part is the same.
    return (header or "").split(";", 1)[0].strip().lower()


def parse_page_selection(spec: str | None, max_pages: int) -> list[int] | None:
    """`1-3,5` -> [1, 2, 3, 5]; None selects every page."""
    if spec is None:
        return None
    if not _SELECTION_RE.fullmatch(spec):
        raise InvalidParameter(f"pages must look like '1-3,5', got {spec[:40]!r}")
    pages: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if first < 1 or last < first:
            raise InvalidParameter(f"invalid page range {part.strip()!r}: pages start at 1")
        # An early exit before a range's pages are built (`1-1000000000`); the count after the loop decides.
        # mutation: ReplaceBinaryOperator_Add_Sub equivalent because a range 2 pages longer still fails below.
        # mutation: NumberReplacer to `+ 0 >` equivalent because a range 1 page longer still fails below.
        if last - first + 1 > max_pages or len(pages) > max_pages:
            raise TooManyPages(f"at most {max_pages} pages per request")
        pages.update(range(first, last + 1))
    if len(pages) > max_pages:
        raise TooManyPages(f"at most {max_pages} pages per request")
    return sorted(pages)


def sniff(data: bytes) -> str | None:
    """The media type from the document's magic bytes; clients' Content-Types are often wrong."""
    # mutation: NumberReplacer equivalent because the checks below read its first 12 bytes.
    head = data[:16]
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "image/tiff"
    if head.startswith(b"BM"):
        return "image/bmp"
    if b"%PDF-" in data[:1024]:
        return PDF_TYPE
    return None


def classify(data: bytes, declared: str) -> str:
    if not data:
        raise InvalidDocument("empty document")
    found = sniff(data)
    if found:
        return found
    if declared in SUPPORTED_TYPES or declared in ("", "application/octet-stream"):
        raise InvalidDocument("not a PNG, JPEG, WebP, TIFF, BMP or PDF document")
    raise UnsupportedMediaType(f"unsupported media type {declared!r}")


# A form sends `file` and perhaps a few fields beside it. Parsing stops at the first part past this bound:
# a body of thousands of tiny parts costs no more than a legitimate one (python-multipart bounds headers).
MAX_MULTIPART_PARTS = 8


class _Unbounded(Exception):
    pass


def extract_multipart_file(body: bytes, content_type: str) -> tuple[bytes, str]:
    """The `file` field of a multipart/form-data body, parsed in memory (never spooled to disk)."""
    _, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if not boundary:
        raise InvalidParameter("multipart/form-data without a boundary")

    parts: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    field: list[bytes] = []
    value: list[bytes] = []

    def on_part_begin() -> None:
        if len(parts) >= MAX_MULTIPART_PARTS:
            raise _Unbounded(f"more than {MAX_MULTIPART_PARTS} parts")
        current.clear()
        current.update(headers={}, data=[])

    def on_header_end() -> None:
        current["headers"][b"".join(field).lower()] = b"".join(value)
        field.clear()
        value.clear()

    def on_part_end() -> None:
        parts.append(dict(current))

    parser = MultipartParser(
        boundary,
        callbacks={
            "on_part_begin": on_part_begin,
            "on_part_data": lambda d, s, e: current["data"].append(d[s:e]),
            "on_part_end": on_part_end,
            "on_header_field": lambda d, s, e: field.append(d[s:e]),
            "on_header_value": lambda d, s, e: value.append(d[s:e]),
            "on_header_end": on_header_end,
        },
    )
    try:
        parser.write(body)
        parser.finalize()
    except _Unbounded as err:
        raise InvalidParameter(f"multipart body with {err}: send the document as one 'file' field") from None
    except Exception as err:  # python-multipart raises several error types for bad framing
        raise InvalidParameter(f"malformed multipart body: {err}") from None
    for part in parts:
        _, disp = parse_options_header(part["headers"].get(b"content-disposition", b""))
        if disp.get(b"name") == b"file":
            ctype = normalise_media_type(part["headers"].get(b"content-type", b"").decode("latin-1"))
            return b"".join(part["data"]), ctype
    raise InvalidParameter("multipart body has no 'file' field")
