"""Detected line boxes fitted to the page's gutters, before recognition: a box the text detector ran across
a narrow gutter is split there, and a box's end that overhangs into a gutter is pulled back to it.

The detector joins the lines of two columns into one box when the gutter between them is narrow (a
newsletter's 10 pt beside 9 pt justified text), and pads each box by about a fifth of its height on both
ends, so that the columns it does part are left closer than the layout's gutter minimum (GUTTER_MIN in
layout.py). No reading order can part text inside one box; the recogniser then reads each piece.

A gutter is told from a wide word space by the page around it: a blank run across a box's full height, at
least GAP_MIN of the box's height wide with ink each side, is a gutter when the rows next to the box on
one side (above or below: a column's first and last lines have a headline or the next story on the other)
are blank there too, while the text of each reaches up to it from both sides. The page's pixels are read
binarised (ink_mask); the rows are the other boxes' rows, tested on the page, so a row the detector parted
at the gutter counts as well as one it joined. Pure geometry over numpy: a page of 300 boxes takes a few
tens of ms beside the seconds of its recognition.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

Piece = tuple[float, float]  # x0, x1 of a box's piece, in the page's pixels

# Limits, in the box's own height h (a box's height is its text size, padding included, whatever the DPI).
# A candidate gutter in a box: a blank run across the box's full height at least GAP_MIN h wide with ink on
# both sides. A word space is about 0.2 h (a third of an em; the detector's box is ~1.5 em tall), a justified
# narrow column's stretched one up to ~0.4 h; a newsletter's 10 pt gutter beside 9 pt text is ~0.75 h.
GAP_MIN = 0.5
# A row (another box's line, above or below) is blank at the gutter when the gutter's middle, CORE h wide
# and shifted along the page's tilt, holds no ink over the row's height; it counts only when its text
# reaches within REACH h of that middle from both sides (a paragraph's short last line, a blank, tells
# nothing) or when it has ink in the middle (it crosses: a headline, a line of one column's text).
CORE = 0.3
REACH = 1.5
# The middle is taken at the run's middle and, for a run wider than 2 (EDGE + CORE / 2) h, EDGE h in from
# either end too: a paragraph's short last line joined to the next column's line leaves a run wider than
# the gutter, at whose far end the gutter lies.
EDGE = 0.1
# The rows a side offers: the nearest ROWS that count (within WINDOW h of the box's centre). The side
# confirms the gutter when at least MIN_ROWS of them count and every one of them is blank there: rivers of
# word spaces in one column do not run straight down through four lines (the line and three).
ROWS = 3
MIN_ROWS = 2
WINDOW = 5.0
# A piece cut at a gutter, or an end pulled back to one, keeps MARGIN h of blank beside its ink (the
# detector leaves ~0.22 h): enough for the recogniser, little enough that pieces each side of a gutter
# 0.7 h wide leave the layout its GUTTER_MIN (0.4 of the page's median h) once the page is deskewed (a cut
# along the page's vertical widens a tilted box by h tan(angle): 1.3 px at 2 degrees).
MARGIN = 0.1
# A box under MIN_HEIGHT px tall is left as it is: its text, some 5 px, is nothing the recogniser reads, and
# the gutter's middle (CORE h) would be under two columns wide, or none.
MIN_HEIGHT = 8.0


def ink_mask(image: np.ndarray) -> np.ndarray:
    """The page's ink: a pixel at or under the threshold that best parts its grey levels in two (Otsu's, by
    OpenCV), from an RGB/BGR (H, W, 3) or grey (H, W) uint8 image. A page of one grey level has no ink."""
    pixels = np.asarray(image)
    if pixels.ndim == 3:  # the channels' mean, in integers (a page is millions of pixels)
        total = pixels[..., 0].astype(np.uint16) + pixels[..., 1] + pixels[..., 2]
        # mutation: NumberReplacer to `// 4` equivalent because Otsu's split of the levels does not change
        # when they are all scaled alike (up to rounding).
        levels = (total // 3).astype(np.uint8)
    else:
        levels = np.ascontiguousarray(pixels, dtype=np.uint8)
    if not levels.size or levels.min() == levels.max():  # Otsu's threshold would put it all on one side
        return np.zeros(levels.shape, dtype=bool)
    # mutation: NumberReplacer equivalent because with THRESH_OTSU OpenCV ignores the threshold given (0),
    # and any value set (1) reads as True.
    _, ink = cv2.threshold(levels, 0, 1, cv2.THRESH_BINARY_INV | cv2.THRESH_OTSU)
    return np.asarray(ink, dtype=bool)


class _Page:
    """Column ink counts over any rows of the page, from a cumulative sum down each column."""

    def __init__(self, ink: np.ndarray):
        self.height, self.width = ink.shape
        self.csum = np.zeros((self.height + 1, self.width), dtype=np.int32)
        np.cumsum(ink, axis=0, dtype=np.int32, out=self.csum[1:])

    def counts(self, xs: np.ndarray, top: np.ndarray, bottom: np.ndarray) -> np.ndarray:
        """Ink in each column xs between rows top and bottom (inclusive, clipped to the page)."""
        y0 = np.minimum(np.maximum(np.ceil(top).astype(np.int64), 0), self.height)
        y1 = np.minimum(np.maximum(np.floor(bottom).astype(np.int64) + 1, y0), self.height)
        return np.asarray(self.csum[y1, xs] - self.csum[y0, xs])

    def row(self, quad: _Quad) -> np.ndarray:
        """The inked columns along a box's row, its edges drawn on across the page, as a running count
        (width + 1: the columns first..last hold ink when it rises from [first] to [last + 1])."""
        xs = np.arange(self.width)
        centres = xs + 0.5  # a column is where its centre is
        inked = self.counts(xs, quad.top(centres), quad.bottom(centres)) > 0
        return np.concatenate([[0], np.cumsum(inked)])

    def inked(self, row: np.ndarray, first: int, last: int) -> bool:
        """Whether a row (row()) has ink in any column first..last (clipped to the page)."""
        first, last = max(first, 0), min(last, self.width - 1)
        return last >= first and bool(row[last + 1] - row[first])


class _Quad:
    """A box's quadrilateral (top-left, top-right, bottom-right, bottom-left): its top and bottom edges as
    lines over x, so that a slightly tilted line's rows are followed along it."""

    def __init__(self, quad: np.ndarray):
        tl, tr, br, bl = (quad[k].astype(np.float64) for k in range(4))
        self.x0, self.x1 = float(quad[:, 0].min()), float(quad[:, 0].max())
        self.tl, self.bl = tl, bl
        self.top_slope = (tr[1] - tl[1]) / (tr[0] - tl[0]) if tr[0] - tl[0] > 0 else 0.0
        self.bottom_slope = (br[1] - bl[1]) / (br[0] - bl[0]) if br[0] - bl[0] > 0 else 0.0
        self.h = float((np.hypot(*(bl - tl)) + np.hypot(*(br - tr))) / 2)

    def top(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.tl[1] + (x - self.tl[0]) * self.top_slope)

    def bottom(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.bl[1] + (x - self.bl[0]) * self.bottom_slope)

    def middle(self, x: float) -> float:
        at = np.asarray(x)
        return float((self.top(at) + self.bottom(at)) / 2)


class _Lines:
    """The page's boxes, one _Quad each, and the same as arrays for finding the ones near a place."""

    def __init__(self, quads: np.ndarray):
        self.quads = [_Quad(q) for q in quads]
        self.x0 = np.asarray([q.x0 for q in self.quads])
        self.x1 = np.asarray([q.x1 for q in self.quads])
        self.h = np.asarray([q.h for q in self.quads])
        self.tl, self.bl = quads[:, 0], quads[:, 3]
        self.top_slope = np.asarray([q.top_slope for q in self.quads])
        self.bottom_slope = np.asarray([q.bottom_slope for q in self.quads])
        self.rows: dict[int, np.ndarray] = {}

    def row(self, j: int, page: _Page) -> np.ndarray:
        """Box j's row on the page (_Page.row), worked out once."""
        if j not in self.rows:
            self.rows[j] = page.row(self.quads[j])
        return self.rows[j]

    def middles(self, x: float) -> np.ndarray:
        """Each box's middle (half way between its top and bottom edges) at x."""
        top = self.tl[:, 1] + (x - self.tl[:, 0]) * self.top_slope
        bottom = self.bl[:, 1] + (x - self.bl[:, 0]) * self.bottom_slope
        return np.asarray((top + bottom) / 2)


def _runs(blank: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of blank columns with ink on both sides, within the array."""
    step = np.diff(blank.astype(np.int8))
    starts = np.flatnonzero(step == 1) + 1  # blank after ink
    ends = np.flatnonzero(step == -1) + 1  # ink after blank
    if len(blank) and blank[0]:  # a run from the array's start has no ink before it
        ends = ends[1:]
    if len(blank) and blank[-1]:  # nor one to its end ink after it
        starts = starts[:-1]
    # mutation: ReplaceTrueWithFalse equivalent because each start has its end: the same lengths.
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def gutter_pieces(quads: np.ndarray, image: np.ndarray) -> list[list[Piece]]:
    """For each box (n x 4 x 2 quadrilaterals, clockwise from the top left, in the image's pixels) the x
    ranges of its pieces once fitted to the page's gutters: [(x0, x1)] as it is, more than one where it is
    split at a gutter, an end moved where it overhung one."""
    # mutation: ReplaceUnaryOperator_USub_Invert equivalent because numpy 2 infers a dimension given as any
    # negative size (-2 as -1).
    # mutation: NumberReplacer to `reshape(- 2` equivalent likewise.
    quads = np.asarray(quads, dtype=np.float64).reshape(-1, 4, 2)
    lines = _Lines(quads)
    found: list[list[Piece]] = [[(box.x0, box.x1)] for box in lines.quads]
    long = [i for i, box in enumerate(lines.quads) if _long(box)]
    if not long:
        return found  # nothing to fit: the page's pixels are not read
    page = _Page(ink_mask(image))
    for i in long:
        pieces = _fit(i, lines.quads[i], lines, page)
        if pieces is not None:
            found[i] = pieces
    return found


def _long(box: _Quad) -> bool:
    """Whether a box is long enough to hold a gutter: not a word, nor a line standing (a page turned
    sideways, read as sent), nor one under MIN_HEIGHT."""
    return box.h >= MIN_HEIGHT and box.x1 - box.x0 >= 2 * box.h


def _fit(i: int, box: _Quad, lines: _Lines, page: _Page) -> list[Piece] | None:
    """Box i's pieces fitted to the gutters its row shows, or None when it stays as it is."""
    h = box.h
    lo = max(0, int(np.floor(box.x0 - REACH * h)))  # the box and REACH h each side: its row's neighbours
    hi = min(page.width, int(np.ceil(box.x1 + REACH * h)))
    # mutation: ReplaceComparisonOperator_LtE_Lt equivalent because a scan of no columns (hi == lo) finds
    # no ink: None all the same.
    if hi <= lo:
        return None  # the box lies off the page: none of it to read
    xs = np.arange(lo, hi)
    centres = xs + 0.5
    row = lines.row(i, page)
    blank = row[lo + 1 : hi + 1] == row[lo:hi]
    inside = (centres >= box.x0) & (centres <= box.x1)
    ink = xs[inside & ~blank]
    if not len(ink):
        return None
    first, last = int(ink[0]), int(ink[-1])
    x0, x1 = box.x0, box.x1
    cuts: list[tuple[float, float]] = []
    # The runs, those reaching the ends of the scan too (as if ink lay just past it: an end next to a wide
    # blank, the next column's text beyond reach, is pulled back as well).
    for s, e in _runs(np.r_[False, blank, False]):
        start, end = lo + s - 1, lo + e - 1  # the blank columns start..end-1
        width, margin = end - start, MARGIN * h
        if width < GAP_MIN * h:
            continue
        # mutation: ReplaceComparisonOperator_Lt_LtE equivalent because first is an ink column and start a
        # blank one: never the same.
        if first < start and end <= last:
            where = "split"
        # mutation: ReplaceComparisonOperator_Gt_GtE equivalent because an end at exactly start + margin is
        # moved to where it is: nothing changes.
        elif start == last + 1 and x1 > start + margin:
            where = "right"
        # mutation: ReplaceComparisonOperator_Lt_LtE equivalent likewise.
        elif end == first and x0 < end - margin:
            where = "left"
        else:
            continue
        if not _confirmed(i, box, start, end, lines, page):
            continue
        if where == "split":
            cuts.append((start + margin, end - margin))
        elif where == "right":
            x1 = start + margin
        else:
            x0 = end - margin
    if not cuts and (x0, x1) == (box.x0, box.x1):
        return None
    edges = [x0, *(v for cut in cuts for v in cut), x1]
    return [(edges[k], edges[k + 1]) for k in range(0, len(edges), 2)]


def _confirmed(i: int, box: _Quad, start: int, end: int, lines: _Lines, page: _Page) -> bool:
    """Whether the blank columns start..end-1 across box i are a gutter: its middle CORE h wide, at the
    run's middle or at either end (EDGE h in), is blank in the nearest ROWS rows that count on one side of the
    box (above or below), at least MIN_ROWS of them."""
    h = box.h
    inset = (EDGE + CORE / 2) * h
    middle = (start + end) / 2
    # A run is at least GAP_MIN h = 2 inset wide (narrower ones are not looked at), where the three places
    # are its middle: more of them for narrower runs changes nothing.
    # mutation: ReplaceComparisonOperator_LtE_Lt equivalent because of that.
    # mutation: NumberReplacer to `1 * inset` equivalent because of that.
    # mutation: ReplaceBinaryOperator_Mul_Div equivalent because of that.
    # mutation: ReplaceBinaryOperator_Sub_Add to `end + start` equivalent because of that (never that small).
    anchors = [middle] if end - start <= 2 * inset else [start + inset, middle, end - inset]
    core, reach = CORE * h / 2, REACH * h
    mid = box.middle(middle)
    tilt = (box.top_slope + box.bottom_slope) / 2  # the page's lines run dy/dx; its verticals -dx/dy as much
    # The boxes within reach of the run, above and below, the nearest first; one per row (below).
    dys = lines.middles(middle) - mid
    near = np.flatnonzero(
        (lines.h > 0)
        & (lines.x0 <= end + core + reach)
        & (lines.x1 >= start - core - reach)
        & (np.abs(dys) >= 0.5 * h)
        & (np.abs(dys) <= WINDOW * h)
    )
    near = near[np.argsort(np.abs(dys[near]), kind="stable")]
    for centre in anchors:
        sides: dict[bool, list[bool]] = {True: [], False: []}  # below?: each counting row, blank or not
        seen: dict[bool, list[float]] = {True: [], False: []}
        for j in near.tolist():
            dy = float(dys[j])
            # mutation: ReplaceComparisonOperator_Gt equivalent because both sides are taken alike (either
            # may confirm) and |dy| >= 0.5 h keeps a row off the middle.
            # mutation: NumberReplacer equivalent likewise for boxes over 2 px tall (|dy| > 1 there).
            below = dy > 0
            rows = sides[below]
            if len(rows) >= ROWS or any(abs(dy - other) < 0.5 * h for other in seen[below]):
                continue
            seen[below].append(dy)
            row, at = lines.row(j, page), centre - tilt * dy
            # A column is where its centre (x + 0.5) is: the middle's columns first..last lie in [at - core,
            # at + core], the left side's in [at - core - reach, at - core), the right side's in (at + core,
            # at + core + reach].
            first, last = math.ceil(at - core - 0.5), math.floor(at + core - 0.5)
            if page.inked(row, first, last):
                rows.append(False)  # ink in the gutter's middle: this row crosses it
                continue
            # The sides are looked at once the middle is known blank: a side reaching into it (to first or
            # last, or one column over: the middle, CORE h of at least MIN_HEIGHT, spans two columns or more)
            # sees the same ink.
            # mutation: ReplaceBinaryOperator_Sub_Add to `first + 1` equivalent because of that.
            # mutation: NumberReplacer to `first - 0` equivalent likewise.
            left = page.inked(row, math.ceil(at - core - reach - 0.5), first - 1)
            # mutation: ReplaceBinaryOperator_Add_Sub to `last - 1` equivalent because of that.
            # mutation: NumberReplacer to `last + 0` equivalent likewise.
            right = page.inked(row, last + 1, math.floor(at + core + reach - 0.5))
            if left and right:
                rows.append(True)  # text both sides, blank between
        if any(len(rows) >= MIN_ROWS and all(rows) for rows in sides.values()):
            return True
    return False


def fitted_quads(quads: np.ndarray, pieces: list[list[Piece]]) -> tuple[np.ndarray, list[int]]:
    """The quadrilaterals of the boxes' pieces (gutter_pieces), each cut from its box along its top and
    bottom edges at the piece's x0 and x1, and for each the index of the box it came from."""
    # mutation: ReplaceUnaryOperator_USub_Invert equivalent because numpy 2 infers a dimension given as any
    # negative size (-2 as -1).
    # mutation: NumberReplacer to `reshape(- 2` equivalent likewise.
    quads = np.asarray(quads, dtype=np.float64).reshape(-1, 4, 2)
    out: list[np.ndarray] = []
    source: list[int] = []
    for i, (quad, found) in enumerate(zip(quads, pieces, strict=True)):
        # mutation: NumberReplacer to `found[ -1]` equivalent because the piece is found's only one.
        if len(found) == 1 and found[0] == (float(quad[:, 0].min()), float(quad[:, 0].max())):
            out.append(quad)
            source.append(i)
            continue
        tl, tr, br, bl = quad
        for x0, x1 in found:
            top, bottom = (_along(tl, tr, x0), _along(tl, tr, x1)), (_along(bl, br, x1), _along(bl, br, x0))
            out.append(np.stack([*top, *bottom]))
            source.append(i)
    # mutation: ReplaceUnaryOperator_USub_Invert equivalent because numpy 2 infers a dimension given as any
    # negative size (-2 as -1).
    # mutation: NumberReplacer to `reshape(- 2` equivalent likewise.
    return np.asarray(out, dtype=np.float64).reshape(-1, 4, 2), source


def _along(a: np.ndarray, b: np.ndarray, x: float) -> np.ndarray:
    """The point of the edge a-b at x (its end, for an x past it)."""
    t = 0.0 if b[0] == a[0] else min(1.0, max(0.0, (x - a[0]) / (b[0] - a[0])))
    return np.asarray(a + t * (b - a))
