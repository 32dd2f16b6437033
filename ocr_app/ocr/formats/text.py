"""format=text: each page's text in reading order (the JSON's `text`), pages apart by a form feed (as
`pdftotext` separates them)."""

from __future__ import annotations

from ...schemas import OcrResponse, Page
from . import parts

MEDIA_TYPE = "text/plain"


class Writer(parts.Writer):
    separator = b"\f"

    def body(self, page: Page) -> bytes:
        return page.text.encode("utf-8")


def render(response: OcrResponse) -> str:
    return parts.render(Writer, response).decode("utf-8")
