"""A table block's rows and cells from its line boxes (ocr_app/engines/tables.py): columns from the strips no
row crosses, spanning heads, cells split by the detector, rows on a tilted scan, and each limit at the limit
and one past it. The grids expected are written out by hand; the engine's cells of a rendered table are
checked against the text it was drawn with in tests/test_reading_order.py and, through the app, in
tests/test_formats.py."""

from __future__ import annotations

import random

import pytest

from ocr_app.engines import tables
from ocr_app.engines.layout import page_layout
from ocr_app.engines.tables import table_cells

H = 20  # the line height of every box here: one grid step (h / GRID) is 1 unit


def box(x0: float, y: float, x1: float, height: float = H) -> tuple[float, float, float, float]:
    return (x0, y, x1, y + height)


def grid(boxes, ids=None) -> list[list[tuple[int, int, list[int]]]]:
    """The table as rows of (column, column_span, lines)."""
    t = table_cells(boxes, list(range(len(boxes))) if ids is None else ids)
    out: list[list[tuple[int, int, list[int]]]] = [[] for _ in range(t.rows)]
    for c in t.cells:
        assert c.row_span == 1
        out[c.row].append((c.column, c.column_span, c.lines))
    return out


def shuffled(boxes, seed: int = 7):
    order = list(range(len(boxes)))
    random.Random(seed).shuffle(order)
    return [boxes[i] for i in order], order


def test_right_aligned_figures_under_wider_heads():
    # A name column, then two columns of right-aligned figures whose heads are wider than the figures and
    # reach into the gap before them ("cyl" over single digits, as on the mtcars page).
    boxes = [box(0, 0, 60), box(150, 0, 240), box(300, 0, 400)]  # heads
    for r, (name, a, b) in enumerate([(140, 30, 60), (90, 50, 80), (120, 30, 70)]):
        y = (r + 1) * 30
        boxes += [box(0, y, name), box(240 - a, y, 240), box(400 - b, y, 400)]
    rows = grid(boxes)
    assert [[c[:2] for c in row] for row in rows] == [[(0, 1), (1, 1), (2, 1)]] * 4
    assert [c[2] for c in rows[0]] == [[0], [1], [2]]
    assert [c[2] for c in rows[2]] == [[6], [7], [8]]


def test_a_head_over_two_columns_spans_them():
    boxes = [box(200, 0, 380)]  # "Male" over "Total" and "Under 18"
    for r in range(6):
        y = (r + 1) * 30
        boxes += [box(0, y, 100), box(200, y, 260), box(320, y, 380)]
    rows = grid(boxes)
    assert rows[0] == [(1, 2, [0])]
    assert all([c[:2] for c in row] == [(0, 1), (1, 1), (2, 1)] for row in rows[1:])


def test_a_cell_split_by_the_detector_is_one_cell_and_touching_cells_are_two():
    # Row 0: "JUAN" and "MARTIN" in one cell (the detector split it at a wide space; other rows' names run
    # across that space), and a date and a word whose boxes overlap by 4 units (their padding; the ink is
    # apart), as the detector gave "09/10/2013" and "EFECTIVO" on a few of the campaign donors' rows.
    boxes = [box(0, 0, 60), box(75, 0, 130), box(200, 0, 300), box(296, 0, 390)]
    for r, name in enumerate([150, 120, 140, 110, 150, 130, 100], start=1):
        boxes += [box(0, r * 30, name), box(200, r * 30, 290), box(300, r * 30, 390)]
    rows = grid(boxes)
    assert rows[0] == [(0, 1, [0, 1]), (1, 1, [2]), (2, 1, [3])]
    assert all([c[:2] for c in row] == [(0, 1), (1, 1), (2, 1)] for row in rows)


def test_rows_of_a_tilted_scan_and_shuffled_boxes():
    # A residual tilt: each cell 2 units lower than the one left of it (0.1 h), rows 28 apart.
    rows = []
    for r in range(5):
        rows.append([box(c * 150, r * 28 + 2 * c, c * 150 + 100) for c in range(4)])
    flat = [b for row in rows for b in row]
    boxes, order = shuffled(flat)
    t = table_cells(boxes, list(range(len(boxes))))
    assert (t.rows, t.columns) == (5, 4)
    # Read row by row, cell by cell: the boxes in the order they were made.
    assert [order[i] for i in t.order()] == list(range(len(flat)))


def test_a_row_gap_at_the_limit_and_one_past_it():
    # Two boxes side by side whose centres are ROW_GAP h apart are one row; a unit more, two rows.
    gap = tables.ROW_GAP * H
    t = table_cells([box(0, 0, 100), box(200, gap, 300)], [0, 1])
    assert t.rows == 1
    t = table_cells([box(0, 0, 100), box(200, gap + 1, 300)], [0, 1])
    assert t.rows == 2


def columns_with_ink_gap(gap: float) -> int:
    # Two columns of 4 rows whose ink (boxes less their padding) is `gap` apart.
    pad = tables.PADDING * H
    boxes = []
    for r in range(4):
        boxes += [box(0, r * 30, 100), box(100 + gap - 2 * pad, r * 30, 200)]
    return table_cells(boxes, list(range(len(boxes)))).columns


def test_a_separator_at_its_least_width_and_one_step_under():
    # A run of low coverage is measured between the last step covered left and the first covered right:
    # an ink gap of SEPARATOR_MIN h and one step is a run of SEPARATOR_MIN h.
    least = tables.SEPARATOR_MIN * H + H / tables.GRID
    assert columns_with_ink_gap(least) == 2
    assert columns_with_ink_gap(least - H / tables.GRID) == 1


@pytest.mark.parametrize(("spanning", "columns"), [(3, 3), (4, 2)])
def test_rows_crossing_a_separator_at_the_span_share_and_one_past(spanning, columns):
    # 20 rows of three cells; some with a cell over the first two columns (SPAN_SHARE of the rows, 3, still
    # leave the first separator; 4 do not).
    assert tables.SPAN_SHARE * 20 >= 3 and tables.SPAN_SHARE * 20 < 4
    boxes = []
    for r in range(20):
        if r < spanning:
            boxes += [box(0, r * 30, 300), box(400, r * 30, 450)]
        else:
            boxes += [box(0, r * 30, 100), box(200, r * 30, 300), box(400, r * 30, 450)]
    assert table_cells(boxes, list(range(len(boxes)))).columns == columns


def test_rows_of_one_line_do_not_hide_the_columns():
    # Headings within the table and notes under it, a line each, across both columns, in 6 of 10 rows: the
    # rows with cells side by side place the columns; the lone lines span them.
    boxes = []
    for r in range(10):
        if (r % 2 and r < 8) or r >= 8:
            boxes.append(box(0, r * 30, 300))
        else:
            boxes += [box(0, r * 30, 100), box(200, r * 30, 300)]
    t = table_cells(boxes, list(range(len(boxes))))
    assert t.columns == 2
    assert [(c.row, c.column_span) for c in t.cells if c.column_span > 1] == [(1, 2), (3, 2), (5, 2), (7, 2),
                                                                             (8, 2), (9, 2)]  # fmt: skip


def test_a_headnote_and_footnotes_are_blocks_of_their_own():
    # Two wide lines over a 4-row table and one under it, each a row of one line at least WIDE_SHARE of its
    # width: text, table, text.
    boxes = [box(0, 400, 500), box(0, 430, 480)]  # mid-page: no running head
    for r in range(4):
        y = 470 + r * 30
        boxes += [box(0, y, 100), box(200, y, 260), box(400, y, 500)]
    boxes.append(box(0, 590, 250))  # 250 of 500: WIDE_SHARE of the width
    assert [(b.type, len(b.lines)) for b in page_layout(boxes, 2000.0)] == [
        ("text", 2),
        ("table", 12),
        ("text", 1),
    ]
    boxes[-1] = box(0, 590, 249)  # under WIDE_SHARE, as close as the rows: the table's last row
    assert [b.type for b in page_layout(boxes, 2000.0)] == ["text", "table"]


def two_tables(note_width: float) -> list:
    """page_layout's blocks of two tables set one under the other with a note between them, a row of one
    line `note_width` of 500 wide, at the rows' spacing: a 4-column table over a 2-column one whose wide
    second cells cross the first one's separators."""
    boxes = []
    for r in range(4):
        boxes += [box(0, r * 30, 60), box(150, r * 30, 200), box(300, r * 30, 350), box(450, r * 30, 500)]
    boxes.append(box(0, 120, note_width))
    for r in range(4):
        boxes += [box(0, 150 + r * 30, 100), box(250, 150 + r * 30, 500)]
    return page_layout(boxes, 2000.0)


def test_a_note_between_two_tables_parts_them():
    # At WIDE_SHARE of the width the note parts the block: each table on its own grid. One unit under, the
    # note is a row of the one table, whose wide cells then cross the first table's separators.
    blocks = two_tables(250)
    assert [(b.type, b.table.columns if b.table else None) for b in blocks] == [
        ("table", 4),
        ("text", None),
        ("table", 2),
    ]
    assert blocks[1].lines == [16]
    assert [b.type for b in two_tables(249)] == ["table"]


def test_marks_in_a_gap_do_not_split_it():
    # An 11-unit mark (under NOISE_MAX_WIDTH h) in the middle of the gap on every row, as a dotted vertical
    # rule gives: still one separator, two columns; the mark joins the column nearest its middle.
    boxes = []
    for r in range(4):
        boxes += [box(0, r * 30, 100), box(145, r * 30, 156), box(200, r * 30, 300)]
    t = table_cells(boxes, list(range(len(boxes))))
    assert t.columns == 2
    assert [c.column for c in t.cells if 1 in c.lines] == [0]


def test_cells_whose_boxes_nearly_touch_are_apart_by_their_ink():
    # Every row's two boxes 2 units apart: without their padding (PADDING h a side) the ink is a separator's
    # width apart.
    boxes = []
    for r in range(4):
        boxes += [box(0, r * 30, 100), box(102, r * 30, 200)]
    assert table_cells(boxes, list(range(len(boxes)))).columns == 2


def detached_rows(gap: float, usual: float = 8) -> list[str]:
    """page_layout's blocks of a 6-row, 3-column table with a page number `gap` below its last row."""
    boxes = []
    for r in range(6):
        y = r * (H + usual)
        boxes += [box(0, y, 140), box(300, y, 360), box(450, y, 520)]
    last_bottom = 5 * (H + usual) + H
    boxes.append(box(300, last_bottom + gap, 330))
    return [b.type for b in page_layout(boxes, 2000.0)]


def test_a_row_standing_apart_under_the_table_is_not_the_tables():
    # The blank under the table's rows is 8; a row DETACHED times that and DETACHED_MIN h more apart is not
    # the table's (the page number of the tabula pages); a unit less and it is the table's last row.
    usual = 8
    least = max(tables.DETACHED * usual, usual + tables.DETACHED_MIN * H)
    assert detached_rows(least) == ["table", "text"]
    assert detached_rows(least - 1) == ["table"]
    # A row as full as the table's (a total under a blank) stays the table's however far apart.
    boxes = []
    for r in range(7):
        y = r * (H + usual) + (40 if r == 6 else 0)
        boxes += [box(0, y, 140), box(300, y, 360), box(450, y, 520)]
    assert [b.type for b in page_layout(boxes, 2000.0)] == ["table"]


def test_nothing_and_one_box():
    assert table_cells([], []).cells == []
    t = table_cells([box(0, 0, 50)], [0])
    assert (t.rows, t.columns, t.order()) == (1, 1, [0])


def turnover_boxes(indent: float, back: float, up: float = 0) -> list:
    """A label, its turnover `indent` right of it with figures on it, and a next label `back` left of the
    turnover, under two full rows (the columns); the label `up` higher than the rows' pitch (30) puts it."""
    boxes = [box(0, 0, 100), box(200, 0, 260), box(300, 0, 360)]
    boxes += [box(0, 30, 100), box(200, 30, 260), box(300, 30, 360)]
    boxes += [box(20, 60 - up, 70), box(76, 60 - up, 150)]  # "Murder and" "nonnegligent" (split), alone
    boxes += [box(20 + indent, 90, 130), box(200, 90, 260), box(300, 90, 360)]  # "manslaughter" 10.0 9.0
    boxes += [box(20 + indent - back, 120, 120), box(200, 120, 260), box(300, 120, 360)]
    return boxes


def test_a_turnover_at_the_indent_limit_and_one_under():
    # INDENT h right of the lone line and INDENT h back: one row, its lines in printed order (the first
    # line's two pieces, then the turnover, whose box starts between them); a unit less either way, two rows.
    least = tables.INDENT * H
    rows = grid(turnover_boxes(least, least))
    assert len(rows) == 4
    assert rows[2] == [(0, 1, [6, 7, 8]), (1, 1, [9]), (2, 1, [10])]
    assert len(grid(turnover_boxes(least - 1, least))) == 5
    assert len(grid(turnover_boxes(least, least - 1))) == 5  # a heading over indented rows


def test_a_turnover_at_the_pitch_limit_and_one_past():
    # The lone line TURNOVER_PITCH times the usual pitch (30: the median, whatever it moves) above the
    # row under it is its turnover's; a unit more, a row of its own.
    more = (tables.TURNOVER_PITCH - 1) * 30
    assert len(grid(turnover_boxes(6, 6, up=more))) == 4
    assert len(grid(turnover_boxes(6, 6, up=more + 1))) == 5


def wrapped_head(second: float) -> list:
    """A spanning head ("Both sexes") over a head of two lines, the second `second` below the first, over 6
    rows of 4 cells 30 apart; a rule's gap (40) under the spanning head and under the head."""
    boxes = [box(200, 0, 360)]  # 0: "Both sexes", over columns 1 and 2
    boxes += [box(0, 40, 100), box(200, 40, 260), box(300, 40, 360)]  # 1-3: "Offense", "Under 18", "18 years"
    y = 40 + second
    boxes += [box(210, y, 250), box(300, y, 360), box(400, y, 460)]  # 4-6: "years", "and over", "Total"
    for r in range(6):
        y_r = y + 40 + 30 * r
        boxes += [box(0, y_r, 100)] + [box(c * 100 + 100, y_r, c * 100 + 160) for c in range(1, 4)]
    return boxes


def test_a_head_wrapped_onto_two_lines_is_one_row():
    # The head's second line at the rows' pitch (30): one row, each cell's lines top to bottom; the spanning
    # head over it, a rule's gap above, a row of its own.
    rows = grid(wrapped_head(30))
    assert len(rows) == 8
    assert rows[0] == [(1, 2, [0])]
    assert rows[1] == [(0, 1, [1]), (1, 1, [2, 4]), (2, 1, [3, 5]), (3, 1, [6])]
    assert rows[2] == [(0, 1, [7]), (1, 1, [8]), (2, 1, [9]), (3, 1, [10])]


def test_a_wrapped_head_at_the_pitch_limit_and_one_past():
    # HEAD_PITCH times the usual pitch (30) apart, the head's lines are one row; a unit more, two.
    least = tables.HEAD_PITCH * 30
    assert least == 36
    assert len(grid(wrapped_head(least))) == 8
    rows = grid(wrapped_head(least + 1))
    assert len(rows) == 9
    assert rows[1] == [(0, 1, [1]), (1, 1, [2]), (2, 1, [3])]


def test_a_head_wrapped_onto_three_lines_is_one_row():
    # "American / Indian/Alaskan / Native" over column 3, "Asian Pacific / Islander" over column 4 and
    # "Offense charged" in the middle line, the other heads on the last: one head row.
    boxes = [box(400, 0, 460)]  # 0
    boxes += [box(0, 30, 100), box(400, 30, 460), box(500, 30, 560)]  # 1-3
    boxes += [box(c * 100 + 100, 60, c * 100 + 160) for c in range(1, 5)]  # 4-7
    for r in range(6):
        y = 100 + 30 * r
        boxes += [box(0, y, 100)] + [box(c * 100 + 100, y, c * 100 + 160) for c in range(1, 5)]
    boxes, order = shuffled(boxes)
    at = {old: new for new, old in enumerate(order)}
    t = table_cells(boxes, list(range(len(boxes))))
    assert (t.rows, t.columns) == (7, 5)
    head = [(c.column, [order[i] for i in c.lines]) for c in t.cells if c.row == 0]
    assert head == [(0, [1]), (1, [4]), (2, [5]), (3, [0, 2, 6]), (4, [3, 7])]
    assert [c.lines for c in t.cells if c.row == 1] == [[at[k]] for k in range(8, 13)]


def test_full_rows_under_a_head_are_not_a_head():
    # A head, a rule's gap, two rows with a cell in every column, a wider gap (a group's blank), then rows at
    # the pitch: the two rows are the body's (a head line has an empty column), each a row of its own.
    boxes = [box(c * 100, 0, c * 100 + 60) for c in range(4)]
    for y in (40, 70, 110, 140, 170, 200, 230):
        boxes += [box(c * 100, y, c * 100 + 60) for c in range(4)]
    assert len(grid(boxes)) == 8


def footnoted(pitch: float) -> tuple[list[str], int]:
    """page_layout's blocks of a head and 6 rows 30 apart, 3 columns, with a footnote (a line within the
    first column) `pitch` under the last row: the detector's boxes leave a blank of 10 between rows."""
    boxes = [box(300, 0, 360), box(450, 0, 520)]
    for r in range(1, 7):
        boxes += [box(0, r * 30, 140), box(300, r * 30, 360), box(450, r * 30, 520)]
    boxes.append(box(10, 6 * 30 + pitch, 130))
    blocks = page_layout(boxes, 2000.0)
    return [b.type for b in blocks], blocks[0].table.rows if blocks[0].table else 0


def test_a_footnote_at_the_tail_pitch_and_one_under():
    # TAIL_PITCH times the rows' pitch under the last row (a blank of 19 there, under what DETACHED asks of
    # the blank of 10: the pitch parts it), the footnote is a block of its own; a unit less, the last row.
    least = tables.TAIL_PITCH * 30
    assert least == 39 and least - H < max(tables.DETACHED * 10, 10 + tables.DETACHED_MIN * H)
    assert footnoted(least) == (["table", "text"], 7)
    assert footnoted(least - 1) == (["table"], 8)
