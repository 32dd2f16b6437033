"""A table block's rows and cells, from its line boxes alone (alignment; engine-independent geometry, like
ocr_app/engines/layout.py, which finds the table blocks).

Rows: the boxes sorted by their vertical centres; a box whose centre lies more than ROW_GAP of the table's
median line height (h) below the running mean of the current row's centres starts a new row. A page read
upright (deskewed) keeps a row's centres within a few tenths of h of each other, while the rows of the
densest real tables are a line height or more apart.

Columns: a table's columns are separated by vertical strips that (almost) no row crosses. For every x, the
number of rows with a box over it is counted; a separator is a run at least SEPARATOR_MIN h wide where at most
SPAN_SHARE of the rows cross (a spanning head, a title over the table), and the columns are what lies between
separators. A box belongs to the columns between the separators left and right of it: one, or several for a
spanning cell (it crosses a separator's middle). Boxes of one row whose columns meet are one cell, their text
joined left to right (the detector may split a cell's words at a wide space).

A row label wrapped onto a second line (a turnover: "Murder and nonnegligent" over "manslaughter ....",
the figures on the label's last line, as statistical tables set them) is one row: a row whose only cell is
in the first column joins the row under it (at most TURNOVER_PITCH times the table's usual row pitch
below) when that row has cells in other columns, its first cell starts at least INDENT h right of the
lone line (a turnover is indented), and the row after it (if any) starts at least INDENT h left of that
(back out: the indented line ended the label; a heading over a list of indented rows is not joined).
The cell's lines are read line by line, its box their union.

A head wrapped onto several lines ("Under 18" over "years", "American" over "Indian/Alaskan" over "Native")
is one row, each cell's text its lines top to bottom. The rows follow one another at the table's usual
pitch, a cell's wrapped lines at about the same (the font's leading), while the rule under the head (and
under a head spanning columns, over the heads it spans) leaves a wider gap: the body starts under the first
gap wider than HEAD_PITCH times the pitch, within HEAD_MAX_LINES lines, that MIN_BODY_ROWS rows at the
pitch follow, and the lines above it are the head: those at the pitch of the line above join its row, a
line under a wider gap starts one. A line with a cell in every column is a body row, not a head's (no head
is joined then). What the pitch cannot tell: body rows set at the pitch between the head's rule and a wider
blank (a group's) within HEAD_MAX_LINES lines, none of them full, would be read as a wrapped head.

Noise (a box under NOISE_MAX_WIDTH h wide: a bullet, a stray mark, a piece of a vertical rule) is not
counted over the x-axis, so that it cannot split a separator.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Box = tuple[float, float, float, float]

ROW_GAP = 0.5
# A first or last row with few cells (under half the columns, at most 2 more than one) standing apart from
# the rest (a blank above or below it DETACHED times the table's median blank between rows, and at least
# DETACHED_MIN h more than it) is not the table's: a title over it, a note or a page number under it.
DETACHED = 2.0
DETACHED_MIN = 0.4
# The rows of a table block that are one line each, at least WIDE_SHARE of the block's width (a headnote over
# the table, its footnotes, the notes between two tables set one under the other: prose run across the
# columns), are not a table's; counted as rows, they would cross every separator (SPAN_SHARE), and two tables
# with their own columns would be read on one grid. They part the block (layout.page_layout).
WIDE_SHARE = 0.5
# The columns are placed by the rows with cells side by side where there are at least MIN_BODY_ROWS of them.
MIN_BODY_ROWS = 3
SEPARATOR_MIN = 0.3
SPAN_SHARE = 0.15
NOISE_MAX_WIDTH = 0.6
PADDING = 0.15
GRID = 20  # x-axis steps per h
# A turnover's indent, at least: on the census table (bench/devset.yaml) a turnover starts 0.2-0.5 h right
# of its first line and the next label 0.2-0.6 h left of it, while the labels of one level start within
# 0.1 h of each other (the detector's boxes).
INDENT = 0.15
TURNOVER_PITCH = 1.5
# A head on several lines (see the module's doc): the rows are spaced at the table's usual pitch (the median
# between rows' centres), a head's wrapped lines at about the same (the font's leading), while a rule under a
# head row or under the head leaves a wider gap: more than HEAD_PITCH times the pitch. The head takes at most
# HEAD_MAX_LINES printed lines, the body under it at least MIN_BODY_ROWS rows at the usual pitch.
HEAD_PITCH = 1.2
HEAD_MAX_LINES = 4
# A last row with few cells (as DETACHED) whose line lies TAIL_PITCH times the usual pitch or more below the
# row above it is not the table's (a footnote under its closing rule), even where the detector's boxes are
# taller than the pitch and leave no blank between rows to measure.
TAIL_PITCH = 1.3


@dataclass
class Cell:
    row: int  # 0-based
    column: int  # 0-based, the leftmost column it covers
    row_span: int
    column_span: int
    lines: list[int]  # indices of its boxes, line by line, left to right
    bbox: Box


@dataclass
class Table:
    rows: int
    columns: int
    cells: list[Cell]  # row by row, left to right

    def order(self) -> list[int]:
        """The table's boxes row by row, cell by cell: its reading order."""
        return [i for cell in self.cells for i in cell.lines]


def table_cells(boxes: Sequence[Box], ids: Sequence[int]) -> Table:
    """The rows and cells of the table whose boxes are `ids` (indices into `boxes`, any order)."""
    if not ids:
        return Table(0, 0, [])
    idx = np.asarray(ids)
    b = np.asarray([boxes[i] for i in ids], dtype=np.float64).reshape(-1, 4)
    x0, y0, x1, y1 = b.T
    h = float(np.median(y1 - y0))
    if not h > 0:
        h = 1.0
    rows = _rows((y0 + y1) / 2, h)
    starts, ends = _separators(x0, x1, rows, h)
    # Column k lies between separator k-1's end and separator k's start. A box belongs to the columns whose
    # extent it overlaps: one, or several for a spanning cell; a box within a separator (a head narrower
    # than the gap, a page number under the table) to the column nearest its middle.
    lo_edge = np.r_[-np.inf, ends]
    hi_edge = np.r_[starts, np.inf]
    middle = (x0 + x1) / 2
    nearest = np.searchsorted((starts + ends) / 2, middle)
    first = np.empty(len(b), dtype=np.int64)
    last = np.empty(len(b), dtype=np.int64)
    for k in range(len(b)):
        over = np.flatnonzero((x0[k] < hi_edge) & (x1[k] > lo_edge))
        first[k], last[k] = (over[0], over[-1]) if len(over) else (nearest[k], nearest[k])
    line = np.empty(len(b), dtype=np.int64)  # each box's printed line (its row before turnovers join)
    for r, members in enumerate(rows):
        line[members] = r
    head, body = _heads(rows, (y0 + y1) / 2, first, last, len(starts) + 1)
    rows = head + _turnovers(body, x0, (y0 + y1) / 2, first, last, h)
    cells: list[Cell] = []
    for r, members in enumerate(rows):
        members = sorted(members, key=lambda k: (first[k], x0[k]))
        group: list[int] = []
        for k in members:
            if group and first[k] <= max(last[g] for g in group):
                group.append(k)
                continue
            if group:
                cells.append(_cell(r, group, idx, b, first, last, line))
            group = [k]
        cells.append(_cell(r, group, idx, b, first, last, line))
    return Table(len(rows), len(starts) + 1, cells)


def wide_runs(boxes: Sequence[Box], ids: Sequence[int]) -> list[tuple[bool, list[list[int]]]]:
    """The block's rows top to bottom in runs, as (wide, rows): rows of one wide line each (WIDE_SHARE of the
    block's width: a headnote over a table, its footnotes, the notes between two tables, prose run across the
    columns), and runs of the others (a table's rows; a title between two tables). Each row is a list of
    indices into `boxes`, left to right."""
    if not ids:
        return []
    b = np.asarray([boxes[i] for i in ids], dtype=np.float64).reshape(-1, 4)
    h = float(np.median(b[:, 3] - b[:, 1]))
    rows = [
        sorted((ids[k] for k in row), key=lambda i: boxes[i][0])
        for row in _rows((b[:, 1] + b[:, 3]) / 2, h if h > 0 else 1.0)
    ]
    left, right = float(b[:, 0].min()), float(b[:, 2].max())
    out: list[tuple[bool, list[list[int]]]] = []
    for row in rows:
        wide = len(row) == 1 and boxes[row[0]][2] - boxes[row[0]][0] >= WIDE_SHARE * (right - left)
        if out and out[-1][0] == wide:
            out[-1][1].append(row)
        else:
            out.append((wide, [row]))
    return out


def detached(boxes: Sequence[Box], table: Table) -> tuple[int, int]:
    """How many of the table's first and last rows stand apart from it (see DETACHED)."""
    if table.rows < 4:
        return 0, 0
    tops = [min(boxes[i][1] for c in table.cells if c.row == r for i in c.lines) for r in range(table.rows)]
    bottoms = [
        max(boxes[i][3] for c in table.cells if c.row == r for i in c.lines) for r in range(table.rows)
    ]
    per_row = [sum(c.row == r for c in table.cells) for r in range(table.rows)]
    gaps = [max(0.0, t - b) for t, b in zip(tops[1:], bottoms, strict=False)]
    heights = sorted(b - t for t, b in zip(tops, bottoms, strict=True))
    h, usual = heights[len(heights) // 2], sorted(gaps)[len(gaps) // 2]
    few = max(2, table.columns // 2)

    # Each row's printed lines' centres, for the pitch (the detector's boxes may overlap between rows).
    centres = [
        sorted({(boxes[i][1] + boxes[i][3]) / 2 for c in table.cells if c.row == r for i in c.lines})
        for r in range(table.rows)
    ]
    pitches = [below[0] - above[-1] for above, below in itertools.pairwise(centres)]
    pitch = sorted(pitches)[len(pitches) // 2]

    def apart(gap: float, r: int) -> bool:
        return per_row[r] < few and gap >= DETACHED * usual and gap >= usual + DETACHED_MIN * h

    head = 0
    while head < table.rows - 3 and apart(gaps[head], head):
        head += 1
    tail = 0
    while tail < table.rows - 3 - head and (
        apart(gaps[-1 - tail], table.rows - 1 - tail)
        or (per_row[-1 - tail] < few and pitches[-1 - tail] >= TAIL_PITCH * pitch)
    ):
        tail += 1
    return head, tail


def _rows(centre: np.ndarray, h: float) -> list[list[int]]:
    """Positions (into the table's boxes) grouped in rows top to bottom."""
    out: list[list[int]] = []
    total = 0.0
    for k in np.argsort(centre, kind="stable").tolist():
        c = float(centre[k])
        if out and c - total / len(out[-1]) <= ROW_GAP * h:
            out[-1].append(k)
            total += c
        else:
            out.append([k])
            total = c
    return out


def _heads(
    rows: list[list[int]], centre: np.ndarray, first: np.ndarray, last: np.ndarray, columns: int
) -> tuple[list[list[int]], list[list[int]]]:
    """The head's rows (each wrapped head's lines joined, see the module's doc) and the body's rows."""
    if len(rows) < 2 + MIN_BODY_ROWS:
        return [], rows
    gaps = np.diff([float(np.mean(centre[m])) for m in rows])
    usual = gaps <= HEAD_PITCH * float(np.median(gaps))

    def cols(m: list[int]) -> set[int]:
        return {c for k in m for c in range(int(first[k]), int(last[k]) + 1)}

    # The body starts under the first wide gap (a rule) within HEAD_MAX_LINES lines that MIN_BODY_ROWS rows
    # at the usual pitch follow; a head line with a cell in every column is a body row (no head is found).
    for n in range(2, min(HEAD_MAX_LINES, len(rows) - 1 - MIN_BODY_ROWS) + 1):
        if not usual[n - 1] and usual[n : n + MIN_BODY_ROWS].all():
            break
    else:
        return [], rows
    if any(len(cols(m)) >= columns for m in rows[:n]):
        return [], rows
    head = [list(rows[0])]
    for r in range(1, n):
        if usual[r - 1]:
            head[-1] += rows[r]
        else:
            head.append(list(rows[r]))
    return head, rows[n:]


def _turnovers(
    rows: list[list[int]], x0: np.ndarray, centre: np.ndarray, first: np.ndarray, last: np.ndarray, h: float
) -> list[list[int]]:
    """The rows with each turnover (see the module's doc) joined to the row under it."""
    if len(rows) < 2:
        return rows
    mid = [float(np.mean(centre[m])) for m in rows]
    pitch = float(np.median(np.diff(mid)))

    def start(m: list[int]) -> float | None:  # where the row's first-column cell starts
        xs = [float(x0[k]) for k in m if first[k] == 0]
        return min(xs) if xs else None

    out: list[list[int]] = []
    carry: list[int] = []
    for r, members in enumerate(rows):
        members = carry + members
        carry = []
        lone = all(first[k] == 0 and last[k] == 0 for k in rows[r])
        if lone and r + 1 < len(rows) and mid[r + 1] - mid[r] <= TURNOVER_PITCH * pitch:
            here, below = start(rows[r]), start(rows[r + 1])
            after = start(rows[r + 2]) if r + 2 < len(rows) else -np.inf
            if (
                here is not None
                and below is not None
                and after is not None
                and any(last[k] > 0 for k in rows[r + 1])
                and below - here >= INDENT * h
                and below - after >= INDENT * h
            ):
                carry = members
                continue
        out.append(members)
    return out


def _separators(
    x0: np.ndarray, x1: np.ndarray, rows: list[list[int]], h: float
) -> tuple[np.ndarray, np.ndarray]:
    """The x where each column separator starts and ends, left to right. A box is counted without its
    padding (PADDING h each side: the detector's boxes reach past the ink, and neighbouring cells' boxes
    may touch or overlap where the ink does not)."""
    solid = x1 - x0 >= NOISE_MAX_WIDTH * h
    if not solid.any():
        return np.empty(0), np.empty(0)
    # The rows that have cells side by side say where the columns are; a row of one line (a heading within
    # the table, a note, a label wrapped onto a second line) is placed by them (unless there are too few).
    multi = [m for m in rows if sum(bool(solid[k]) for k in m) >= 2]
    if len(multi) >= MIN_BODY_ROWS:
        rows = multi
    a, z = x0 + PADDING * h, x1 - PADDING * h
    left, right = float(a[solid].min()), float(z[solid].max())
    step = h / GRID
    n = int(np.ceil((right - left) / step)) + 1
    count = np.zeros(n, dtype=np.int64)
    for members in rows:
        covered = np.zeros(n + 1, dtype=np.int64)
        for k in members:
            if solid[k]:
                covered[int((a[k] - left) / step)] += 1
                covered[int(np.ceil((z[k] - left) / step)) + 1] -= 1
        count += np.cumsum(covered)[:n] > 0
    low = count <= SPAN_SHARE * len(rows)
    # Runs of low coverage strictly inside the table's extent, at least SEPARATOR_MIN h wide.
    edges = np.flatnonzero(np.diff(np.r_[0, low.astype(np.int8), 0]))
    starts, ends = edges[0::2], edges[1::2]
    keep = (starts > 0) & (ends < n) & ((ends - starts) * step >= SEPARATOR_MIN * h)
    return left + starts[keep] * step - PADDING * h, left + ends[keep] * step + PADDING * h


def _cell(
    row: int,
    group: list[int],
    idx: np.ndarray,
    b: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
    line: np.ndarray,
) -> Cell:
    lo = int(min(first[k] for k in group))
    hi = int(max(last[k] for k in group))
    members = sorted(group, key=lambda k: (line[k], b[k, 0], b[k, 1]))
    return Cell(
        row=row,
        column=lo,
        row_span=1,
        column_span=hi - lo + 1,
        lines=[int(idx[k]) for k in members],
        bbox=(
            float(b[group, 0].min()),
            float(b[group, 1].min()),
            float(b[group, 2].max()),
            float(b[group, 3].max()),
        ),
    )
