"""The limits of ocr_app.engines.layout's rules, each at the limit and one past: synthetic line boxes whose
reading order, blocks and deskew are worked out by hand from the rules as documented (the numbers in the
comments), never by calling the layout again. Fast (no engine): they run first in `make mutate MODULE=layout`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ocr_app.engines.layout import deskewed, page_layout, page_skew, reading_groups, reading_order, row_order

H = 20  # the body's line height: the median h the rules are counted in


def line(x: float, y: float, w: float, h: float = H) -> tuple[float, float, float, float]:
    return (x, y, x + w, y + h)


def column(x: float, top: float, widths: list[float], pitch: float = 30, h: float = H) -> list[tuple]:
    return [line(x, top + k * pitch, w, h) for k, w in enumerate(widths)]


def ordered(boxes: list[tuple]) -> list[tuple]:
    return [boxes[i] for i in reading_order(boxes)]


def blocks(boxes: list[tuple], height: float = 600) -> list[tuple[str, list[int]]]:
    return [(b.type, b.lines) for b in page_layout(boxes, height)]


def by_rows(boxes: list[tuple]) -> list[tuple]:
    """Rows top to bottom, left to right: for boxes no two of which share a row (distinct tops), by top."""
    assert len({b[1] for b in boxes}) == len(boxes)
    return sorted(boxes, key=lambda b: b[1])


# --- Reading order --------------------------------------------------------------------------------------


def test_normalised_boxes_are_laid_out_like_pixels():
    # The engines pass boxes normalised to the page (0-1): a line height of 0.02 is a height like any other.
    left, right = column(50, 100, [400] * 6), column(480, 100, [400] * 6)
    title = [line(50, 20, 830, 36)]
    note = [line(50, 300, 830)]  # a note across the page under the columns
    scale = 1 / 1000
    boxes = [tuple(v * scale for v in b) for b in title + left + right + note]
    assert reading_order(boxes) == list(range(14))  # the title, the left column, the right one, the note
    got = [(b.type, b.lines) for b in page_layout(boxes, 1.0)]
    assert got == [("title", [0]), ("text", list(range(1, 7))), ("text", list(range(7, 13))), ("text", [13])]


def test_lines_of_no_height_are_read_as_rows():
    # Two columns of lines of no height (the median h is 0: no unit to measure gutters in), their lines
    # offset by 15: read as rows, by top.
    left = column(50, 100, [400] * 4, h=0)
    right = column(480, 115, [400] * 4, h=0)
    assert ordered(left + right) == by_rows(left + right)


def test_lines_of_no_median_height_are_read_as_rows_beside_taller_ones():
    # Four lines of no height (480-880, tops 105, 135, 165, 195) beside three 50 high (50-450, tops 100,
    # 130, 160, each reaching into the next: no blank between them), the median h 0: no unit for a gutter,
    # read as rows. Row by row, each row starts at a tall line and takes the flat lines whose middle lies
    # within it: (100, 105), (130, 135), (160, 165, 195), left to right; the same as by their tops here.
    tall = column(50, 100, [400] * 3, h=50)
    flat = column(480, 105, [400] * 4, h=0)
    assert ordered(tall + flat) == by_rows(tall + flat)


def test_a_column_is_cut_where_its_gutter_is_not_at_its_left_edge():
    # Left column 50-450, right 480-880: the cut is at the gutter's middle, x = 465. A line set flush right
    # in the left column (330-450, its middle at 390) is the left column's.
    left = column(50, 100, [400, 400, 400, 400, 400, 400])
    left[2] = line(330, left[2][1], 120)
    right = column(480, 100, [400] * 6)
    assert ordered(left + right) == left + right


@pytest.mark.parametrize(("width", "columns"), [(120, True), (119, False)], ids=["6h", "under-6h"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_the_column_width_limit(width, columns, side):
    # Two sides of a 40 blank, their lines offset by half the pitch (15: no row pairs with one across, so
    # not a table): COLUMN_MIN_WIDTH (6 h = 120) wide they are columns; one unit narrower, rows, by top.
    widths = {"left": (width, 400), "right": (400, width)}[side]
    left = column(50, 100, [widths[0]] * 5)
    right = column(50 + widths[0] + 40, 115, [widths[1]] * 5)
    assert ordered(left + right) == (left + right if columns else by_rows(left + right))


@pytest.mark.parametrize(("lines", "columns"), [(2, True), (1, False)], ids=["2-lines", "1-line"])
def test_the_column_lines_limit(lines, columns):
    # A column of 6 lines beside one of COLUMN_MIN_LINES (2) lines, offset by half the pitch: columns. With
    # one line the short side is no column: the lines are rows, by top.
    left = column(50, 100, [400] * 6)
    right = column(480, 115, [400] * lines)
    assert ordered(left + right) == (left + right if columns else by_rows(left + right))


@pytest.mark.parametrize("scale", [1, 1 / 1000], ids=["pixels", "normalised"])
@pytest.mark.parametrize(("paired", "table"), [(4, True), (3, False)], ids=["80%", "60%"])
def test_the_paired_rows_limit(paired, table, scale):
    # Two sides of 5 short lines (130 = 6.5 h: columns by width, not prose, under 7 h): when TABLE_PAIRED
    # (80 %: 4 of 5) of the rows pair up with a row across, a table, read row by row; 3 of 5, two columns.
    left = column(50, 100, [130] * 5)
    right = [line(220, 100 + 30 * k + (0 if k < paired else 15), 130) for k in range(5)]
    rows = sorted(left + right, key=lambda b: (b[1], b[0]))
    boxes = [tuple(v * scale for v in b) for b in left + right]
    expected = rows if table else left + right
    assert [(left + right)[i] for i in reading_order(boxes)] == expected


@pytest.mark.parametrize("taller", ["left", "right"])
@pytest.mark.parametrize(("overlap", "table"), [(10, True), (9, False)], ids=["half", "under-half"])
def test_rows_pair_when_they_overlap_by_half_the_shorter(overlap, table, taller):
    # Rows 30 high on one side, 20 high on the other (h = 30: 6 h = 180 wide sides, 200 < 7 h: not prose):
    # rows overlapping by half the shorter one's height (10) pair up, a table read row by row; by 9, not:
    # two columns.
    if taller == "left":
        left = column(50, 100, [200] * 5, pitch=50, h=30)
        right = column(290, 130 - overlap, [200] * 5, pitch=50)
    else:
        left = column(50, 100, [200] * 5, pitch=50)
        right = column(290, 120 - overlap, [200] * 5, pitch=50, h=30)
    rows = [b for pair in zip(left, right, strict=True) for b in pair]
    assert ordered(left + right) == (rows if table else left + right)


def test_a_row_pairs_with_the_row_across_just_above_its_middle():
    # As at the 80 % limit (a table), the right side's rows 2 higher: each left row's middle lies just
    # under the middle of the right row it pairs with.
    left = column(50, 100, [130] * 5)
    right = [line(220, 98 + 30 * k + (0 if k < 4 else 15), 130) for k in range(5)]
    assert ordered(left + right) == [b for k in range(4) for b in (left[k], right[k])] + [left[4], right[4]]


def test_a_row_pairs_only_with_the_rows_across_nearest_its_middle():
    # Two sides of 5 short lines (130 wide: a table if 4 rows pair up), the right one's last a tall box
    # (85-340) whose middle (212.5) is the lowest. The left's first row (80-100), its middle over every
    # row across, is set against the first row across only (100-120: no overlap), not the tall one; three
    # rows pair up (of five: under 80 %): columns, the right one read as one row (the tall box's height
    # holds every other middle there), left to right, ties top first.
    left = [line(50, 80, 130), *column(50, 130, [130] * 3), line(50, 350, 130)]
    tall = line(220, 85, 130, 255)
    right = [*column(220, 100, [130] * 4), tall]
    assert ordered(left + right) == [*left, tall, *right[:4]]


@pytest.mark.parametrize(("drop", "columns"), [(10, False), (11, True)], ids=["0.5h", "past-0.5h"])
def test_the_pieces_of_a_line_are_one_row_while_their_middles_are_half_h_apart(drop, columns):
    # Two sides of two rows (50-450, 480-880; a gutter of 30), the left one's second line in two pieces
    # touching at 250 (one interval), the second `drop` lower. Middles 0.5 h (10) apart are one row of its
    # side: two rows a side pair up, two rows tell nothing (a table's): read as rows, the second row's three
    # boxes left to right. 11 apart they are two rows: two of three rows pair (under 80 %): columns.
    top, first, second = line(50, 100, 400), line(50, 130, 200), line(250, 130 + drop, 200)
    right = column(480, 100, [400] * 2)
    boxes = [top, first, second, *right]
    expected = [top, first, second, *right] if columns else [top, right[0], first, second, right[1]]
    assert ordered(boxes) == expected


def test_a_row_pairs_with_the_row_across_nearest_its_middle_not_a_tall_one_past_it():
    # Left: a line (50-450, 129-149) and a piece of one (50-180, 142-152, its middle 8 lower: the same row,
    # 129-152, middle 140.5), then a line at 172-192. Right: a line (480-880, 144-164, middle 154), then a
    # row of a line (480-880, 160-170) and a tall box (480-610, 137-197): 137-197, middle 167 (h is 20).
    # The left's first row, its middle over both right middles, is set against the nearest, the first
    # (overlap 144-152: 8, under half the shorter's 20), not the tall row past it (137-197 overlaps it by 15):
    # unpaired; the second pairs with the tall row. 1 of 2 rows pair (under 80 %): two columns, two groups.
    boxes = [
        line(50, 129, 400),
        line(50, 142, 130, 10),
        line(50, 172, 400),
        line(480, 137, 130, 60),
        line(480, 144, 400),
        line(480, 160, 400, 10),
    ]
    assert reading_groups(boxes) == [[0, 1, 2], [3, 4, 5]]


def test_a_row_is_sought_among_the_middles_across_not_their_bottoms():
    # Left: lines at 0-20, 60-80 and 125-145 (middles 10, 70, 135). Right: a box 0-80 (middle 40), a tall
    # narrow one 20-140 (middle 80) and a short line 100-120 (middle 110): their bottoms (80, 140, 120) are
    # not in order where the tall box stands. The left's last line, past every middle across, is set against
    # the nearest, the short line (no overlap): unpaired, 2 of 3 rows pair (under 80 %): two columns. Sought
    # among the bottoms instead it lands by the tall box, which overlaps it by 15: 3 of 3 pair, and the right
    # side's rows (median 200 wide, under 0.7 of its 400) are no prose: a table, read as rows.
    boxes = [
        line(50, 0, 400),
        line(50, 60, 400),
        line(50, 125, 400),
        line(480, 0, 400, 80),
        line(480, 20, 80, 120),
        line(680, 100, 200),
    ]
    assert reading_groups(boxes) == [[0, 1, 2], [3, 4, 5]]


def test_the_pieces_of_a_line_are_one_row_of_its_side():
    # Two columns on shared baselines, 5 lines each, the second and fourth split in two pieces 6 apart
    # (under the 0.4 h of a gutter), the second piece 6 lower (the detector's skew): a line's pieces, their
    # middles 6 apart (under 0.5 h), are one row of its side, 400 wide: prose, read column by column.
    def side(x):
        out = []
        for k in range(5):
            y = 100 + 30 * k
            out += [line(x, y, 197), line(x + 203, y + 6, 197)] if k in (1, 3) else [line(x, y, 400)]
        return out

    left, right = side(50), side(480)
    assert ordered(left + right) == left + right


@pytest.mark.parametrize(
    ("width", "height", "solid"),
    [(12, 20, True), (11, 20, False), (20, 8, True), (20, 7, False)],
    ids=["0.6h-wide", "under-0.6h-wide", "0.4h-high", "under-0.4h-high"],
)
def test_the_noise_limits(width, height, solid):
    # Two columns (50-450, 510-910: a 60 gutter, cut at 480) and a box centred on the cut on the first row.
    # NOISE_MAX_WIDTH (0.6 h = 12) wide and NOISE_MAX_HEIGHT (0.4 h = 8) high it is a line: standing in the
    # gutter it ends the columns above it, the first row read across, then the columns; 11 wide or 7 high
    # it is noise, the right column's.
    left, right = column(50, 100, [400] * 6), column(510, 100, [400] * 6)
    box = line(480 - width / 2, 100, width, height)
    expected = [left[0], box, right[0], *left[1:], *right[1:]] if solid else [*left, box, *right]
    assert ordered(left + right + [box]) == expected


def test_a_title_right_on_top_of_the_columns():
    # No blank under the title (its bottom, 56, is the columns' top): still a band of its own.
    title = [line(50, 20, 830, 36)]
    left, right = column(50, 56, [400] * 6), column(480, 68, [400] * 6)
    assert ordered(title + left + right) == title + left + right


def test_noise_on_the_cut_goes_right():
    # A speck (4 x 4) centred on the cut (x = 465, the middle of the 450-480 gutter), level with the first
    # lines: the right column's, read first in it.
    left, right = column(50, 100, [400] * 6), column(480, 100, [400] * 6)
    speck = [line(463, 100, 4, 4)]
    assert ordered(left + right + speck) == left + speck + right


@pytest.mark.parametrize("short", ["right", "left"])
def test_short_lines_beside_prose_are_a_tables(short):
    # Prose (400 wide) on one side, short lines (130: under 7 h) on the other, on shared baselines: the short
    # side does not read as prose, so a table: read row by row. (Each side's lines are the ones within its
    # interval: the right side's lie right of the left side's start too.)
    prose, lines = [400] * 5, [130] * 5
    left, right = (
        column(50, 100, lines if short == "left" else prose),
        column(480, 100, lines if short == "right" else prose),
    )
    assert ordered(left + right) == by_rows_pairs(left, right)


@pytest.mark.parametrize(("width", "columns"), [(210, True), (209, False)], ids=["70%", "under-70%"])
def test_the_column_fill_limit(width, columns):
    # Two sides 300 wide (one full line each), their other 4 lines `width` wide, on shared baselines: rows
    # filling COLUMN_MIN_FILL (70 %: 210) of their side are prose, columns; 209, a table's, rows.
    left = column(50, 100, [300] + [width] * 4)
    right = column(400, 100, [300] + [width] * 4)
    assert ordered(left + right) == (left + right if columns else by_rows_pairs(left, right))


@pytest.mark.parametrize(("gap", "columns"), [(8, True), (7, False)], ids=["0.4h", "under-0.4h"])
def test_the_gutter_is_measured_from_the_columns_widest_line(gap, columns):
    # Two prose columns of 16 lines on shared baselines (32 boxes: the numpy union), the left one's last
    # line indented by 10 and so reaching 10 further (60-460): the gutter runs from 460, not from the other
    # lines' 450. GUTTER_MIN (0.4 h = 8) from it: columns all the way; 7: none across the block, only over
    # the 15 rows above the last (17 wide there): those read as columns, then the last row.
    left = [*column(50, 100, [400] * 15), line(60, 100 + 15 * 30, 400)]
    right = column(460 + gap, 100, [400] * 16)
    expected = left + right if columns else left[:15] + right[:15] + [left[15], right[15]]
    assert ordered(left + right) == expected


@pytest.mark.parametrize(("gap", "columns"), [(8, True), (7, False)], ids=["0.4h", "under-0.4h"])
def test_the_gutter_width_limit(gap, columns):
    # Two prose columns on shared baselines GUTTER_MIN (0.4 h = 8) apart: columns; 7 apart, rows.
    left, right = column(50, 100, [400] * 5), column(450 + gap, 100, [400] * 5)
    assert ordered(left + right) == (left + right if columns else by_rows_pairs(left, right))


def test_the_line_height_is_the_median_one():
    # 7 lines 20 high, 5 lines 10 high: the median h is 20 (a third of the way up the heights it is 10).
    # Sides 100 wide are under 6 h = 120, so no columns: rows, by top (at h = 10 they would be columns).
    left = [line(50, 100 + 40 * k, 100, 20 if k % 2 else 10) for k in range(6)]
    right = [line(190, 120 + 40 * k, 100, 10 if k >= 4 else 20) for k in range(6)]
    assert ordered(left + right) == by_rows(left + right)


@pytest.mark.parametrize(("gap", "heads_first"), [(20, True), (19, False)], ids=["1h", "under-1h"])
def test_the_running_head_gap(gap, heads_first):
    # A left and a right running head over two columns, HEAD_GAP (1 h = 20) above them: read first, as a
    # row; 19 above, each is read with the column it lies over.
    heads = [line(50, 20, 250), line(780, 20, 100)]
    left = column(50, 40 + gap, [400] * 6)
    right = column(480, 40 + gap, [400] * 6)
    expected = heads + left + right if heads_first else heads[:1] + left + heads[1:] + right
    assert ordered(heads + left + right) == expected


@pytest.mark.parametrize("longer", [0, 1], ids=["even", "left-longer"])
@pytest.mark.parametrize(("gap", "parted"), [(60, True), (59, False)], ids=["3h", "under-3h"])
def test_the_section_gap(gap, parted, longer):
    # An invoice's shape: two prose columns (4 lines of 400 each side: columns over the whole block, whose
    # rows are prose by their median) over an item table (3 rows of two 100-wide cells lined up with the
    # columns), SECTION_GAP (3 h = 60) under them: parted first, the columns read one after the other, then
    # the table by rows (its own rows pair up and are short: a table). 59 under them: one block, cut at the
    # gutter, each cell read with the column it lies under. With the left column a line longer, its last
    # line (50-450, 220-240) is the section's lowest, read with it (after that column's other lines).
    left, right = column(50, 100, [400] * (4 + longer)), column(480, 100, [400] * 4)
    top = 100 + (3 + longer) * 30 + H + gap  # the left column's last line ends at 210 (or 240)
    cells, prices = column(50, top, [100] * 3), column(480, top, [100] * 3)
    got = ordered(left + right + cells + prices)
    assert got == (left + right + by_rows_pairs(cells, prices) if parted else left + cells + right + prices)


def test_a_running_head_of_pieces_of_different_heights():
    # The head row: a page number (780-880, 20-30), a logo (50-250, 20-60) and a title (300-440, 35-55),
    # their middles all within the logo's height: one row, 20 (1 h) over two columns: read first, by x.
    number, logo, title = line(780, 20, 100, 10), line(50, 20, 200, 40), line(300, 35, 140)
    left, right = column(50, 80, [400] * 6), column(480, 80, [400] * 6)
    boxes = [number, logo, title, *left, *right]
    assert ordered(boxes) == [logo, title, number, *left, *right]


def test_a_title_in_two_pieces_over_two_columns():
    # A title the detector split in two (50-400 and 420-880: it crosses the gutter at 450-480), over two
    # columns on shared baselines: every band is two boxes, yet the columns are read one after the other.
    title = [line(50, 20, 350, 36), line(420, 20, 460, 36)]
    left, right = column(50, 100, [400] * 6), column(480, 100, [400] * 6)
    assert ordered(title + left + right) == title + left + right


def test_a_title_over_two_columns_of_offset_lines():
    # The columns' lines offset by 12: one band under the title's, read column by column.
    title = [line(50, 20, 830, 36)]
    left, right = column(50, 100, [400] * 6), column(480, 112, [400] * 6)
    assert ordered(title + left + right) == title + left + right


@pytest.mark.parametrize("scale", [1, 1 / 1000], ids=["pixels", "normalised"])
@pytest.mark.parametrize(
    ("first_x", "expected"),
    [(50, [0, 1, 3, 2, 4]), (480, [0, 2, 4, 1, 3])],
    ids=["from-the-left", "from-the-right"],
)
def test_lines_in_a_staircase_under_a_title(scale, first_x, expected):
    # Under a full-width title, lines alternating between left (50-450) and right (480-880), each alone in
    # its band, two a side with a 30 blank between the sides: two columns, read left then right whichever
    # side the stair starts on. From the left: A, B, C, D = left, right, left, right -> title, A, C, B, D;
    # from the right: A, B, C, D = right, left, right, left -> title, B, D, A, C.
    other = 530 - first_x
    title = line(50, 20, 830, 36)
    stairs = [line(x, y, 400) for x, y in zip([first_x, other] * 2, (100, 130, 160, 190), strict=True)]
    boxes = [tuple(v * scale for v in box) for box in (title, *stairs)]
    assert reading_order(boxes) == expected


def test_a_run_goes_on_when_a_line_widens_its_column():
    # Under a title, A left, B right (a run: two columns), then C under B but 10 wider to the left
    # (470-870, still 20 right of A's column: the gutter goes on), then D left: left A, D; right B, C.
    title, a, b = line(50, 20, 830, 36), line(50, 100, 400), line(480, 130, 400)
    c, d = line(470, 160, 400), line(50, 190, 400)
    assert reading_order([title, a, b, c, d]) == [0, 1, 4, 2, 3]


@pytest.mark.parametrize("rows", [10, 4], ids=["40-boxes", "12-boxes"])
def test_pieces_that_touch_are_one_interval(rows):
    # A left column, and a right one whose lines the detector split in two pieces touching at x = 580
    # (40 boxes: the numpy union; 12: the other). The right column is 480-880 wide, not 100 (under 6 h)
    # and 300: columns.
    left = column(50, 100, [400] * (2 * rows))
    right = [b for k in range(rows) for b in (line(480, 100 + 30 * k, 100), line(580, 100 + 30 * k, 300))]
    expected = left + right
    assert ordered(left + right) == expected


def test_columns_nested_past_the_depth_guard():
    # 67 columns 140 wide (7 h), 20 apart, 3 lines each on shared baselines (prose: they fill their width):
    # the gutters are as wide as each other, and the last (rightmost) is cut first, one column off a
    # level. After MAX_DEPTH (64) levels the guard reads what is left, the first two columns, as rows.
    cols = [column(10 + 160 * c, 100, [140] * 3) for c in range(67)]
    boxes = [b for col in cols for b in col]
    expected = by_rows_pairs(cols[0], cols[1]) + [b for col in cols[2:] for b in col]
    assert ordered(boxes) == expected


def by_rows_pairs(a: list[tuple], b: list[tuple]) -> list[tuple]:
    return [x for pair in zip(a, b, strict=True) for x in pair]


def test_sections_nested_count_to_the_depth_guard():
    # A staircase of levels k = 0..32, each 120 lower and one column (140 wide, gutters narrowing from 40 by
    # 0.5 a level: the leftmost is the widest, cut first) further right. Level k: its column C_k runs down
    # to the page's bottom, beside two lines T_k over the next column, 70 (over 3 h) above level k+1: C_k is
    # cut off (a level), then T_k and the rest part at the blank (a level). Level k is at depth 2k: the
    # rest of level 32 (T_32 over the last two columns) is at depth 65, past MAX_DEPTH: read as rows.
    xs = [10.0]
    for k in range(34):
        xs.append(xs[-1] + 140 + 40 - 0.5 * k)
    bottom = 120 * 33 + 90  # the last two columns' 4 lines
    cols = [column(xs[k], 120 * k, [140] * ((bottom - 120 * k) // 30 + 1)) for k in range(34)]
    last = column(xs[34], 120 * 33, [140] * 4)
    heads = [column(xs[k + 1], 120 * k, [140] * 2) for k in range(33)]
    boxes = [b for group in (*cols, last, *heads) for b in group]
    expected = [b for k in range(33) for b in cols[k] + heads[k]] + by_rows_pairs(cols[33], last)
    assert ordered(boxes) == expected


def test_runs_nested_count_to_the_depth_guard():
    # A staircase of levels k = 0..32, each a line (30) lower and a column (140 wide, 20 gutters) further
    # right: level k is a title across it and everything right of it, over its column C_k (down to the
    # page's bottom) beside level k+1. No gutter runs the level's height (its title crosses them): its bands
    # are read, the title's alone, then the run under it (a level), cut into C_k and level k+1 (a level).
    # Level k is at depth 2k: the run under level 32's title is at depth 65, past MAX_DEPTH: read as rows.
    right = 160 * 34 + 140
    titles = [line(160 * k, 30 * k, right - 160 * k) for k in range(33)]
    bottom = 30 * 33 + 90  # the last two columns' 4 lines
    cols = [column(160 * k, 30 * (k + 1), [140] * ((bottom - 30 * (k + 1)) // 30 + 1)) for k in range(33)]
    cols += [column(160 * 33, 30 * 33, [140] * 4), column(160 * 34, 30 * 33, [140] * 4)]
    boxes = [b for group in (titles, *cols) for b in group]
    expected = [b for k in range(32) for b in [titles[k], *cols[k]]] + [titles[32]]
    expected += [b for row in zip(cols[32], cols[33], cols[34], strict=True) for b in row]
    assert ordered(boxes) == expected


@pytest.mark.parametrize(("levels", "columns"), [(64, True), (65, False)], ids=["64-heads", "65-heads"])
def test_running_heads_nested_to_the_depth_guard(levels, columns):
    # Rows of two running heads (each over its column) 1 h apart over two columns: each level reads its top
    # row first and goes one deeper. Under 64 rows the columns are cut at depth 64 (MAX_DEPTH: still cut),
    # read one after the other; under 65, at depth 65 the guard reads them as rows.
    heads = [[line(50, 20 + 40 * k, 400), line(480, 20 + 40 * k, 400)] for k in range(levels)]
    top = 20 + 40 * levels
    left, right = column(50, top, [400] * 4), column(480, top, [400] * 4)
    boxes = [b for row in heads for b in row] + left + right
    tail = left + right if columns else by_rows_pairs(left, right)
    assert ordered(boxes) == [b for row in heads for b in row] + tail


def test_the_widest_gutter_is_cut_first():
    # 67 columns (3 prose lines each), the gutters narrowing left to right (30.5 down to 14: over 0.4 h)
    # while the columns widen (140 up to 206): the leftmost gutter is the widest, cut first, one column off
    # a level; after MAX_DEPTH levels the guard reads the last two columns as rows.
    cols, x = [], 10.0
    for c in range(67):
        cols.append(column(x, 100, [140 + c] * 3))
        x += 140 + c + 14 + 0.25 * (66 - c)
    boxes = [b for col in cols for b in col]
    assert ordered(boxes) == [b for col in cols[:65] for b in col] + by_rows_pairs(cols[65], cols[66])


def test_a_box_whose_middle_is_at_the_rows_top_is_in_the_row():
    # A row's first box (50-90, 100-120), a box of no height at its top (300-400, at 100) and a box lower
    # down (100-200, 105-125: its middle, 115, within the first's height): one row, left to right.
    boxes = [line(50, 100, 40), line(100, 105, 100), (300, 100, 400, 100)]
    assert row_order(boxes, range(3)) == [0, 1, 2]
    # And one whose middle is at its bottom (10-40 at 110-130: 120), left of it: first in the row.
    assert row_order([line(50, 100, 40), line(10, 110, 30)], range(2)) == [1, 0]


@pytest.mark.parametrize(
    "lines",
    [
        [(0, 1000), (600, 800), (100, 300)],
        [(0, 1000), (100, 300), (600, 800)],
        [(900, 1000), (300, 800), (0, 200)],
        [(0, 100), (200, 400), (500, 1000)],
    ],
    ids=["under-a-wide-line", "stepping-right-under-a-wide-line", "stepping-left", "stepping-right"],
)
def test_two_lines_side_by_side_under_another_are_a_group_of_their_own(lines):
    # Three lines one under another (pitch 30); the last two side by side with a gutter (200 wide or more,
    # 100 or more apart; the first line bridges it or is too narrow to make one): a run of their own, a
    # block apart from the first line's.
    boxes = [line(x0, 100 + 30 * k, x1 - x0) for k, (x0, x1) in enumerate(lines)]
    assert blocks(boxes) == [("text", [0]), ("text", [1, 2])]


# --- Blocks ---------------------------------------------------------------------------------------------


def test_a_band_of_two_narrow_rows_stays_in_its_paragraph():
    # A line, then a band of two rows (50-150 at 130-150; 300-350 at 145-165: its middle under the first's
    # bottom), 150 apart but the second under 6 h wide: no gutter, one block.
    boxes = [line(50, 100, 400), line(50, 130, 100), line(300, 145, 50)]
    assert blocks(boxes) == [("text", [0, 1, 2])]


def test_a_band_of_two_rows_with_a_gutter_is_a_group_of_its_own():
    # A line across (50-880), then a band of two rows side by side with a gutter (50-250 at 130-150;
    # 480-880 at 145-165), one line a side: a run of its own, a block apart from the line across.
    boxes = [line(50, 100, 830), line(50, 130, 200), line(480, 145, 400)]
    assert blocks(boxes) == [("text", [0]), ("text", [1, 2])]


def test_a_band_of_two_rows_with_a_gutter_over_a_line_is_a_group_of_its_own():
    # The same band first (50-250 at 130-150; 480-880 at 145-165), then a line under its left row (50-250 at
    # 170-190, 5 under the band): no gutter with two lines a side, one run of bands keeping a gutter, read
    # band by band: the band of two rows a group, a block, of its own; the line another.
    boxes = [line(50, 130, 200), line(480, 145, 400), line(50, 170, 200)]
    assert blocks(boxes) == [("text", [0, 1]), ("text", [2])]


def test_a_form_of_long_labels_and_values_is_one_table():
    # Labels and values both wide enough to be columns, paired row by row and ragged (a table, not
    # columns), each row a band: one group of rows, one table block.
    labels, values = [150, 260, 130, 310, 200, 170], [300, 180, 420, 150, 260, 330]
    boxes = [b for k, (lw, vw) in enumerate(zip(labels, values, strict=True))
             for b in (line(40, 40 + k * 30, lw), line(400, 40 + k * 30, vw))]  # fmt: skip
    assert blocks(boxes) == [("table", list(range(12)))]


def test_a_line_split_at_a_wide_space_stays_in_its_paragraph():
    # A paragraph of 5 lines, the third split by the detector at a 10 wide space (over 0.4 h, both pieces
    # over 6 h wide): one row, one block of text with the others.
    boxes = column(50, 100, [400] * 5)
    boxes[2:3] = [line(50, 160, 195), line(255, 160, 195)]
    assert blocks(boxes) == [("text", list(range(6)))]


@pytest.mark.parametrize(("gap", "paragraphs"), [(24, 1), (25, 2)], ids=["1.2h", "past-1.2h"])
def test_two_rows_part_at_single_spacing_plus_an_empty_line(gap, paragraphs):
    # Two rows only: the line spacing is SPACING (0.4 h = 8), a paragraph break a blank PARAGRAPH_GAP (0.8 h
    # = 16) wider: 24 is no break, 25 is.
    boxes = [line(50, 100, 400), line(50, 120 + gap, 400)]
    expected = [("text", [0, 1])] if paragraphs == 1 else [("text", [0]), ("text", [1])]
    assert blocks(boxes) == expected


def test_three_rows_part_at_their_own_spacing():
    # Three rows 30 apart (1.5 h): their median blank is the spacing; no break (24 over 8 would be).
    boxes = column(50, 100, [400] * 3, pitch=50)
    assert blocks(boxes) == [("text", [0, 1, 2])]


@pytest.mark.parametrize(("tall", "kind"), [(3, "title"), (4, "text")], ids=["3-rows", "4-rows"])
def test_a_title_has_at_most_three_rows(tall, kind):
    # Rows 30 high (1.5 h, over TITLE_HEIGHT 1.3 h) over 8 body lines (h = 20): TITLE_MAX_ROWS (3) of them
    # are a title; 4 are text.
    heads = column(50, 20, [600] * tall, pitch=40, h=30)
    body = column(50, 20 + 40 * tall + 30, [400] * 8)
    n = len(heads)
    assert blocks(heads + body) == [(kind, list(range(n))), ("text", list(range(n, n + 8)))]


@pytest.mark.parametrize(("height", "kind"), [(26, "title"), (25, "text")], ids=["1.3h", "under-1.3h"])
def test_the_title_height(height, kind):
    # A row TITLE_HEIGHT (1.3 h = 26) high, 54 over a body of 20 high lines: a title; 25 high, text.
    boxes = [line(50, 200, 600, height), *column(50, 280, [400] * 6)]
    assert blocks(boxes) == [(kind, [0]), ("text", list(range(1, 7)))]


@pytest.mark.parametrize(
    ("after", "tall", "kind"),
    [(2, False, "text"), (4, True, "text"), (3, True, "title")],
    ids=["2-rows", "4-tall-rows", "3-tall-rows"],
)
def test_rows_that_part_a_table_are_text(after, tall, kind):
    # Five rows of an item and its price (a table), a note across (wide: a row of one line over half the
    # width), then rows of one short line: 2 of them (too few to be a table), or 4 set large (too many to
    # be a title): text; 3 set large, a title.
    table = priced([True] * 5)
    note = [line(20, 40 + 26 * 5, 300)]
    rest = [line(20, 40 + 26 * 6 + 36 * k, 100, 30 if tall else H) for k in range(after)]
    boxes = table + note + rest
    assert blocks(boxes) == [
        ("table", list(range(10))),
        ("text", [10]),
        (kind, list(range(11, 11 + after))),
    ]


def test_the_title_height_is_counted_in_the_median_line_height():
    # Body lines 20 high (4) and 16 high (3): the median h is 20 (a third of the way up, 16). A heading 24
    # high is under 1.3 h = 26: text, a block of its own (54 above the body).
    heading = [line(50, 200, 600, 24)]
    body = [line(50, 278 + 30 * k, 400, 20 if k % 2 == 0 else 16) for k in range(7)]
    assert blocks(heading + body) == [("text", [0]), ("text", list(range(1, 8)))]


def test_a_median_height_of_zero_makes_no_title():
    # Two lines of no height and one 20 high: the median h is 0, nothing is taller than the body.
    boxes = [line(50, 100, 400, 0), line(50, 130, 400, 0), line(50, 160, 400)]
    assert blocks(boxes) == [("text", [0, 1, 2])]


def priced(rows: list[bool], gap: float = 230) -> list[tuple]:
    """A receipt's rows: an item (100 wide), and when its row says so a price (50 wide) `gap` right of it."""
    out = []
    for k, with_price in enumerate(rows):
        out.append(line(20, 40 + 26 * k, 100))
        if with_price:
            out.append(line(120 + gap, 40 + 26 * k, 50))
    return out


@pytest.mark.parametrize(
    ("rows", "kind"),
    [([True, False, True, False], "table"), ([True, False, True, False, False], "text")],
    ids=["2-of-4", "2-of-5"],
)
def test_the_table_cell_share(rows, kind):
    # A group is a table when TABLE_CELL_SHARE (half) of its rows hold two cells: 2 of 4 rows, a table; 2
    # of 5, text.
    boxes = priced(rows)
    assert blocks(boxes) == [(kind, list(range(len(boxes))))]


@pytest.mark.parametrize(("gap", "kind"), [(20, "table"), (19, "text")], ids=["1h", "under-1h"])
def test_the_cell_gap(gap, kind):
    # Boxes of a row CELL_GAP (1 h = 20) apart are two cells: 3 rows of two, a table; 19 apart, one cell.
    boxes = priced([True] * 3, gap)
    assert blocks(boxes) == [(kind, list(range(6)))]


def header_page(rows: int, height: float) -> list[tuple]:
    head = column(50, 10, [200] * rows, pitch=25)
    return head + column(50, 150, [400] * 6)


def test_blocks_after_a_table():
    # Three rows of an item (20-500) and its price (700-750), then two columns: the table, then each
    # column, a block each.
    table = [b for k in range(3) for b in (line(20, 40 + 26 * k, 480), line(700, 40 + 26 * k, 50))]
    left, right = column(50, 150, [400] * 4), column(480, 150, [400] * 4)
    assert blocks(table + left + right) == [
        ("table", list(range(6))),
        ("text", list(range(6, 10))),
        ("text", list(range(10, 14))),
    ]


@pytest.mark.parametrize(("rows", "kind"), [(2, "header"), (3, "text")], ids=["2-rows", "3-rows"])
def test_a_header_has_at_most_two_rows(rows, kind):
    # Rows 25 apart at the top of a page 1000 high (the band: 100): MARGIN_MAX_ROWS (2) of them are a header,
    # 3 are text (the body under them, a blank of 150 - 85 away).
    boxes = header_page(rows, 1000)
    assert blocks(boxes, 1000) == [(kind, list(range(rows))), ("text", list(range(rows, rows + 6)))]


@pytest.mark.parametrize(("top", "kind"), [(40, "header"), (41, "text")], ids=["at-band", "past-band"])
def test_a_header_ends_within_the_top_band(top, kind):
    # A page 600 high: MARGIN_BAND (0.1) is 60; a line 40-60 is a header, one 41-61 is not.
    boxes = [line(50, top, 200), *column(50, 150, [400] * 6)]
    assert blocks(boxes) == [(kind, [0]), ("text", list(range(1, 7)))]


@pytest.mark.parametrize(("top", "kind"), [(540, "footer"), (539, "text")], ids=["at-band", "past-band"])
def test_a_footer_starts_within_the_bottom_band(top, kind):
    boxes = [*column(50, 100, [400] * 6), line(440, top, 30)]
    assert blocks(boxes) == [("text", list(range(6))), (kind, [6])]


def test_a_header_lies_above_every_other_block():
    # Two columns: the left one opens with a line 10-30 standing apart (a paragraph of its own, in the top
    # band), but the right column starts at 20, beside it: no header.
    left = [line(50, 10, 400), *column(50, 60, [400] * 6)]
    right = column(480, 20, [400] * 7)
    got = blocks(left + right)
    assert got == [("text", [0]), ("text", list(range(1, 7))), ("text", list(range(7, 14)))]


def test_a_footer_lies_below_every_other_block():
    # A page 2000 high (band from 1800): a title, a left column down to 1900, a right column whose last
    # line (1850) stands apart in the band, yet above the left column's bottom: no footer.
    title = [line(50, 20, 830, 36)]
    left = column(50, 100, [400] * 61)  # 100 ... 1900 + 20
    right = column(480, 100, [400] * 10)
    last = [line(480, 1850, 100)]
    boxes = title + left + right + last
    n = len(boxes)
    got = blocks(boxes, 2000)
    assert got == [
        ("title", [0]),
        ("text", list(range(1, 62))),
        ("text", list(range(62, 72))),
        ("text", [n - 1]),
    ]


def test_the_page_height_is_1_by_default():
    # Boxes normalised to the page: a running head at the top (0.01-0.03), a page number at the bottom
    # (0.95-0.97), the page's height 1 unless told.
    boxes = [line(50, 10, 200), *column(50, 100, [400] * 6), line(440, 950, 30)]
    boxes = [tuple(v / 1000 for v in b) for b in boxes]
    got = [(b.type, b.lines) for b in page_layout(boxes)]
    assert got == [("header", [0]), ("text", list(range(1, 7))), ("footer", [7])]


@pytest.mark.parametrize("numbered", [True, False])
def test_a_title_over_a_table_and_a_number_under_it_are_blocks_of_their_own(numbered):
    # A table of 5 rows of three cells (100 wide, 150 apart, pitch 30), a short title 60 over it and a
    # page number 60 under it (blanks of 40 + 20: over twice the table's 10 and 0.4 h more): three blocks.
    title = [line(50, 100, 120)]
    cells = [line(50 + 150 * c, 180 + 30 * r, 100) for r in range(5) for c in range(3)]
    number = [line(200, 170 + 30 * 5 + 40, 30)] if numbered else []
    boxes = title + cells + number
    expected = [("text", [0]), ("table", list(range(1, 16)))] + ([("text", [16])] if numbered else [])
    assert blocks(boxes) == expected


def test_an_upright_tables_cells_are_given_on_the_page_as_sent():
    # The layout of the upright boxes, the boxes given back those sent (here 1000 to the right and 7 down):
    # the table's bbox and each cell's.
    upright = [line(50 + 150 * c, 100 + 30 * r, 100) for r in range(4) for c in range(3)]
    sent = [(x0 + 1000, y0 + 7, x1 + 1000, y1 + 7) for x0, y0, x1, y1 in upright]
    [table] = page_layout(sent, 600, upright=upright)
    assert (table.type, table.lines, table.bbox) == ("table", list(range(12)), (1050, 107, 1450, 217))
    assert table.table is not None
    assert [cell.bbox for cell in table.table.cells] == sent


# --- Deskew ---------------------------------------------------------------------------------------------

# A top edge along (1872, 150): 1878 long (1872² + 150² = 1878²), at atan(150 / 1872) = 4.5812...°.
EDGE = (1872.0, 150.0)
TILT = 4.58  # to a hundredth


def quad(y: float, top=EDGE, bottom=EDGE, height: float = 313.0) -> list[tuple[float, float]]:
    """top-left, top-right, bottom-right, bottom-left: the left edge straight down `height`."""
    return [(0.0, y), (top[0], y + top[1]), (bottom[0], y + height + bottom[1]), (0.0, y + height)]


def test_the_tilt_is_a_hundredth_of_a_degree():
    assert round(math.degrees(math.atan2(150, 1872)), 2) == TILT
    assert page_skew([quad(500 * k) for k in range(5)]) == TILT


def test_the_tilt_in_any_unit():
    # The same page in units 10000 times larger (a top edge 0.1872 across): the same tilt.
    quads = [[(x / 10000, y / 10000) for x, y in quad(500 * k, height=300.0)] for k in range(5)]
    assert page_skew(quads) == TILT


@pytest.mark.parametrize(("height", "tilt"), [(313.0, TILT), (314.0, 0.0)], ids=["6h", "under-6h"])
def test_the_long_line_limit(height, tilt):
    # SKEW_LINE_LENGTH is 6 h: lines 1878 long are long at h = 313 (6 h = 1878), not at h = 314 (1884).
    assert page_skew([quad(500 * k, height=height) for k in range(5)]) == tilt


@pytest.mark.parametrize(("lines", "tilt"), [(5, TILT), (4, 0.0)])
def test_the_long_lines_needed(lines, tilt):
    # SKEW_MIN_LINES (5) long lines give the tilt; 4 do not.
    assert page_skew([quad(500 * k) for k in range(lines)]) == tilt


@pytest.mark.parametrize("edge", ["top", "bottom"])
def test_an_edge_not_running_rightwards_leaves_its_line_out(edge):
    # 7 lines at 4.58°, and 5 whose one edge runs straight down (x does not grow along it) while the other
    # is at -3°. Counted, their 10 angles (5 at -3°, 5 at 90°) would leave 14 of 24 (under SKEW_AGREE's
    # 60 %) near the median: no tilt. Left out, the 7 lines give theirs.
    a = math.radians(-3)
    down, slant = (0.0, 1878.0), (1878 * math.cos(a), 1878 * math.sin(a))
    odd = {"top": dict(top=down, bottom=slant), "bottom": dict(top=slant, bottom=down)}[edge]
    quads = [quad(500 * k) for k in range(7)] + [quad(5000 + 2500 * k, **odd) for k in range(5)]
    assert page_skew(quads) == TILT


@pytest.mark.parametrize(("lines", "tilt"), [(5, TILT), (6, 0.0)], ids=["6-of-10", "7-of-12"])
def test_the_share_of_edges_that_agree(lines, tilt):
    # Edges within SKEW_TOLERANCE of the median, SKEW_AGREE (60 %) of them: 2 lines at 4.58°, 2 with their
    # top edge at 4.58° and bottom at 10°, the rest at 10°: 6 of 10 agree, the tilt; with one more line at
    # 10°, 7 of 12 (58 %): no tilt. (Lines 1878 long, 200 high: long whatever the heights' median.)
    a = math.radians(10)
    steep = (1878 * math.cos(a), 1878 * math.sin(a))
    kinds = [{}, {}, {"bottom": steep}, {"bottom": steep}] + [{"top": steep, "bottom": steep}] * (lines - 4)
    quads = [quad(500 * k, height=200.0, **kind) for k, kind in enumerate(kinds)]
    assert page_skew(quads) == tilt


def edge_at(degrees: float, height: float) -> tuple[float, float]:
    """An edge about 2000 across whose angle, as numpy computes it (page_skew's way) from a quad at y = 0
    `height` high, is `degrees` to the last bit, for its top edge (dy) and its bottom one ((height + dy) -
    height): dy on the grid of height + dy's ulp, nudged a step at a time, across a few widths."""
    for dx in range(2000, 2100):
        grid = math.ulp(height + dx * math.tan(math.radians(degrees)))
        base = round(dx * math.tan(math.radians(degrees)) / grid)
        for step in range(-50, 51):
            dy = (base + step) * grid
            if all(float(np.degrees(np.arctan2(y, dx))) == degrees for y in (dy, (height + dy) - height)):
                return float(dx), dy
    raise AssertionError(f"no edge at exactly {degrees}°")


@pytest.mark.parametrize(("off", "tilt"), [(1.5, 1.0), (1.51, 0.0)], ids=["0.5°", "past-0.5°"])
def test_edges_at_the_skew_tolerance_agree(off, tilt):
    # 6 lines at exactly 1° (12 edges: the median), 3 at 10° and 2 at `off`: the 1° edges alone are 12 of
    # 22 (55 %, under SKEW_AGREE's 60 %). At 1.5°, SKEW_TOLERANCE (0.5°) from the median, the 2 lines agree:
    # 16 of 22, the tilt is 1°; at 1.51° they do not: no tilt. (The lines lie on each other, all at y = 0:
    # the angles are counted, not where the lines stand.)
    angles = [1.0] * 6 + [10.0] * 3 + [off] * 2
    edges = {a: edge_at(a, 200.0) for a in set(angles)}
    quads = [quad(0.0, top=edges[a], bottom=edges[a], height=200.0) for a in angles]
    assert page_skew(quads) == tilt


def test_lines_of_no_height_give_no_tilt():
    # Five long edges at 4.58°, each line's top and bottom edge the same: no height to measure length in.
    assert page_skew([quad(500 * k, height=0.0) for k in range(5)]) == 0.0


@pytest.mark.parametrize("shape", [(6, 3, 2), (6, 4, 3), (6, 8)])
def test_polygons_not_of_four_points_give_no_tilt(shape):
    assert page_skew(np.ones(shape)) == 0.0


def turned(boxes: list[tuple], degrees: float) -> list[list[tuple[float, float]]]:
    a = math.radians(degrees)
    c, s = math.cos(a), math.sin(a)
    return [
        [(c * x - s * y, s * x + c * y) for x, y in [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]]
        for x0, y0, x1, y1 in boxes
    ]


@pytest.mark.parametrize(("degrees", "tilt"), [(0.1, 0.0), (0.11, 0.11)], ids=["at-floor", "past-floor"])
def test_the_skew_floor(degrees, tilt):
    # SKEW_FLOOR (0.1°) is read as it is; 0.11° is turned.
    assert page_skew(turned(column(50, 100, [400] * 6), degrees)) == tilt


def test_deskewed_turns_about_the_centre():
    # Turned by -90° about (100, 40), a point (100 + x, 40 + y) goes to (100 + y, 40 - x): the box
    # 110-130 x 50-60 (x 10-30, y 10-20 from the centre) becomes 110-120 x 10-30.
    quads = [[(110, 50), (130, 50), (130, 60), (110, 60)], [(100, 40), (104, 40), (104, 46), (100, 46)]]
    got = deskewed(quads, 90.0, (100.0, 40.0))
    assert got == [pytest.approx((110, 10, 120, 30)), pytest.approx((100, 36, 106, 40))]
    # By 30°: the corners of one box, each turned by -30° with the standard library.
    a = math.radians(-30)
    pts = [(20.0, 10.0), (80.0, 10.0), (80.0, 30.0), (20.0, 30.0)]
    turned_pts = [
        (7 + math.cos(a) * (x - 7) - math.sin(a) * (y - 3), 3 + math.sin(a) * (x - 7) + math.cos(a) * (y - 3))
        for x, y in pts
    ]
    xs, ys = [p[0] for p in turned_pts], [p[1] for p in turned_pts]
    [box] = deskewed([pts], 30.0, (7.0, 3.0))
    assert box == pytest.approx((min(xs), min(ys), max(xs), max(ys)))
