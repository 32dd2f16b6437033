"""Which format answers a request: `format=` when given, else the `Accept` header (RFC 9110, 12.5.1).

Each format is offered as the media types below. For each, the most specific media range of `Accept` that
matches it gives its quality (`q`, 1 unless said; `q=0`: not acceptable); the highest quality wins, and
between equals the order below (JSON first: `*/*`, no `Accept` at all, or an empty one get JSON). A browser
that navigates sends `text/html, application/xhtml+xml, ..., */*;q=0.8`: it wants a web page, not hOCR, so
`application/xhtml+xml` chooses hOCR only where `text/html` is not also accepted (`text/vnd.hocr+html` always
does); such a browser gets JSON through its `*/*`. A header that allows none of them is a 406; a range that
cannot be read (no `/`, a q out of 0-1) is left out, as though it were not there.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import FormatUnavailable, InvalidParameter, NotAcceptable
from . import FORMATS, UNAVAILABLE, Format

# (media type, format), in the order that breaks ties.
OFFERS: tuple[tuple[str, str], ...] = (
    ("application/json", "json"),
    ("text/plain", "text"),
    ("text/markdown", "markdown"),
    ("text/vnd.hocr+html", "hocr"),
    ("application/xhtml+xml", "hocr"),
    ("application/alto+xml", "alto"),
    ("application/pdf", "pdf"),
)


@dataclass(frozen=True)
class MediaRange:
    type: str
    subtype: str
    q: float

    def specificity(self, media_type: str) -> int:
        """-1 when the range does not match media_type, else how specific it is (0 for */*, 2 for a/b)."""
        t, s = media_type.split("/", 1)
        if self.type == "*":
            return 0 if self.subtype == "*" else -1
        if self.type != t:
            return -1
        if self.subtype == "*":
            return 1
        return 2 if self.subtype == s else -1


def parse_accept(header: str) -> list[MediaRange]:
    """The header's media ranges, lower-cased, parameters other than q ignored; unreadable ones left out."""
    out = []
    for part in header.split(","):
        fields = [f.strip() for f in part.split(";")]
        mtype, _, subtype = fields[0].lower().partition("/")
        if not mtype or not subtype or "/" in subtype or (mtype == "*" and subtype != "*"):
            continue
        q = 1.0
        readable = True
        for param in fields[1:]:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value.strip())
                except ValueError:
                    readable = False
                if not 0.0 <= q <= 1.0:
                    readable = False
                break  # what follows q are accept-extensions
        if readable:
            out.append(MediaRange(mtype, subtype, q))
    return out


def quality(ranges: list[MediaRange], media_type: str) -> float:
    best, q = -1, 0.0
    for r in ranges:
        s = r.specificity(media_type)
        if s > best:
            best, q = s, r.q
    return q


def from_accept(header: str | None) -> tuple[Format, str]:
    """The format and the media type to answer with, for this Accept header (406 when none is acceptable)."""
    if header is None or not header.strip():
        return FORMATS["json"], FORMATS["json"].media_type
    ranges = parse_accept(header)
    if not ranges:
        return FORMATS["json"], FORMATS["json"].media_type
    browser = quality(ranges, "text/html") > 0 and any(r.specificity("text/html") == 2 for r in ranges)
    best: tuple[float, str, str] | None = None
    for media_type, name in OFFERS:
        if browser and media_type == "application/xhtml+xml":
            continue
        q = quality(ranges, media_type)
        if q > 0 and (best is None or q > best[0]):
            best = (q, media_type, name)
    if best is None:
        types = ", ".join(t for t, _ in OFFERS)
        raise NotAcceptable(f"Accept allows none of the types this route answers with: {types}")
    return FORMATS[best[2]], best[1]


def choose(format_param: str | None, accept: str | None) -> tuple[Format, str]:
    """`format=` when given (422 for an unknown or unavailable one), else Accept."""
    if format_param is None:
        return from_accept(accept)
    name = format_param.strip().lower()
    if name in FORMATS:
        return FORMATS[name], FORMATS[name].media_type
    names = ", ".join(FORMATS)
    if name in UNAVAILABLE:
        raise FormatUnavailable(f"format={name} is not available yet; the formats are {names}")
    raise InvalidParameter(f"format: unknown format {format_param[:40]!r}; the formats are {names}")
