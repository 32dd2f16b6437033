"""A text format as parts: a head, a part per page, a tail. /v1/ocr joins them for its one answer; a job's
result (ocr_app/jobs/results.py) writes them as it reads the job's pages from the store, a batch at a time,
so that a job of any length is rendered in bounded memory. One implementation for both."""

from __future__ import annotations

from collections.abc import Iterable

from ...schemas import OcrResponse, Page


class Writer:
    """One document's parts, in order: head(), page() for each page (in page order), tail(). A writer keeps
    what runs across pages (Markdown's title count), so it is used for one document only.

    `engine` and `model` name what read the pages; `count` is how many pages page() will be given."""

    separator = b""  # between two pages' parts

    def __init__(self, engine: str, model: str, count: int) -> None:
        self.engine = engine
        self.model = model
        self.count = count
        self._pages = 0

    def head(self) -> bytes:
        return b""

    def tail(self) -> bytes:
        return b""

    def body(self, page: Page) -> bytes:
        raise NotImplementedError

    def page(self, page: Page) -> bytes:
        out = self.body(page)
        self._pages += 1
        return out if self._pages == 1 else self.separator + out

    def render(self, pages: Iterable[Page]) -> bytes:
        return self.head() + b"".join(self.page(p) for p in pages) + self.tail()


def render(writer: type[Writer], response: OcrResponse) -> bytes:
    """The whole answer in one piece (/v1/ocr)."""
    return writer(response.engine, response.model, len(response.pages)).render(response.pages)
