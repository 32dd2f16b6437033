"""A page's layout from its line boxes alone: reading order (a recursive XY-cut) and blocks.

Engine-independent geometry: the rapidocr engine orders its detected lines with it and groups them into
blocks; any engine with line boxes can. Boxes are (x0, y0, x1, y1), in any unit (the engines pass them
normalised to the page, 0-1).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from .tables import Table, detached, table_cells, wide_runs

Box = tuple[float, float, float, float]
Span = tuple[float, float, int]  # x0, x1, lines: an interval of the x-axis that lines cover

# Thresholds, in median line heights (h): the median height of the page's line boxes is its body text
# size whatever the resolution or scan DPI, so these hold from a receipt photo to a 300 DPI magazine page.
# A gutter is at least 0.4 h of blank running the block's full height: magazine gutters are about one em
# (~0.7 h of a detector box, padding included), while inter-word spaces (~0.2 h) do not split a line's box,
# let alone on every line of a block at the same x.
GUTTER_MIN = 0.4
# A column next to a gutter is at least 6 h wide (~14 characters: a detector box's h is ~2.3 characters)
# and holds at least 2 lines: the text columns of a page are 25-40 characters wide, while the narrow side
# of what only looks like columns (a receipt's prices, a table's figures, a form's short labels) is a few
# characters: those stay rows.
COLUMN_MIN_WIDTH = 6.0
COLUMN_MIN_LINES = 2
# Two sides of a gutter whose rows pair up (80 % of them) are a table or a form (label: value) unless there
# are 3 rows or more and both sides read as prose: their rows are long (median at least 7 h, ~16
# characters: a table's cells, a form's labels and a receipt's prices are a few words or a figure) and fill
# their column (median row at least 70 % of its width), as the justified lines of text columns set on
# shared baselines do; a table's cells are short or ragged. A side's row is the union of its boxes on one
# baseline, since the detector may split a justified line into several boxes at its wide spaces. Two rows
# tell nothing: they are read as rows, as before. A table is read by rows.
TABLE_PAIRED = 0.8
TABLE_MIN_ROWS = 3
PROSE_MIN_WIDTH = 7.0
COLUMN_MIN_FILL = 0.7
# Noise (a speck, a bullet, a vertical rule, a stray character) neither bridges nor makes a gutter: a box
# under 0.6 h wide or 0.4 h tall is left out of the column geometry and follows the side its centre is on.
NOISE_MAX_WIDTH = 0.6
NOISE_MAX_HEIGHT = 0.4
MAX_DEPTH = 64  # cuts within cuts
# A running head over columns: the block's top band (its first line or the pieces of one, the left and right
# running heads) standing at least HEAD_GAP h above everything under it, which still has a gutter, is read
# first, as rows; cut with the columns, its pieces would be read with the column each lies over. Between a
# column's lines there is a fraction of h; the blank under a running head is a line or more.
HEAD_GAP = 1.0
# A section break: a blank at least SECTION_GAP h high across a block that has a gutter parts it before the
# gutter is cut, each part read in turn, top to bottom (an invoice's addresses over its item table, whose
# cells line up with the gutter between them; a story over the next). Between a column's lines there is a
# fraction of h, under a heading or between paragraphs a line or two: a blank of three lines is no column's.
SECTION_GAP = 3.0


def reading_order(boxes: list[Box]) -> list[int]:
    """Indices of boxes (x0, y0, x1, y1) in reading order (reading_groups, one after another)."""
    return [i for group in reading_groups(boxes) for i in group]


def reading_groups(boxes: list[Box]) -> list[list[int]]:
    """Indices of boxes (x0, y0, x1, y1) in reading order, by layout: a recursive XY-cut over the line boxes,
    as the groups it ends in (a column's run of lines, a band of rows), each group's lines as rows.

    A block of lines is cut vertically at a gutter: a blank strip at least GUTTER_MIN wide running the block's
    full height, with a column (COLUMN_MIN_WIDTH wide, COLUMN_MIN_LINES lines) on each side, and not between
    the cells of a table (see table()); unless a blank SECTION_GAP h high crosses the block: then it is parted
    there first, each part read in turn. The widest such gutter is cut first; the columns are read left to
    right, each recursively. A block without one is cut horizontally into bands (text separated by blank space
    across the block), read top to bottom; consecutive bands that keep a gutter between them (a column run;
    its lines need not be aligned across the gutter) are read as one block, recursively, so a full-width
    title, heading or footer, which crosses the gutter, ends the run and stays where it stands. What is left
    is read as rows (row_order), as before: a single-column page, a receipt's item and price, a table's cells
    come out row by row, left to right, exactly as a plain row sort gives them.

    Each level sorts its boxes by x and by y (numpy): O(n log n) a level, a few levels deep; 2000 lines
    take 3-7 ms (one column ~3, three ~5, a title over two ~7; the row sort alone: 1-2 ms).
    """
    n = len(boxes)
    # mutation: NumberReplacer to `if n < 1` equivalent because one box is read as its row either way.
    if n < 2:
        return [list(range(n))] if n else []
    x0s, y0s, x1s, y1s = np.asarray(boxes, dtype=np.float64).reshape(n, 4).T.copy()
    h = float(np.sort(y1s - y0s)[n // 2])
    if not h > 0:
        return [row_order(boxes, range(n))]
    gutter_min, col_width = GUTTER_MIN * h, COLUMN_MIN_WIDTH * h
    is_solid = (x1s - x0s >= NOISE_MAX_WIDTH * h) & (y1s - y0s >= NOISE_MAX_HEIGHT * h)
    solid = is_solid.tolist()

    def gutters(union: list[Span], lines: bool) -> list[tuple[float, float, Span, Span]]:
        """(width, x, left interval, right interval) of each gutter between the union's intervals, widest
        first; with `lines`, only those with enough lines each side (a run still growing is not counted)."""
        found = [
            (b[0] - a[1], (a[1] + b[0]) / 2, a, b)
            for a, b in itertools.pairwise(union)
            if b[0] - a[1] >= gutter_min
            and a[1] - a[0] >= col_width
            and b[1] - b[0] >= col_width
            and (not lines or (a[2] >= COLUMN_MIN_LINES and b[2] >= COLUMN_MIN_LINES))
        ]
        return sorted(found, reverse=True)

    def column_cut(block: list[int]) -> float | None:
        """The x at which to cut the block into columns, or None."""
        found = gutters(union(block), lines=True)
        if not found:
            return None
        ids = np.asarray(block)
        ids = ids[is_solid[ids]]
        for _, at, a, b in found:
            left = ids[(x0s[ids] >= a[0]) & (x1s[ids] <= a[1])]
            right = ids[(x0s[ids] >= b[0]) & (x1s[ids] <= b[1])]
            if not table(left, a, right, b):
                return at
        return None

    def side_rows(side: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(y0, y1, x0, x1) of the side's rows: boxes whose centres lie within half a line height of the
        one before (sorted by centre) are one row, the pieces of one printed line among them."""
        centre = (y0s[side] + y1s[side]) / 2
        ids = side[np.argsort(centre, kind="stable")]
        c = np.sort(centre)
        starts = np.flatnonzero(np.r_[True, np.diff(c) > 0.5 * h])
        return (
            np.minimum.reduceat(y0s[ids], starts),
            np.maximum.reduceat(y1s[ids], starts),
            np.minimum.reduceat(x0s[ids], starts),
            np.maximum.reduceat(x1s[ids], starts),
        )

    def table(left: np.ndarray, a: Span, right: np.ndarray, b: Span) -> bool:
        """Whether the lines each side of a gutter are a table's cells rather than two columns of text:
        their rows pair up (TABLE_PAIRED of them) and either are few (under TABLE_MIN_ROWS rows tell
        nothing) or one side does not read as prose (rows under PROSE_MIN_WIDTH, or under COLUMN_MIN_FILL
        of its width). Columns set on shared baselines pair up too, but their rows are long and fill them."""
        # mutation: ReplaceOrWithAnd equivalent because no side is ever empty: each interval of the union is
        # the span of solid boxes of the block, which lie within it.
        if not len(left) or not len(right):
            # mutation: ReplaceFalseWithTrue equivalent because never reached (see above).
            return False
        rows = [side_rows(left), side_rows(right)]
        # mutation: NumberReplacer to `r[ 1]` equivalent because a side's four arrays have one length.
        # mutation: NumberReplacer to `r[ -1]` equivalent likewise.
        few, many = sorted(rows, key=lambda r: len(r[0]))
        # Each row of the side with fewer rows, against the other side's row nearest its centre.
        centres = (many[0] + many[1]) / 2
        # The centres across are in order (each row's lies between its first and last box's), and a row
        # across whose centre lies within this row's height pairs with it (their overlap is at least half
        # the shorter's height, whichever is taller). Sought by this row's bottom instead of its centre, the
        # two candidates differ only when centres across lie from the centre to the bottom: then the last of
        # those is a candidate and pairs, and so does the centre's own candidate on that side, the first of
        # them. Likewise by its top.
        # mutation: NumberReplacer to `(few[ 1] + few[1])` equivalent because of that (the bottom).
        # mutation: NumberReplacer to `(few[0] + few[ 0])` equivalent because of that (the top).
        at = np.searchsorted(centres, (few[0] + few[1]) / 2)
        near = np.clip(np.stack([at - 1, at]), 0, len(centres) - 1)
        overlap = np.minimum(few[1], many[1][near]) - np.maximum(few[0], many[0][near])
        ok = overlap >= 0.5 * np.minimum(few[1] - few[0], many[1][near] - many[0][near])
        count = int(np.count_nonzero(ok.any(axis=0)))
        # mutation: NumberReplacer to `len(many[ 1])` equivalent because many's arrays have one length.
        # mutation: NumberReplacer to `len(many[ -1])` equivalent likewise.
        if count < TABLE_PAIRED * len(many[0]):
            return False
        if count < TABLE_MIN_ROWS:
            return True
        # mutation: ReplaceTrueWithFalse equivalent because two sides' rows go with two spans.
        for (_, _, r0, r1), span in zip(rows, (a, b), strict=True):
            width = float(np.median(r1 - r0))
            if width < PROSE_MIN_WIDTH * h or width < COLUMN_MIN_FILL * (span[1] - span[0]):
                return True
        return False

    # A solid box's span; noise has none (it follows the side its centre is on).
    # mutation: ReplaceTrueWithFalse equivalent because solid is made from boxes: the same length.
    spans: list[Span | None] = [(b[0], b[2], 1) if ok else None for b, ok in zip(boxes, solid, strict=True)]

    def span(i: int) -> Span:
        found = spans[i]
        assert found is not None  # asked of solid boxes only
        return found

    def union(idx: list[int]) -> list[Span]:
        # mutation: NumberReplacer to `len(idx) == 0` equivalent because one index then takes the way below,
        # to the same one span (none for noise); no block or band is empty.
        if len(idx) == 1:  # most bands: one line
            # mutation: NumberReplacer to `solid[idx[ -1]]` equivalent because idx holds one index here.
            # mutation: NumberReplacer to `span(idx[ -1])` equivalent because idx holds one index here.
            # mutation: NumberReplacer to `span(idx[ 1])` equivalent because a solid line's span is taken
            # directly (see unions below): the union of one line is asked of noise only.
            return [span(idx[0])] if solid[idx[0]] else []
        # mutation: ReplaceComparisonOperator_Lt equivalent because both ways give the same intervals (the
        # numpy way is for speed): a span starting where the last one reaches joins it in both.
        # mutation: AddNot equivalent likewise.
        # mutation: NumberReplacer equivalent likewise.
        if len(idx) < 32:
            return _union(sorted([span(i) for i in idx if solid[i]]))
        # A block: the same with numpy. An interval starts where a span begins right of all before it.
        ids = np.asarray(idx)
        ids = ids[is_solid[ids]]
        if not len(ids):
            return []
        ids = ids[np.argsort(x0s[ids], kind="stable")]
        reach = np.maximum.accumulate(x1s[ids])
        starts = np.flatnonzero(np.r_[True, x0s[ids][1:] > reach[:-1]])
        ends = np.r_[starts[1:], len(ids)]
        return list(
            # mutation: ReplaceTrueWithFalse equivalent because the three lists are as long as each other.
            zip(x0s[ids][starts].tolist(), reach[ends - 1].tolist(), (ends - starts).tolist(), strict=True)
        )

    def bands_of(block: list[int]) -> tuple[list[list[int]], bool]:
        """The block's lines in bands top to bottom (a band ends where a blank strip crosses the whole
        block), and whether each band is one line lying under the one above (no gutter can be there)."""
        ids = np.asarray(block)
        ids = ids[np.argsort(y0s[ids], kind="stable")]
        bottom = np.maximum.accumulate(y1s[ids])
        starts = np.flatnonzero(np.r_[True, y0s[ids][1:] >= bottom[:-1]])
        ends = np.r_[starts[1:], len(ids)]
        first = ids[starts]
        # `stacked` is a shortcut: the runs below read a line under a line all the way as rows too, so a
        # mutant that only makes it false more often changes nothing.
        # mutation: ReplaceBinaryOperator_Sub_Add equivalent because then only the first band is single: the
        # shortcut is never taken.
        # mutation: NumberReplacer to `ends - starts == 0` equivalent likewise: no band is single.
        single = (ends - starts == 1) & is_solid[first]
        lo, hi = x0s[first], x1s[first]
        # mutation: ReplaceComparisonOperator_LtE_Lt equivalent because touching lines are then not stacked:
        # the shortcut is not taken, and the runs merge touching spans into one (no gutter): rows.
        # mutation: ReplaceUnaryOperator_Delete_USub to `single[:1] & single[1:]` equivalent because single[0]
        # and single[1:] together are every band, as single[:-1] and single[1:] are.
        # mutation: ReplaceUnaryOperator_USub_UAdd to `single[:+1] & single[1:]` equivalent as single[:1].
        stacked = bool(np.all(single[:-1] & single[1:] & (lo[:-1] <= hi[1:]) & (lo[1:] <= hi[:-1])))
        order = ids.tolist()
        # mutation: ReplaceTrueWithFalse equivalent because ends is as long as starts.
        return [order[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)], stacked

    def running_head(block: list[int]) -> list[int]:
        """The block's top band if it is one row HEAD_GAP h above the rest (see HEAD_GAP), else []."""
        ids = np.asarray(block)
        ids = ids[np.argsort(y0s[ids], kind="stable")]
        bottom = np.maximum.accumulate(y1s[ids])
        # mutation: ReplaceComparisonOperator_GtE_Gt equivalent because a box starting at the band's bottom
        # has its middle under the band's first box: the band so grown is no one row, no head either way.
        starts = np.flatnonzero(np.r_[False, y0s[ids][1:] >= bottom[:-1]])
        if not len(starts):
            return []
        end = int(starts[0])
        head: list[int] = ids[:end].tolist()
        if y0s[ids[end]] - bottom[end - 1] < HEAD_GAP * h or len(line_rows(boxes, head)) != 1:
            return []
        return head

    def sections(block: list[int]) -> list[list[int]]:
        """The block parted at each blank across it at least SECTION_GAP h high, top to bottom."""
        ids = np.asarray(block)
        ids = ids[np.argsort(y0s[ids], kind="stable")]
        bottom = np.maximum.accumulate(y1s[ids])
        cuts = np.flatnonzero(y0s[ids][1:] - bottom[:-1] >= SECTION_GAP * h) + 1
        return [part.tolist() for part in np.split(ids, cuts)]

    def rows_of(block: list[int]) -> list[list[int]]:
        return [row_order(boxes, block)] if block else []

    def order(block: list[int], depth: int = 0) -> list[list[int]]:
        # mutation: NumberReplacer to `len(block) < 1` equivalent because a one-line block is one band: rows.
        # mutation: NumberReplacer to `len(block) < 3` equivalent because two lines make no two columns of
        # two lines: one band or two, they are read as rows, one group, either way.
        # mutation: ReplaceComparisonOperator_Lt_LtE to `len(block) <= 2` equivalent likewise.
        if len(block) < 2 or depth > MAX_DEPTH:  # (no real page nests so deep: a guard, read as rows)
            return rows_of(block)
        cut = column_cut(block)
        if cut is not None:
            parts = sections(block)
            if len(parts) > 1:
                return [group for part in parts for group in order(part, depth + 1)]
            head = running_head(block)
            if head:
                taken = set(head)
                rest = [i for i in block if i not in taken]
                if column_cut(rest) is not None:
                    return rows_of(head) + order(rest, depth + 1)
            left = [i for i in block if boxes[i][0] + boxes[i][2] < 2 * cut]
            right = [i for i in block if boxes[i][0] + boxes[i][2] >= 2 * cut]
            return order(left, depth + 1) + order(right, depth + 1)
        bands, all_stacked = bands_of(block)
        # mutation: NumberReplacer to `len(bands) == 0` equivalent because one band is one run, read as rows
        # (or, with a gutter and rows, recursed into until the depth guard reads it as rows): one group.
        # mutation: ReplaceOrWithAnd equivalent likewise (and the stacked shortcut's, see bands_of).
        if len(bands) == 1 or all_stacked:  # one band, or a line under a line all the way: rows
            return rows_of(block)
        # mutation: NumberReplacer to `b[ -1]` equivalent because b holds one line there.
        # mutation: NumberReplacer to `len(b) == 0 and` equivalent because union() of one line is its span.
        unions = [[span(b[0])] if len(b) == 1 and solid[b[0]] else union(b) for b in bands]
        # Two bands each one span, overlapping (a line under a line, the bulk of a page): no gutter between.
        # It only spares a merge whose union is one span, so one that says "not stacked" of overlapping or
        # touching spans changes nothing (the merge is one span: no gutter, a new run).
        stacked = [
            # mutation: ReplaceComparisonOperator_LtE_Lt equivalent because of touching spans (see above).
            # mutation: NumberReplacer to `a[0][0] <= b[0][ 0]` equivalent because then b starts within a.
            # mutation: NumberReplacer to `b[ -1][0]` equivalent because b holds one span.
            # mutation: NumberReplacer to `b[0][ 1] <= a[0][1]` equivalent because then b ends within a.
            # mutation: NumberReplacer to `<= a[ -1][1]` equivalent because a holds one span.
            # mutation: NumberReplacer to `<= b[ -1][1]` equivalent because b holds one span.
            # mutation: NumberReplacer to `a[ -1][0] <=` equivalent because a holds one span.
            # mutation: NumberReplacer to `len(a) == 0 == len(b)` equivalent: never stacked (see above).
            # mutation: NumberReplacer to `a[0][ 1] <= b[0][1]` equivalent because then a ends within b.
            # mutation: NumberReplacer to `b[0][0] <= a[0][ 0]` equivalent because then a starts within b.
            len(a) == 1 == len(b) and a[0][0] <= b[0][1] and b[0][0] <= a[0][1]
            for a, b in itertools.pairwise(unions)
        ]
        # Runs of bands that keep a gutter (lines not counted yet: a run grows a line a side at a time).
        runs: list[tuple[list[int], int, list[Span]]] = []
        run, count, run_union = list(bands[0]), 1, unions[0]
        for k in range(1, len(bands)):
            band, band_union = bands[k], unions[k]
            # mutation: ReplaceComparisonOperator_LtE_Lt equivalent because a band not counted within the
            # run's columns here is merged below: the same intervals, the same gutter, the run goes on.
            # mutation: NumberReplacer to `count > 2` equivalent likewise (a run of 2 bands has its gutter).
            # mutation: NumberReplacer to `any(u[ 1] <= s[0]` equivalent likewise: never within.
            # mutation: NumberReplacer to `s[1] <= u[ 0]` equivalent likewise: never within.
            if count > 1 and all(any(u[0] <= s[0] and s[1] <= u[1] for u in run_union) for s in band_union):
                run += band  # the band's lines lie within the run's columns: the gutter goes on
                # mutation: NumberReplacer equivalent because count is 2 or more here and only ever compared
                # with 1.
                count += 1
                continue
            merged = None
            # mutation: ReplaceComparisonOperator_Gt_GtE equivalent because merging two stacked spans (count
            # 1) gives one span: no gutter, a new run, as without the merge.
            # mutation: NumberReplacer to `count > 0` equivalent likewise.
            if count > 1 or not stacked[k - 1]:
                merged = _union(sorted(run_union + band_union))
            if merged is not None and gutters(merged, lines=False):
                run += band
                # mutation: NumberReplacer to `count + 2` equivalent because count is only compared with 1.
                count, run_union = count + 1, merged
            else:
                runs.append((run, count, run_union))
                run, count, run_union = list(band), 1, band_union
        runs.append((run, count, run_union))
        if len(runs) == 1:  # one run, yet no gutter with enough lines: its bands one by one
            # mutation: ReplaceTrueWithFalse equivalent because each band has its union.
            runs = [(band, 1, u) for band, u in zip(bands, unions, strict=True)]
        out: list[list[int]] = []
        rows: list[int] = []  # consecutive bands without a gutter: rows, sorted together
        for run, count, run_union in runs:
            if count == 1 and (
                # mutation: NumberReplacer to `len(run_union) < 1` equivalent because one interval has
                # no gutter.
                len(run_union) < 2 or not gutters(run_union, lines=False) or len(line_rows(boxes, run)) == 1
            ):
                rows += run  # no gutter, or one row of boxes (a line the detector split at wide spaces)
            else:
                out += rows_of(rows) + order(run, depth + 1)
                rows = []
        return out + rows_of(rows)

    return order(list(range(n)))


def _union(intervals: list[Span]) -> list[Span]:
    """Overlapping (x0, x1, lines) intervals (sorted by x0) merged, their lines added up."""
    out: list[Span] = []
    for span in intervals:
        if out and span[0] <= out[-1][1]:
            x0, x1, k = out[-1]
            out[-1] = (x0, max(x1, span[1]), k + span[2])
        else:
            out.append(span)
    return out


def row_order(boxes: list[Box], block: Iterable[int]) -> list[int]:
    """Indices of the block's boxes as rows top to bottom, left to right within a row."""
    return [i for row in line_rows(boxes, block) for i in row]


def line_rows(boxes: list[Box], block: Iterable[int]) -> list[list[int]]:
    """The block's boxes as rows top to bottom, each left to right.

    A box joins the current row when its vertical centre lies within the row's first box, so
    slightly skewed lines of one row stay together.
    """
    found: list[list[int]] = []
    for i in sorted(block, key=lambda i: (boxes[i][1], boxes[i][0])):
        centre = (boxes[i][1] + boxes[i][3]) / 2
        if found:
            anchor = boxes[found[-1][0]]
            if anchor[1] <= centre <= anchor[3]:
                found[-1].append(i)
                continue
        found.append([i])
    # mutation: NumberReplacer to `len(row) == 0` equivalent because sorting a row of one box keeps it.
    return [row if len(row) == 1 else sorted(row, key=lambda j: boxes[j][0]) for row in found]


# Blocks. Each group the XY-cut ends in (a column's run, a band of rows across the page) is split into
# paragraphs where the blank between two rows exceeds the group's line spacing (the median blank between
# its rows; SPACING h, single spacing, when it has only two) by PARAGRAPH_GAP median line heights (an empty
# line, a heading's margin), or where the text size changes (a heading over its paragraph).
PARAGRAPH_GAP = 0.8
SPACING = 0.4
# A block whose rows are TITLE_HEIGHT times the page's median line height or taller, and that has at most
# TITLE_MAX_ROWS rows, is a title: a heading set larger than the body.
TITLE_HEIGHT = 1.3
TITLE_MAX_ROWS = 3
# A group of at least TABLE_MIN_ROWS rows of which TABLE_CELL_SHARE hold two cells or more (lines side by
# side that the XY-cut kept as rows: table cells, a receipt's item and price) is one table block. Boxes of a
# row less than CELL_GAP h apart are one cell: the pieces of a line the detector split at wide spaces.
TABLE_CELL_SHARE = 0.5
CELL_GAP = 1.0
# A header (footer) is a block of at most MARGIN_MAX_ROWS body-size rows lying within the top (bottom)
# MARGIN_BAND of the page, above (below) every other block: a running head, a page number.
MARGIN_BAND = 0.1
MARGIN_MAX_ROWS = 2


@dataclass
class Block:
    type: str  # text, title, table, header, footer
    bbox: Box  # the union of its lines' boxes
    lines: list[int]  # indices of its boxes, in reading order
    table: Table | None = None  # a table's rows and cells (tables.py); its lines are read cell by cell


def page_layout(boxes: list[Box], page_height: float = 1.0, upright: list[Box] | None = None) -> list[Block]:
    """The page's blocks in reading order; their lines, one block after another, are reading_order(boxes),
    but for a table's, read cell by cell (tables.py: rows found as its grid has them).

    With `upright` (the same lines' boxes on the page deskewed, see deskewed()), the order and the blocks
    come from those, while each block's bbox stays the union of its lines' `boxes`: the page as sent."""
    sent = boxes
    if upright is not None:
        assert len(upright) == len(boxes)
        boxes = upright
    groups = reading_groups(boxes)
    if not groups:
        return []
    heights = np.asarray([b[3] - b[1] for b in boxes], dtype=np.float64)
    h = float(np.sort(heights)[len(heights) // 2])

    def tall(row: list[int]) -> bool:
        return h > 0 and max(heights[i] for i in row) >= TITLE_HEIGHT * h

    def cells(row: list[int]) -> int:  # the row's boxes left to right, those under CELL_GAP h apart as one
        return 1 + sum(boxes[j][0] - boxes[i][2] >= CELL_GAP * h for i, j in itertools.pairwise(row))

    def block(kind: str, row_list: list[list[int]]) -> Block:
        ids = [i for row in row_list for i in row]
        bbox = (
            min(boxes[i][0] for i in ids),
            min(boxes[i][1] for i in ids),
            max(boxes[i][2] for i in ids),
            max(boxes[i][3] for i in ids),
        )
        return Block(kind, bbox, ids)

    def table_like(rows: list[list[int]]) -> bool:
        return len(rows) >= TABLE_MIN_ROWS and sum(cells(r) > 1 for r in rows) >= TABLE_CELL_SHARE * len(rows)

    out: list[Block] = []
    for group in groups:
        rows = line_rows(boxes, group)
        if table_like(rows):
            # Its wide rows (notes over, under or between tables) part it; a part of a table's rows is one.
            for wide, run in wide_runs(boxes, group):
                ids = [i for row in run for i in row]
                if wide or not table_like(line_rows(boxes, ids)):
                    titled = not wide and len(run) <= TITLE_MAX_ROWS and all(tall(r) for r in run)
                    out.append(block("title" if titled else "text", run))
                    continue
                found = table_cells(boxes, ids)
                head, tail = detached(boxes, found)
                if head or tail:  # a title over the table, a page number under it: blocks of their own
                    rows_of = [
                        [i for c in found.cells if c.row == r for i in c.lines] for r in range(found.rows)
                    ]
                    out += [block("text", [row]) for row in rows_of[:head]]
                    found = table_cells(boxes, [i for row in rows_of[head : found.rows - tail] for i in row])
                out.append(block("table", [found.order()]))
                out[-1].table = found
                if tail:
                    out += [block("text", [row]) for row in rows_of[found.rows + head :]]
            continue
        tops = [min(boxes[i][1] for i in r) for r in rows]
        bottoms = [max(boxes[i][3] for i in r) for r in rows]
        gaps = [top - bottom for top, bottom in zip(tops[1:], bottoms, strict=False)]
        # The group's own line spacing (single, double) is no break: a gap PARAGRAPH_GAP h wider than it is.
        spacing = float(np.median(gaps)) if len(gaps) > 1 else SPACING * h
        paragraphs = [[rows[0]]]
        for k in range(1, len(rows)):
            if gaps[k - 1] > spacing + PARAGRAPH_GAP * h or tall(rows[k]) != tall(rows[k - 1]):
                paragraphs.append([])
            paragraphs[-1].append(rows[k])
        for para in paragraphs:
            titled = len(para) <= TITLE_MAX_ROWS and all(tall(r) for r in para)
            out.append(block("title" if titled else "text", para))
    if len(out) > 1:
        first, last = out[0], out[-1]
        top = min(b.bbox[1] for b in out[1:])
        if _margin(first, boxes, tall) and first.bbox[3] <= min(MARGIN_BAND * page_height, top):
            first.type = "header"
        bottom = max(b.bbox[3] for b in out[:-1])
        if _margin(last, boxes, tall) and last.bbox[1] >= max((1 - MARGIN_BAND) * page_height, bottom):
            last.type = "footer"
    if upright is not None:  # the blocks found upright, their boxes on the page as sent
        for b in out:
            b.bbox = _union_box(sent, b.lines)
            for cell in b.table.cells if b.table else ():
                cell.bbox = _union_box(sent, cell.lines)
    return out


def _union_box(boxes: list[Box], ids: list[int]) -> Box:
    return (
        min(boxes[i][0] for i in ids),
        min(boxes[i][1] for i in ids),
        max(boxes[i][2] for i in ids),
        max(boxes[i][3] for i in ids),
    )


def _margin(b: Block, boxes: list[Box], tall: Callable[[list[int]], bool]) -> bool:
    """Whether a block could be a running head or foot: a short one of body-size text."""
    rows = line_rows(boxes, b.lines)
    return b.type == "text" and len(rows) <= MARGIN_MAX_ROWS and not any(tall(r) for r in rows)


# Deskew. A scanned page is often tilted by a degree or two; over a 2000 px column that drift is the
# whole gutter, so no blank strip runs a column's height and the XY-cut reads across the columns. The
# detector's line polygons are slanted with the page: the page's tilt is the median angle of the top and
# bottom edges of its long lines, those at least SKEW_LINE_LENGTH line heights long (~14 characters: a
# text line, a table's longer cells; shorter boxes, a page number, a figure, a stray character, give their
# edges' angle only to a pixel or two over their length, a degree or more off). It is trusted on at least
# SKEW_MIN_LINES long lines of which SKEW_AGREE agree with the median to within SKEW_TOLERANCE degrees (the
# lines of a scanned page share its tilt to a few tenths of a degree; mixed angles are a collage, curved
# text or noise: not turned). Under SKEW_FLOOR degrees the page is read as it is (a 2000 px column drifts
# by ~3 px); over SKEW_MAX degrees too, as before deskew: larger angles are photographs or inserts set at
# an angle, not a scanner's tilt. On the dev set (bench/devset.py, its tables tilted like its text) 6 h
# also levels its unruled tables, which 8 h leaves out; no page reads worse.
SKEW_LINE_LENGTH = 6.0
SKEW_MIN_LINES = 5
SKEW_AGREE = 0.6
SKEW_TOLERANCE = 0.5
SKEW_FLOOR = 0.1
SKEW_MAX = 5.0


def page_skew(polygons: np.ndarray) -> float:
    """The page's tilt in degrees (positive: its lines descend to the right, in image coordinates, y
    down), from the detector's line polygons (n, 4, 2: top-left, top-right, bottom-right, bottom-left);
    0 when there are too few long lines, when they disagree, or when it is under SKEW_FLOOR or over
    SKEW_MAX (read as it is)."""
    quads = np.asarray(polygons, dtype=np.float64)
    if quads.ndim != 3 or quads.shape[1:] != (4, 2) or len(quads) < SKEW_MIN_LINES:
        return 0.0
    top, bottom = quads[:, 1] - quads[:, 0], quads[:, 2] - quads[:, 3]
    length = (np.hypot(top[:, 0], top[:, 1]) + np.hypot(bottom[:, 0], bottom[:, 1])) / 2
    height = (np.hypot(*(quads[:, 3] - quads[:, 0]).T) + np.hypot(*(quads[:, 2] - quads[:, 1]).T)) / 2
    h = float(np.median(height))
    long = (length >= SKEW_LINE_LENGTH * h) & (top[:, 0] > 0) & (bottom[:, 0] > 0)
    if not h > 0 or np.count_nonzero(long) < SKEW_MIN_LINES:
        return 0.0
    angles = np.degrees(
        np.r_[np.arctan2(top[long, 1], top[long, 0]), np.arctan2(bottom[long, 1], bottom[long, 0])]
    )
    angle = float(np.median(angles))
    if np.count_nonzero(np.abs(angles - angle) <= SKEW_TOLERANCE) < SKEW_AGREE * len(angles):
        return 0.0
    angle = round(angle, 2)  # to a hundredth of a degree: the limits hold as written
    return angle if SKEW_FLOOR < abs(angle) <= SKEW_MAX else 0.0


def deskewed(polygons: np.ndarray, angle: float, centre: tuple[float, float]) -> list[Box]:
    """The axis-aligned boxes of the polygons turned by -angle degrees about the centre: the page upright,
    for the layout to order and group its lines; the boxes given back stay those of the page as sent."""
    # mutation: NumberReplacer to `reshape(- 2, 4, 2)` equivalent because numpy (2.3) takes any negative
    # size as the one it works out.
    # mutation: ReplaceUnaryOperator_USub_Invert equivalent likewise (~1 is -2).
    quads = np.asarray(polygons, dtype=np.float64).reshape(-1, 4, 2)
    a = np.radians(-angle)
    c, s = np.cos(a), np.sin(a)
    x, y = quads[..., 0] - centre[0], quads[..., 1] - centre[1]
    xs, ys = c * x - s * y + centre[0], s * x + c * y + centre[1]
    return list(
        # mutation: ReplaceTrueWithFalse equivalent because the four lists are as long as each other.
        zip(xs.min(1).tolist(), ys.min(1).tolist(), xs.max(1).tolist(), ys.max(1).tolist(), strict=True)
    )
