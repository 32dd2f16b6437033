"""Pixel boxes and words for the XML formats (hOCR, ALTO): the response's boxes are normalised 0-1 to the page
as sent; hOCR and ALTO count pixels of that page (its `width` and `height`).

A line's words are the engine's own where it locates them (`words`: the rapidocr engine's, each with its box
and confidence). Otherwise (the vllm engine, a result stored before lines had words) they are its text split
on spaces, each word's box **estimated**: the line's box cut across its width in proportion to characters (a
word starting at the line's k-th of n characters starts k/n of the way along), the line's full height, the
line's confidence. A line without a box (`bbox` null) gives words without boxes.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

from ...schemas import Line, Page

Box = tuple[int, int, int, int]  # x0, y0, x1, y1 in pixels, x0 < x1 and y0 < y1 where the page allows


@dataclass(frozen=True)
class Word:
    text: str
    box: Box | None
    confidence: float  # 0-1, the line's


def pixel_box(bbox: tuple[float, float, float, float] | None, page: Page) -> Box | None:
    """A normalised box in pixels of the page, clamped inside it, at least a pixel wide and high."""
    if bbox is None:
        return None
    w, h = page.width, page.height
    x0 = min(max(round(bbox[0] * w), 0), max(w - 1, 0))
    y0 = min(max(round(bbox[1] * h), 0), max(h - 1, 0))
    x1 = min(max(round(bbox[2] * w), x0 + 1), w)
    y1 = min(max(round(bbox[3] * h), y0 + 1), h)
    return (x0, y0, x1, y1)


def union(boxes: list[Box | None]) -> Box | None:
    known = [b for b in boxes if b is not None]
    if not known:
        return None
    return (
        min(b[0] for b in known),
        min(b[1] for b in known),
        max(b[2] for b in known),
        max(b[3] for b in known),
    )


def words(line: Line, page: Page) -> list[Word]:
    """The line's words: the engine's, or its text split on spaces with boxes estimated (module docstring)."""
    if line.words:
        return [Word(w.text, pixel_box(w.bbox, page), w.confidence) for w in line.words if w.text.strip()]
    text = line.text
    box = pixel_box(line.bbox, page)
    spans: list[tuple[int, int]] = []
    start = None
    for i, ch in enumerate(text + " "):
        if ch.isspace():
            if start is not None:
                spans.append((start, i))
                start = None
        elif start is None:
            start = i
    if box is None:
        return [Word(text[a:b], None, line.confidence) for a, b in spans]
    # The share of the line's width runs from its first character to its last (leading and trailing blanks
    # are not on the page).
    first, last = (spans[0][0], spans[-1][1]) if spans else (0, 0)
    n = max(last - first, 1)
    x0, y0, x1, y1 = box
    width = x1 - x0
    out = []
    for a, b in spans:
        wx0 = x0 + (a - first) * width // n
        wx1 = x0 + -((-(b - first) * width) // n)  # ceiling: a word's box covers its characters' share
        wx1 = min(max(wx1, wx0 + 1), x1)
        wx0 = min(wx0, wx1 - 1)
        out.append(Word(text[a:b], (wx0, y0, wx1, y1), line.confidence))
    return out


def element(parent: ET.Element | None, tag: str, **attrib: str) -> ET.Element:
    """A new XML element, under `parent` when given."""
    return ET.Element(tag, attrib) if parent is None else ET.SubElement(parent, tag, attrib)


def block_lines(page: Page) -> list[tuple[int, list[Line]]]:
    """(block number from 1, its lines with text) of each layout block that has any; the page's lines as one
    block where it has no blocks."""
    groups = [b.lines for b in page.blocks] if page.blocks else [list(range(len(page.lines)))]
    out = []
    for b, indices in enumerate(groups, 1):
        lines = [page.lines[i] for i in indices if 0 <= i < len(page.lines)]
        lines = [line for line in lines if line.text.strip()]
        if lines:
            out.append((b, lines))
    return out
