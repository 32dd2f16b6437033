"""A result's way out: the response model (ocr_app/schemas.py's OcrResponse) in the form a client asked for,
by `format=` or by `Accept` (negotiate.py). One module per format, each a pure function from the response to
its text or bytes, no HTTP in them. JSON is the route's own answer (FastAPI serialises the model as it
always has)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...schemas import OcrResponse
from . import alto, hocr, markdown, text


@dataclass(frozen=True)
class Format:
    name: str
    media_type: str  # what the answer's Content-Type names (with charset=utf-8)
    render: Callable[[OcrResponse], str | bytes] | None  # None: JSON, the route's own


JSON = Format("json", "application/json", None)
FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        JSON,
        Format("text", text.MEDIA_TYPE, text.render),
        Format("markdown", markdown.MEDIA_TYPE, markdown.render),
        Format("hocr", hocr.MEDIA_TYPE, hocr.render),
        Format("alto", alto.MEDIA_TYPE, alto.render),
    )
}
# Named by the API (issue #42) but not built yet: asking for one is a 422 format_unavailable, not a 500.
UNAVAILABLE = ("pdf",)


def render(fmt: Format, response: OcrResponse) -> bytes:
    assert fmt.render is not None, "JSON is the route's own"
    out = fmt.render(response)
    return out.encode("utf-8") if isinstance(out, str) else out
