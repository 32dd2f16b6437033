"""Grounding: boxes for a vision-language model's lines, which come without any.

The CPU engine's detector and recogniser (PP-OCRv6, `ocr-app[cpu]`) read the same page; each of the
model's Markdown lines is then matched to the detected lines by fuzzy string similarity (rapidfuzz)
and takes their box. A model line that matches nothing keeps `bbox: null`.

Matching, in three passes over the page's lines (text compared without Markdown/HTML/LaTeX markup,
whitespace collapsed, case folded):
1. one to one: the best pairs first (similarity >= MIN_SCORE), each detected line used once;
2. a model line made of several detected pieces (table rows, a line the detector split): the unused
   pieces found inside it, joined in reading order, must match it as a whole; their boxes' union;
3. a model line that is part of a longer detected line (the model split what the detector joined):
   that line's box (coarser, but it contains the text).
"""

from __future__ import annotations

import re

from ...documents.image import PageImage
from ..base import Engine, EngineLine

BBox = tuple[float, float, float, float]

MIN_SCORE = 70.0  # rapidfuzz ratio, 0-100
PIECE_SCORE = 90.0  # a piece (or a part) found inside a longer line
MIN_PIECE_CHARS = 3

_MARKUP = re.compile(
    r"!\[[^\]]*\]\([^)]*\)"  # images: ![alt](src)
    r"|<[^>]{1,200}>"  # HTML tags (tables)
    r"|\\[a-zA-Z]+"  # LaTeX commands
    r"|[#*_`|>~$^{}\\]"  # Markdown and LaTeX punctuation
)


def normalise(text: str) -> str:
    return " ".join(_MARKUP.sub(" ", text).split()).casefold()


def align(model_lines: list[str], detected: list[EngineLine]) -> list[BBox | None]:
    """A box (or None) for each model line, from the detected lines (in reading order)."""
    from rapidfuzz import fuzz, process

    boxes: list[BBox | None] = [None] * len(model_lines)
    found = [(i, d) for i, d in enumerate(detected) if d.bbox is not None]
    m = [normalise(t) for t in model_lines]
    d = [normalise(line.text) for _, line in found]
    if not found or not any(m):
        return boxes
    scores = process.cdist(m, d, scorer=fuzz.ratio)

    pairs = sorted(
        ((scores[i][j], i, j) for i in range(len(m)) if m[i] for j in range(len(d)) if d[j]),
        reverse=True,
    )
    used_m: set[int] = set()
    used_d: set[int] = set()
    for score, i, j in pairs:
        if score < MIN_SCORE:
            break
        if i not in used_m and j not in used_d:
            boxes[i] = found[j][1].bbox
            used_m.add(i)
            used_d.add(j)

    for i, text in enumerate(m):
        if i in used_m or not text:
            continue
        pieces = [
            j
            for j in range(len(d))
            if j not in used_d
            and len(d[j]) >= MIN_PIECE_CHARS
            and len(d[j]) < len(text)
            and fuzz.partial_ratio(d[j], text) >= PIECE_SCORE
        ]
        if len(pieces) >= 2 and fuzz.ratio(" ".join(d[j] for j in pieces), text) >= MIN_SCORE:
            boxes[i] = union([b for j in pieces if (b := found[j][1].bbox) is not None])
            used_m.add(i)
            used_d.update(pieces)

    for i, text in enumerate(m):
        if i in used_m or len(text) < MIN_PIECE_CHARS + 1:
            continue
        best = max(
            (j for j in range(len(d)) if len(d[j]) > len(text)),
            key=lambda j: fuzz.partial_ratio(text, d[j]),
            default=None,
        )
        if best is not None and fuzz.partial_ratio(text, d[best]) >= PIECE_SCORE:
            boxes[i] = found[best][1].bbox
    return boxes


def union(boxes: list[BBox]) -> BBox:
    return (
        min(b[0] for b in boxes),
        min(b[1] for b in boxes),
        max(b[2] for b in boxes),
        max(b[3] for b in boxes),
    )


class Grounder:
    """Reads pages with a (loaded) CPU engine, whose pool bounds the CPU it takes."""

    def __init__(self, detector: Engine):
        self.detector = detector

    async def load(self) -> None:
        await self.detector.load()

    async def detect(self, page: PageImage) -> list[EngineLine]:
        [found] = await self.detector.recognize([page])
        return found.lines

    async def close(self) -> None:
        await self.detector.close()
