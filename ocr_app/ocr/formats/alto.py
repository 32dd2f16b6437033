"""format=alto: ALTO 4 (https://www.loc.gov/standards/alto/), measured in pixels of the page as sent.

A `Page` per page (`WIDTH`, `HEIGHT`, `PHYSICAL_IMG_NR` its page number) with one `PrintSpace` over the
whole page, a `TextBlock` per layout block, a `TextLine` per line and a `String` per word (`CONTENT`,
`HPOS`, `VPOS`, `WIDTH`, `HEIGHT`, `WC`: the line's confidence, 0-1), an `SP` between two words. Word boxes
are estimated from their line's (geometry.py); a line the engine could not localise (`bbox` null) and its
words carry no position. Built with xml.etree: the text is escaped by the serialiser.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from ... import __version__
from ...schemas import OcrResponse, Page
from . import parts
from .geometry import Box, block_lines, element, pixel_box, union, words

MEDIA_TYPE = "application/alto+xml"
ALTO = "http://www.loc.gov/standards/alto/ns-v4#"
XSI = "http://www.w3.org/2001/XMLSchema-instance"
SCHEMA_LOCATION = f"{ALTO} http://www.loc.gov/standards/alto/v4/alto-4-4.xsd"


def _position(box: Box | None) -> dict[str, str]:
    if box is None:
        return {}
    x0, y0, x1, y1 = box
    return {"HPOS": str(x0), "VPOS": str(y0), "WIDTH": str(x1 - x0), "HEIGHT": str(y1 - y0)}


class Writer(parts.XmlWriter):
    """The head (Description, the Layout opened), a `Page` per page, the tail."""

    def document(self) -> tuple[ET.Element, ET.Element]:
        # Unqualified names in the default namespace, declared on the root; xsi's prefix is ElementTree's.
        alto = element(None, "alto", xmlns=ALTO, **{f"{{{XSI}}}schemaLocation": SCHEMA_LOCATION})
        description = element(alto, "Description")
        element(description, "MeasurementUnit").text = "pixel"
        processing = element(description, "OCRProcessing", ID="OCR_0")
        step = element(element(processing, "ocrProcessingStep"), "processingSoftware")
        element(step, "softwareName").text = f"ocrfleet ({self.engine}: {self.model})"
        element(step, "softwareVersion").text = __version__
        return alto, element(alto, "Layout")

    def page_element(self, parent: ET.Element, page: Page) -> None:
        _page(parent, page)


def render(response: OcrResponse) -> bytes:
    return parts.render(Writer, response)


def _page(layout: ET.Element, page: Page) -> None:
    n = page.page
    size = {"WIDTH": str(page.width), "HEIGHT": str(page.height)}
    el = element(layout, "Page", ID=f"p{n}", PHYSICAL_IMG_NR=str(n), **size)
    space = element(el, "PrintSpace", HPOS="0", VPOS="0", **size)
    for b, lines in block_lines(page):
        box = union([pixel_box(line.bbox, page) for line in lines])
        block = element(space, "TextBlock", ID=f"p{n}_b{b}", **_position(box))
        for li, line in enumerate(lines, 1):
            line_box = pixel_box(line.bbox, page)
            text_line = element(block, "TextLine", ID=f"p{n}_b{b}_l{li}", **_position(line_box))
            for wi, word in enumerate(words(line, page), 1):
                if wi > 1:
                    element(text_line, "SP")
                wc = f"{min(max(word.confidence, 0.0), 1.0):.4f}"
                element(
                    text_line,
                    "String",
                    ID=f"p{n}_b{b}_l{li}_w{wi}",
                    CONTENT=word.text,
                    **_position(word.box),
                    WC=wc,
                )
