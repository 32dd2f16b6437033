"""format=text: each page's text in reading order (the JSON's `text`), pages apart by a form feed (as
`pdftotext` separates them)."""

from __future__ import annotations

from ...schemas import OcrResponse

MEDIA_TYPE = "text/plain"


def render(response: OcrResponse) -> str:
    return "\f".join(page.text for page in response.pages)
