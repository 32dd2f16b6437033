"""A result's way out: the response model (ocr_app/schemas.py's OcrResponse) in the form a client asked for,
by `format=` or by `Accept` (negotiate.py). One module per format, each a function from the response to its
text or bytes, no HTTP in them: the text formats need the response only; pdf (pdf.py) also the document as
sent (a `Source`), whose pages it keeps. JSON is the route's own answer (FastAPI serialises the model as it
always has).

The text formats are written in parts (parts.py: a head, a part per page, a tail): /v1/ocr joins them, a
job's result (ocr_app/jobs/results.py) streams them as it reads the job's pages."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...schemas import OcrResponse
from . import alto, hocr, markdown, parts, pdf, text
from .pdf import Source

__all__ = ["FORMATS", "JSON", "UNAVAILABLE", "Format", "Source", "render"]

# The document is given where the route has it; a format that needs it (pdf) refuses to work without.
Renderer = Callable[[OcrResponse, Source | None], str | bytes]


def _answer_only(fn: Callable[[OcrResponse], str | bytes]) -> Renderer:
    """A format made from the response alone: the document is not read."""
    return lambda response, _source: fn(response)


@dataclass(frozen=True)
class Format:
    name: str
    media_type: str  # what the answer's Content-Type names
    render: Renderer | None  # None: JSON, the route's own
    binary: bool = False  # True: the Content-Type has no charset (pdf)
    writer: type[parts.Writer] | None = None  # the text formats' parts (None: json and pdf)

    def content_type(self, media_type: str) -> str:
        """The answer's Content-Type for the media type negotiated (hOCR has two)."""
        return media_type if self.binary else f"{media_type}; charset=utf-8"


JSON = Format("json", "application/json", None)
FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        JSON,
        Format("text", text.MEDIA_TYPE, _answer_only(text.render), writer=text.Writer),
        Format(
            "markdown",
            markdown.MEDIA_TYPE,
            _answer_only(markdown.render),
            writer=markdown.Writer,
        ),
        Format("hocr", hocr.MEDIA_TYPE, _answer_only(hocr.render), writer=hocr.Writer),
        Format("alto", alto.MEDIA_TYPE, _answer_only(alto.render), writer=alto.Writer),
        Format("pdf", pdf.MEDIA_TYPE, pdf.render, binary=True),
    )
}
# Named by the API but not built yet: asking for one is a 422 format_unavailable, not a 500. None now.
UNAVAILABLE: tuple[str, ...] = ()


def render(fmt: Format, response: OcrResponse, source: Source | None = None) -> bytes:
    """The answer in `fmt` (CPU work, pdf's seconds of it: the route runs it off the event loop)."""
    assert fmt.render is not None, "JSON is the route's own"
    out = fmt.render(response, source)
    return out.encode("utf-8") if isinstance(out, str) else out
