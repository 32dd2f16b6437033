"""A text format as parts: a head, a part per page, a tail. /v1/ocr joins them for its one answer; a job's
result (ocr_app/jobs/results.py) writes them as it reads the job's pages from the store, a batch at a time,
so that a job of any length is rendered in bounded memory. One implementation for both."""

from __future__ import annotations

import functools
import xml.etree.ElementTree as ET
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


class XmlWriter(Writer):
    """An XML format's parts (hOCR, ALTO). document() builds the document without its pages and says which
    element holds them; it is serialised once with a mark there and cut at the mark into the head and the
    tail. Each page is built by page_element() under a throw-away parent and serialised alone (with its
    tail), so a page's markup is the same whichever way the document is assembled."""

    prologue = b'<?xml version="1.0" encoding="UTF-8"?>\n'

    def document(self) -> tuple[ET.Element, ET.Element]:
        """(the root, the element the pages go in, which may hold text before them)."""
        raise NotImplementedError

    def page_element(self, parent: ET.Element, page: Page) -> None:
        """The page's element, appended to `parent`."""
        raise NotImplementedError

    @functools.cached_property
    def _halves(self) -> tuple[bytes, bytes]:
        """Serialised once per writer: head() and tail() each take their half."""
        root, pages = self.document()
        pages.text = (pages.text or "") + _PAGES  # text the serialiser leaves as it is
        doc = ET.tostring(root, encoding="utf-8", xml_declaration=False)
        at = doc.index(_PAGES.encode())
        return doc[:at], doc[at + len(_PAGES) :]

    def head(self) -> bytes:
        return self.prologue + self._halves[0]

    def tail(self) -> bytes:
        return self._halves[1] + b"\n"

    def body(self, page: Page) -> bytes:
        holder = ET.Element("pages")
        self.page_element(holder, page)
        out: bytes = ET.tostring(holder[0], encoding="utf-8", xml_declaration=False)
        return out


_PAGES = "@@ocr-pages@@"  # where the pages go in the serialised document


def render(writer: type[Writer], response: OcrResponse) -> bytes:
    """The whole answer in one piece (/v1/ocr)."""
    return writer(response.engine, response.model, len(response.pages)).render(response.pages)
