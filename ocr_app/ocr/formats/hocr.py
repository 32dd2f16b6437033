"""format=hocr: hOCR 1.2 (https://kba.github.io/hocr-spec/1.2/) as XHTML.

One `ocr_page` per page (`bbox 0 0 width height`: pixels of the page as sent, `ppageno` 0-based), an
`ocr_carea` per layout block holding one `ocr_par`, an `ocr_line` per line and an `ocrx_word` per word with
`bbox` and `x_wconf` (the line's confidence, 0-100). Word boxes are estimated from their line's
(geometry.py). hOCR requires a bbox on every `ocr_line`: a line the engine could not localise (`bbox` null)
keeps its text in its paragraph as a plain `<span>` without a class, so it claims no place on the page.
Built with xml.etree: the text is escaped by the serialiser.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from ... import __version__
from ...schemas import OcrResponse, Page
from . import parts
from .geometry import Box, block_lines, element, pixel_box, union, words

MEDIA_TYPE = "application/xhtml+xml"
XHTML = "http://www.w3.org/1999/xhtml"
CAPABILITIES = "ocr_page ocr_carea ocr_par ocr_line ocrx_word"
PROLOGUE = b'<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE html>\n'


def _bbox(box: Box) -> str:
    return "bbox {} {} {} {}".format(*box)


class Writer(parts.XmlWriter):
    """The head (`ocr-number-of-pages`: `count`), an `ocr_page` per page, the tail."""

    prologue = PROLOGUE

    def document(self) -> tuple[ET.Element, ET.Element]:
        html = element(None, "html", xmlns=XHTML)
        head = element(html, "head")
        element(head, "title").text = "OCR result"
        element(head, "meta", **{"http-equiv": "Content-Type", "content": "text/html; charset=utf-8"})
        system = f"ocrfleet {__version__} ({self.engine}: {self.model})"
        element(head, "meta", name="ocr-system", content=system)
        element(head, "meta", name="ocr-capabilities", content=CAPABILITIES)
        element(head, "meta", name="ocr-number-of-pages", content=str(self.count))
        body = element(html, "body")
        # Never empty, a page never either: only <meta/> is ever empty, since an HTML parser reads <div/> as
        # an opening tag, and </meta> as an error.
        body.text = "\n"
        return html, body

    def page_element(self, parent: ET.Element, page: Page) -> None:
        _page(parent, page)


def render(response: OcrResponse) -> bytes:
    return parts.render(Writer, response)


def _page(body: ET.Element, page: Page) -> None:
    n = page.page
    div = element(
        body,
        "div",
        **{
            "class": "ocr_page",
            "id": f"page_{n}",
            "title": f"bbox 0 0 {page.width} {page.height}; ppageno {n - 1}",
        },
    )
    div.text = "\n"
    div.tail = "\n"
    for b, lines in block_lines(page):
        box = union([pixel_box(line.bbox, page) for line in lines])
        area_title = {"title": _bbox(box)} if box else {}
        area = element(div, "div", **{"class": "ocr_carea", "id": f"block_{n}_{b}", **area_title})
        par = element(area, "p", **{"class": "ocr_par", "id": f"par_{n}_{b}", **area_title})
        for li, line in enumerate(lines, 1):
            line_box = pixel_box(line.bbox, page)
            if line_box is None:
                element(par, "span").text = line.text
                continue
            span = element(
                par, "span", **{"class": "ocr_line", "id": f"line_{n}_{b}_{li}", "title": _bbox(line_box)}
            )
            for wi, word in enumerate(words(line, page), 1):
                assert word.box is not None
                conf = round(min(max(word.confidence, 0.0), 1.0) * 100)
                w = element(
                    span,
                    "span",
                    **{
                        "class": "ocrx_word",
                        "id": f"word_{n}_{b}_{li}_{wi}",
                        "title": f"{_bbox(word.box)}; x_wconf {conf}",
                    },
                )
                w.text = word.text
                w.tail = " "
            if len(span):
                span[-1].tail = None
            span.tail = "\n"
