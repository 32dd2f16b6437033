"""Line boxes fitted to the page's gutters before recognition (ocr_app.engines.gutters): synthetic pages of
ink drawn with numpy (a line of text is a bar of ink 20 px tall with 6 px word spaces; its detector box the
ink padded by 8 px all round, as PP-OCR's detector pads: 36 px tall, the h the limits are counted in), the
pieces each box becomes worked out by hand from the rules as documented, at each limit and one past. Fast:
no engine, but for one rendered page read through rapidocr at the end.
"""

from __future__ import annotations

import itertools
import math

import jiwer
import numpy as np
import pytest
from PIL import Image

from ocr_app.engines import gutters
from ocr_app.engines.gutters import fitted_quads, gutter_pieces, ink_mask

INK, PAD, PITCH = 20, 8, 30  # a line's ink height, the detector's padding, the line pitch
H = INK + 2 * PAD  # 36: a box's height
LEFT = (60, 420)  # the left column's ink, x0 and x1 (exclusive)
RIGHT = (448, 808)  # the right column's: a gutter of 28 px (0.78 h), a newsletter's


def blank_page(width: int = 900, height: int = 420) -> np.ndarray:
    return np.full((height, width), 255, np.uint8)


def top(row: int) -> int:
    return 40 + row * PITCH


def text(page: np.ndarray, x0: int, x1: int, row: int, spaces: tuple[tuple[int, int], ...] = ()) -> None:
    """Ink from x0 to x1 on the row, with a 6 px word space every 47 px (shifted by row: no two rows'
    spaces line up) and the given (x, width) spaces."""
    y = top(row)
    page[y : y + INK, x0:x1] = 0
    for x in range(x0 + 20 + (row * 13) % 30, x1 - 10, 47):
        page[y : y + INK, x : x + 6] = 255
    for x, w in spaces:
        page[y : y + INK, x : x + w] = 255


def box(x0: float, x1: float, row: int) -> list[list[float]]:
    """The detector's quadrilateral of ink x0..x1 on the row: padded by PAD, clockwise from the top left."""
    return box_at(x0, x1, top(row))


def box_at(x0: float, x1: float, y: float) -> list[list[float]]:
    """The detector's quadrilateral of ink x0..x1 whose top is at y."""
    y0, y1 = y - PAD, y + INK + PAD
    return [[x0 - PAD, y0], [x1 + PAD, y0], [x1 + PAD, y1], [x0 - PAD, y1]]


def as_is(quads: list) -> list[list[tuple[float, float]]]:
    return [[(q[0][0], q[1][0])] for q in quads]


def both_ways(quads, page: np.ndarray) -> list[list[tuple[float, float]]]:
    """gutter_pieces of the page, checked against those of its mirror image (left and right swapped: x to
    width - x, each box's corners reordered clockwise again): the rules look at both sides of a gutter, and
    both ends of a box, alike, so the mirror's pieces are the page's mirrored."""
    q = np.asarray(quads, dtype=float)
    got = gutter_pieces(q, page)
    width = page.shape[1]
    mirrored = q[:, [1, 0, 3, 2]].copy()
    mirrored[..., 0] = width - mirrored[..., 0]
    flipped = gutter_pieces(mirrored, np.ascontiguousarray(page[:, ::-1]))
    want = [[pytest.approx((width - x1, width - x0)) for x0, x1 in reversed(row)] for row in got]
    assert flipped == want, "the mirror image's pieces are not the page's mirrored"
    return got


def two_columns(rows: int, right: tuple[int, int] = RIGHT) -> tuple[np.ndarray, list]:
    """Two columns of `rows` lines, each line's two halves joined in one box (the detector's mistake)."""
    page = blank_page()
    quads = []
    for r in range(rows):
        text(page, *LEFT, r)
        text(page, *right, r)
        quads.append(box(LEFT[0], right[1], r))
    return page, quads


def under_a_headline(right: int = RIGHT[0], height: int = 420) -> tuple[np.ndarray, list]:
    """A headline across the page (row 0: it crosses any gutter) over a line of two columns joined in one
    box across its gutter, from 420 to `right` (row 1)."""
    page = blank_page(height=height)
    text(page, 60, 808, 0)
    text(page, 60, 420, 1)
    text(page, right, 808, 1)
    return page, [box(60, 808, 0), box(60, 808, 1)]


def cut(right: int = RIGHT[0]) -> list:
    """The joined line's pieces, cut at its gutter (from 420 to `right`) MARGIN h (3.6) from the ink."""
    return [pytest.approx((52, 423.6)), pytest.approx((right - 3.6, 816))]


def test_lines_joined_across_a_narrow_gutter_are_split_there():
    # The gutter's blank runs 420-448 (28 wide >= GAP_MIN 0.5 h = 18) across every box, every row beside
    # it blank there with text both sides: each box is cut, its pieces keeping MARGIN 0.1 h = 3.6 of blank
    # beside their ink: 52-423.6 and 444.4-816.
    page, quads = two_columns(8)
    assert both_ways(quads, page) == [cut()] * 8


def test_the_pieces_are_cut_from_their_quadrilaterals_along_its_edges():
    # A quad tilted along its top and bottom edges: (0, 10) -> (100, 20) on top, (0, 40) -> (100, 50) below.
    # Pieces 0-30 and 60-100: the top edge at x 30 is y 13, at 60 y 16; the bottom 43 and 46. An untouched
    # box comes back as it was.
    quad = [[0, 10], [100, 20], [100, 50], [0, 40]]
    other = [[200, 0], [300, 0], [300, 30], [200, 30]]
    got, source = fitted_quads(np.asarray([quad, other]), [[(0, 30), (60, 100)], [(200, 300)]])
    assert source == [0, 0, 1]
    want = [
        [[0, 10], [30, 13], [30, 43], [0, 40]],
        [[60, 16], [100, 20], [100, 50], [60, 46]],
        other,
    ]
    np.testing.assert_allclose(got, np.asarray(want, dtype=float))


def test_an_untouched_box_comes_back_bit_for_bit():
    # fit_gutters keeps the detection (and its crops) when nothing changed, which it tells by equality: a box
    # left as it is must not be recomputed along its edges (a + 1.0 * (b - a) is not always b in floats).
    rng = np.random.default_rng(3)
    quads = np.sort(rng.uniform(0, 1000, (50, 4, 2)), axis=1)
    quads[:, [0, 3], 0], quads[:, [1, 2], 0] = quads[:, [0, 1], 0], quads[:, [2, 3], 0]
    got, source = fitted_quads(quads, [[(float(q[:, 0].min()), float(q[:, 0].max()))] for q in quads])
    assert source == list(range(50))
    assert np.array_equal(got, quads)


def test_a_piece_of_a_leaning_box_ends_on_its_corners():
    # A parallelogram leaning right: top (20, 0)-(120, 0), bottom (0, 30)-(100, 30); its x runs 0-120. A piece
    # from 0 to 60 starts before the top edge does (x 20): its top-left corner stays the box's, (20, 0), and
    # one from 60 to 120 ends past the bottom edge's end (x 100): its bottom-right stays (100, 30).
    quad = [[20, 0], [120, 0], [100, 30], [0, 30]]
    got, _ = fitted_quads(np.asarray([quad]), [[(0, 60), (70, 120)]])
    want = [[[20, 0], [60, 0], [60, 30], [0, 30]], [[70, 0], [120, 0], [100, 30], [70, 30]]]
    np.testing.assert_allclose(got, np.asarray(want, dtype=float))


@pytest.mark.parametrize(("right_end", "split"), [(156, True), (155, False)])
def test_a_box_is_fitted_only_when_it_is_two_heights_long(right_end, split):
    # Eight short lines of two words, ink 100-118 and 138-right_end, a 20 px gutter (0.56 h) between in every
    # row. Boxes 92-164 are 72 px long, 2 h: each is cut at the gutter, its pieces keeping 3.6 px of blank
    # (92-121.6, 134.4-164); boxes 92-163, one px under 2 h, are a word's and left as they are.
    page = blank_page()
    quads = []
    for r in range(8):
        text(page, 100, 118, r)
        text(page, 138, right_end, r)
        quads.append(box(100, right_end, r))
    want = [[(92, 121.6), (134.4, 164)]] * 8 if split else as_is(quads)
    assert both_ways(quads, page) == [[pytest.approx(p) for p in row] for row in want]


def test_a_wide_word_space_in_one_column_is_not_split():
    # One column 60-808; the fourth line has a 30 px space (0.83 h) at 400: the lines above and below have
    # ink there (their 6 px spaces cannot blank the 11 px middle): no gutter, nothing moves.
    page = blank_page()
    quads = []
    for r in range(8):
        text(page, 60, 808, r, ((400, 30),) if r == 3 else ())
        quads.append(box(60, 808, r))
    assert both_ways(quads, page) == as_is(quads)


def test_wide_word_spaces_on_every_line_that_do_not_line_up_are_not_split():
    # Loosely set lines: a 24 px space (0.67 h) on every line, each 60 px right of the one above.
    page = blank_page()
    quads = []
    for r in range(8):
        text(page, 60, 808, r, ((200 + 60 * r, 24),))
        quads.append(box(60, 808, r))
    assert both_ways(quads, page) == as_is(quads)


@pytest.mark.parametrize(("river", "split"), [(4, [0, 3]), (3, [])], ids=["4-lines", "3-lines"])
def test_the_rows_a_side_must_show(river, split):
    # A 24 px space at 400 on `river` lines one under the other (rows 2..), the lines around with ink there.
    # Blank on ROWS (3) rows under it, the river's first line is a gutter (and its last, 3 blank above): a
    # river four lines long is split at its ends, the two in between see a crossing row on each side. Three
    # lines long, no line has three blank rows on one side: nothing is split.
    page = blank_page()
    quads = []
    for r in range(9):
        text(page, 60, 808, r, ((400, 24),) if 2 <= r < 2 + river else ())
        quads.append(box(60, 808, r))
    want = as_is(quads)
    for k in split:  # the space 400-424 (margin 3.6): 52-403.6 and 420.4-816
        want[2 + k] = [(52, 403.6), (420.4, 816)]
    assert both_ways(quads, page) == [[pytest.approx(p) for p in row] for row in want]


@pytest.mark.parametrize(("rows_under", "split"), [(2, True), (1, False)], ids=["2-rows", "1-row"])
def test_the_rows_that_must_count(rows_under, split):
    # A headline across the page (row 0: ink 60-808 crosses the gutter), then the story's first line joined
    # across its gutter (row 1), then `rows_under` rows each in two boxes (the detector parted them). Above:
    # the headline crosses. Under: MIN_ROWS (2) blank rows confirm the gutter; one does not. The boxes under
    # never see MIN_ROWS blank rows on a side (the headline crosses above): they stay as they are.
    page, quads = under_a_headline()
    for r in range(2, 2 + rows_under):
        text(page, *LEFT, r)
        text(page, *RIGHT, r)
        quads += [box(*LEFT, r), box(*RIGHT, r)]
    want = as_is(quads)
    if split:
        want[1] = [(52, 423.6), (444.4, 816)]
    assert both_ways(quads, page) == [[pytest.approx(p) for p in row] for row in want]


@pytest.mark.parametrize(("gutter", "split"), [(18, True), (17, False)], ids=["0.5h", "under"])
def test_the_gutter_width_limit(gutter, split):
    # GAP_MIN: a blank 0.5 h = 18 wide is a gutter (pieces 52-423.6 and 434.4-816); 17 is a word space,
    # however it lines up.
    page, quads = two_columns(6, right=(420 + gutter, 808))
    got = both_ways(quads, page)
    assert got == ([cut(420 + gutter)] * 6 if split else as_is(quads))


def story_over(page: np.ndarray, quads: list, rows: list[int], left: tuple[int, int], right: tuple[int, int]):
    """Rows of two columns (ink left and right), each line in two boxes."""
    for r in rows:
        text(page, *left, r)
        text(page, *right, r)
        quads += [box(*left, r), box(*right, r)]


@pytest.mark.parametrize(
    ("left", "right", "split"),
    [
        # The joined line's gutter is 420-438 (0.5 h: its middle is taken at 429 alone, the run no wider
        # than 2 (EDGE + CORE / 2) h). CORE: the middle 0.3 h (429 +- 5.4: columns whose centre lies in
        # 423.6-434.4, 424 to 433) must be blank in the rows that confirm it: ink to 423 leaves it blank, to
        # 424 crosses it; on the right, ink from 434 leaves it, from 433 crosses.
        ((60, 424), (434, 808), True),
        ((60, 425), (434, 808), False),
        ((60, 420), (433, 808), False),
        # REACH: a row counts when its text reaches within 1.5 h (54) of that middle on both sides: ink in
        # a column whose centre lies in 369.6-423.6 (370 to 423) on the left, 434.4-488.4 (434 to 487) on
        # the right. A row whose text stops short tells nothing: only the headline is left, and it crosses.
        ((60, 371), (438, 808), True),
        ((60, 370), (438, 808), False),
        ((60, 420), (487, 808), True),
        ((60, 420), (488, 808), False),
    ],
    ids=["core", "core-left-past", "core-right-past", "reach-left", "reach-left-past", "reach-right",
         "reach-right-past"],
)  # fmt: skip
def test_the_rows_that_confirm_a_gutter(left, right, split):
    # Row 0: a headline across (it crosses); row 1: the joined line, the gutter 420-438; rows 2 and 3 under
    # it, their own columns as given (in two boxes each). Split: 52-423.6 and 434.4-816.
    page, quads = under_a_headline(438)
    story_over(page, quads, [2, 3], left, right)
    got = both_ways(quads, page)
    assert got[1] == (cut(438) if split else as_is(quads)[1])


def test_a_short_last_line_joined_to_the_next_column_is_split_at_the_gutter():
    # Row 3's left line is a paragraph's short last one (60-200), joined with the right column's line: its
    # blank run 200-448 is wider than the gutter, which lies at its far end: the middle taken EDGE h in
    # from that end (448 - 9 = 439) is blank in the rows around, whose text reaches it from both sides.
    # Every other row: the gutter 420-448 as before.
    page = blank_page()
    quads = []
    for r in range(8):
        text(page, 60, 200 if r == 3 else 420, r)
        text(page, *RIGHT, r)
        quads.append(box(60, 808, r))
    want = [[(52, 423.6), (444.4, 816)]] * 8
    want[3] = [(52, 203.6), (444.4, 816)]
    assert both_ways(quads, page) == [[pytest.approx(p) for p in row] for row in want]


def rows_at(page: np.ndarray, quads: list, dys: tuple[int, ...], right: tuple[int, int] = RIGHT) -> None:
    """Lines of two columns (LEFT and right) whose middles lie dys under row 1's, each in two boxes."""
    for dy in dys:
        y = top(1) + dy
        for x0, x1 in (LEFT, right):
            page[y : y + INK, x0:x1] = 0
            quads.append(box_at(x0, x1, y))


@pytest.mark.parametrize(("second", "split"), [(180, True), (181, False)], ids=["5h", "past"])
def test_the_window_rows_are_looked_for_in(second, split):
    # WINDOW: rows count within 5 h (180) of the joined line's middle. The line on row 1 (middle 80); rows
    # under it in two boxes each, their middles 150 and `second` below. The line 181 away is too far: one
    # row is under MIN_ROWS.
    page, quads = under_a_headline(height=500)
    rows_at(page, quads, (150, second))
    got = both_ways(quads, page)
    assert got[1] == (cut() if split else as_is(quads)[1])


def test_box_ends_overhanging_a_gutter_are_pulled_back():
    # Six rows the detector parted at the gutter, each side padded by 8: the boxes leave 428-440 between
    # them, 12 px (0.33 h: under the layout's GUTTER_MIN). The left boxes' right ends come back to the ink +
    # 3.6 (423.6), the right boxes' left ends to 444.4: the blank between them is 20.8 (0.58 h).
    page = blank_page()
    quads: list = []
    story_over(page, quads, list(range(6)), LEFT, RIGHT)
    assert both_ways(quads, page) == [
        [pytest.approx(p)] for _ in range(6) for p in ((52, 423.6), (444.4, 816))
    ]


def test_an_end_beside_a_wide_blank_is_pulled_back_where_the_rows_show_a_gutter():
    # Row 2's right line is set in (600-808), beyond reach (1.5 h) of the left line's end: its left box's
    # blank runs to the end of its scan (420 to 428 + 54), and the gutter at its start (429) is blank in
    # the rows around: that end comes back to 423.6 all the same. The indented box's own left end faces
    # the right column's text in the rows around (crossed at 591): it stays.
    page = blank_page()
    quads: list = []
    story_over(page, quads, [0, 1], LEFT, RIGHT)
    story_over(page, quads, [2], LEFT, (600, 808))
    story_over(page, quads, [3, 4, 5], LEFT, RIGHT)
    want = [[(52, 423.6)], [(444.4, 816)]] * 6
    want[5] = [(592, 816)]
    assert both_ways(quads, page) == [[pytest.approx(p) for p in row] for row in want]


@pytest.mark.parametrize(("end", "moved"), [(423.7, True), (423.5, False)], ids=["over", "within"])
def test_an_end_is_pulled_back_only_when_it_reaches_past_the_margin(end, moved):
    # The left boxes end at `end`: past 423.6 (the ink + MARGIN) it comes back to 423.6; within it stays (a
    # tight box is not widened).
    page = blank_page()
    quads: list = []
    story_over(page, quads, list(range(6)), LEFT, RIGHT)
    for q in quads[::2]:
        q[1][0] = q[2][0] = end
    got = both_ways(quads, page)
    assert [p[0][1] for p in got[::2]] == [pytest.approx(423.6 if moved else end)] * 6
    assert [p[0][0] for p in got[1::2]] == [pytest.approx(444.4)] * 6


@pytest.mark.parametrize(("x1", "pieces"), [(448.5, 2), (448.4, 1)], ids=["on-the-centre", "short-of-it"])
def test_a_box_holds_the_columns_whose_centre_it_reaches(x1, pieces):
    # The joined boxes end at x1, by the right column's first ink column (448, its centre 448.5). Reaching
    # that centre, the box holds ink past the gutter: it is split there (52-423.6 and 444.4-448.5). Short of
    # it, its ink ends at 419 and the gutter is its overhang: that end is pulled back to 423.6.
    page, quads = two_columns(8)
    for q in quads:
        q[1][0] = q[2][0] = x1
    want = [[(52, 423.6), (444.4, x1)] if pieces == 2 else [(52, 423.6)]] * 8
    assert both_ways(quads, page) == [[pytest.approx(p) for p in row] for row in want]


def test_a_word_space_before_the_gutter_does_not_stop_the_search():
    # Row 3 has a 30 px space at 200 (0.83 h, wide enough to be looked at) where the rows around have ink:
    # not a gutter; the real one after it, 420-448, is still found and cut.
    page = blank_page()
    quads = []
    for r in range(8):
        text(page, *LEFT, r, ((200, 30),) if r == 3 else ())
        text(page, *RIGHT, r)
        quads.append(box(LEFT[0], RIGHT[1], r))
    assert both_ways(quads, page) == [cut()] * 8


@pytest.mark.parametrize("short_end", [422, 428], ids=["26-wide", "20-wide"])
def test_a_run_just_wider_than_two_insets_is_looked_at_from_its_ends(short_end):
    # Row 3's left text ends at short_end; its run to the right column (448) is 26 or 20 px, over 2 (EDGE +
    # CORE / 2) h = 18: looked at in three places, its centre and 9 in from each end. The rows around end
    # their left text at 434 (a 14 px space, under GAP_MIN: they are not cut): ink in the core of the run's
    # centre (435 or 438), blank in the far end's (439: columns 434-443) with text both sides. Only that one
    # confirms row 3's gutter: it is split at short_end + 3.6 and 444.4.
    page = blank_page()
    quads = []
    for r in range(8):
        text(page, 60, short_end if r == 3 else 434, r)
        text(page, *RIGHT, r)
        quads.append(box(60, 808, r))
    want = as_is(quads)
    want[3] = [(52, short_end + 3.6), (444.4, 816)]
    assert both_ways(quads, page) == [[pytest.approx(p) for p in row] for row in want]


@pytest.mark.parametrize(("angle", "gutter"), [(1.5, 28), (4.0, 28), (4.0, 21)])
def test_a_tilted_page_is_split_at_its_gutter(angle, gutter):
    # The two-column page turned 1.5 degrees (its columns drift 0.8 px a line, a box's ends 20 px apart in
    # height) and 4 (2.1 px a line; a box's ends 53 px apart, more than a line's pitch), boxes turned with it:
    # each joined box is cut once, between the left column's ink and the right one's on its row. The gutter
    # stays blank in a row read level instead of along its tilt at 28 px; at 21 (0.58 h) the rows 3 lines
    # away drift 6 px from the gutter's middle, and its core (10.8 px) reaches into their ink unless each is
    # looked at along the tilt.
    page, quads = two_columns(8, right=(420 + gutter, 808))
    got = both_ways(*turn(page, quads, angle))
    for r, pieces in enumerate(got):
        assert len(pieces) == 2, r
        cut_at_the_gutter(page, angle, gutter, top(r) + INK / 2, pieces)


def turn(page: np.ndarray, quads: list, angle: float) -> tuple[np.ndarray, np.ndarray]:
    """The boxes and the page turned by angle degrees about its centre (counterclockwise on screen)."""
    turned = np.asarray(Image.fromarray(page).rotate(angle, Image.Resampling.NEAREST, fillcolor=255))
    a = np.radians(angle)
    cx, cy = page.shape[1] / 2, page.shape[0] / 2
    q = np.asarray(quads, dtype=float)
    x, y = q[..., 0] - cx, q[..., 1] - cy
    q = np.stack([np.cos(a) * x + np.sin(a) * y + cx, -np.sin(a) * x + np.cos(a) * y + cy], axis=-1)
    return q, turned


def cut_at_the_gutter(page: np.ndarray, angle: float, gutter: int, yc: float, pieces: list) -> None:
    """That two pieces part at the gutter from 420, `gutter` wide, of a line centred at yc, turned: its
    middle's x is cx + cos a (420 + gutter / 2 - cx) + sin a (yc - cy)."""
    a, cx, cy = np.radians(angle), page.shape[1] / 2, page.shape[0] / 2
    half = gutter / 2
    middle = cx + np.cos(a) * (420 + half - cx) + np.sin(a) * (yc - cy)
    assert middle - half < pieces[0][1] < middle - 4 and middle + 4 < pieces[1][0] < middle + half


@pytest.mark.parametrize("gutter", [20, 21])
def test_rows_far_under_a_tilted_line_are_read_along_the_tilt(gutter):
    # A page turned 5 degrees: a headline across (row 0), a line joined across its gutter (row 1), and the
    # only rows under it 150 and 178 px down (within WINDOW's 5 h): the gutter has drifted 13 and 15.6 px
    # along its rows there, against a blank of 20-21 px around a core of 10.8. Looked at along the line's
    # tilt (the mean of its edges' slopes), the rows show the gutter; two thirds of it leaves the farther
    # row's core in ink.
    page, quads = under_a_headline(420 + gutter, height=500)
    rows_at(page, quads, (150, 178), (420 + gutter, 808))
    got = both_ways(*turn(page, quads, 5.0))
    assert len(got[1]) == 2
    cut_at_the_gutter(page, 5.0, gutter, top(1) + INK / 2, got[1])


def test_no_boxes_and_a_blank_page():
    assert gutter_pieces(np.zeros((0, 4, 2)), blank_page()) == []
    quads = [box(60, 808, 0)]
    assert gutter_pieces(np.asarray(quads), blank_page()) == as_is(quads)  # no ink: nothing to fit


def test_ink_is_the_darker_of_the_pages_two_grey_levels():
    # Paper 230 +- 10, ink 40 +- 10 (a noisy scan): Otsu's threshold falls between, the ink is the ink.
    rng = np.random.default_rng(7)
    want = np.zeros((50, 80), bool)
    want[10:30, 5:60] = True
    grey = np.where(want, 40, 230) + rng.integers(-10, 11, want.shape)
    assert (ink_mask(grey.astype(np.uint8)) == want).all()
    colour = np.repeat(grey.astype(np.uint8)[..., None], 3, axis=2)
    assert (ink_mask(colour) == want).all()
    # Colour: ink darker than the paper in the channels' mean only (means 173 and 127 on each page), the
    # ink brighter than the paper in some channel: a sum weighting a channel twice, or subtracting one,
    # calls the paper the ink on one of the pages.
    pages = [
        ((250, 150, 120), (10, 120, 250)),
        ((120, 150, 250), (250, 120, 10)),
        ((120, 250, 150), (200, 10, 170)),
    ]
    for paper, dark in pages:
        colour = np.where(want[..., None], np.asarray(dark, np.uint8), np.asarray(paper, np.uint8))
        assert (ink_mask(colour) == want).all(), (paper, dark)
    for level in (0, 128, 255):  # one grey level, black included: nothing to part, no ink
        assert not ink_mask(np.full((20, 20), level, np.uint8)).any(), level
        assert not ink_mask(np.full((20, 20, 3), level, np.uint8)).any(), level


def test_runs_need_ink_on_both_sides():
    blank = np.asarray([True, True, False, True, True, False, False, True, False, True])
    assert gutters._runs(blank) == [(3, 5), (7, 8)]
    assert gutters._runs(np.asarray([True, True])) == []
    assert gutters._runs(np.asarray([False, True, False])) == [(1, 2)]


def test_runs_whose_ends_differ():
    # A blank start without a blank end and the other way round: the run at the array's edge has ink on one
    # side only (each end looked at on its own side).
    assert gutters._runs(np.asarray([True, False, True, False])) == [(2, 3)]
    assert gutters._runs(np.asarray([False, True, False, True])) == [(1, 2)]
    assert gutters._runs(np.asarray([True, False, False, True, True, False])) == [(3, 5)]


# --- The geometry under the rules, against brute force -------------------------------------------------


def edge_y(a, b, x: float) -> float:
    """The edge through a and b at x, by hand; an edge that does not run rightwards is taken level."""
    if b[0] <= a[0]:
        return float(a[1])
    return float(a[1] + (x - a[0]) * (b[1] - a[1]) / (b[0] - a[0]))


# Clockwise from the top left; tilted boxes whose top and bottom slopes differ, and edges of no width or
# running left by under a pixel (taken level) or rightwards by half a pixel (followed).
QUADS = [
    [[10, 20], [110, 30], [112, 55], [12, 40]],
    [[5, 60], [205, 40], [203, 75], [3, 90]],
    [[50, 7], [50, 9], [50.5, 30], [50, 28]],
    [[40, 3], [39.5, 1], [39.5, 21], [40, 25]],
    [[60, 10], [60.5, 12], [60, 30], [60, 30]],
]


def test_a_boxs_edges_are_followed_along_its_tilt():
    for q in QUADS:
        box = gutters._Quad(np.asarray(q, dtype=float))
        tl, tr, br, bl = q
        assert (box.x0, box.x1) == (min(p[0] for p in q), max(p[0] for p in q))
        assert box.h == pytest.approx((math.dist(tl, bl) + math.dist(tr, br)) / 2)
        for x in (-7.0, 0.0, 10.25, 55.5, 110.0, 300.0):
            assert float(box.top(np.asarray(x))) == pytest.approx(edge_y(tl, tr, x)), (q, x)
            assert float(box.bottom(np.asarray(x))) == pytest.approx(edge_y(bl, br, x)), (q, x)
            assert box.middle(x) == pytest.approx((edge_y(tl, tr, x) + edge_y(bl, br, x)) / 2), (q, x)


def test_the_pages_boxes_as_arrays_agree_with_each_box():
    lines = gutters._Lines(np.asarray(QUADS, dtype=float))
    for x in (0.0, 33.3, 150.0):
        want = [(edge_y(q[0], q[1], x) + edge_y(q[3], q[2], x)) / 2 for q in QUADS]
        assert lines.middles(x).tolist() == pytest.approx(want), x
    assert lines.x0.tolist() == [min(p[0] for p in q) for q in QUADS]
    assert lines.x1.tolist() == [max(p[0] for p in q) for q in QUADS]


def brute_ink(ink: np.ndarray, x: int, top: float, bottom: float) -> int:
    """Ink in column x over the rows whose index lies in [top, bottom], on the page."""
    return sum(int(ink[y, x]) for y in range(ink.shape[0]) if top <= y <= bottom)


def test_ink_counts_over_any_rows_match_a_count_pixel_by_pixel():
    rng = np.random.default_rng(7)
    ink = rng.random((30, 20)) < 0.2
    page = gutters._Page(ink)
    xs = np.arange(20)
    for _ in range(50):
        top, bottom = rng.uniform(-5, 35, 20), rng.uniform(-5, 35, 20)
        got = page.counts(xs, top, bottom)
        assert got.tolist() == [brute_ink(ink, x, top[x], bottom[x]) for x in xs]


def test_a_rows_inked_columns_match_a_walk_along_its_edges():
    rng = np.random.default_rng(11)
    ink = rng.random((120, 230)) < 0.01  # sparse: columns with one inked pixel in the row
    ink[25, 0] = ink[70, 0] = ink[50, 229] = True  # the page's first and last columns inked in both rows
    page = gutters._Page(ink)
    for q in QUADS[:2]:
        box = gutters._Quad(np.asarray(q, dtype=float))
        tl, tr, br, bl = q
        inked = [brute_ink(ink, x, edge_y(tl, tr, x + 0.5), edge_y(bl, br, x + 0.5)) > 0 for x in range(230)]
        row = page.row(box)
        assert row.tolist() == [0, *itertools.accumulate(map(int, inked))], q
        assert any(brute_ink(ink, x, 0, 120) == 1 for x in range(230) if inked[x])
        assert inked[0] and inked[229], q
        ends = [(-1, 0), (0, 0), (229, 229), (229, 240)]  # the page's first and last columns alone
        spans = [(f, f + d) for f in range(-3, 234, 7) for d in (-2, -1, 0, 1, 2, 3, 40, 300)]
        for first, last in ends + spans:
            want = any(inked[x] for x in range(max(first, 0), min(last, 229) + 1))
            assert page.inked(row, first, last) is want, (first, last)


def test_a_point_along_an_edge_by_hand():
    # The edge's point at x, its ends past it; a vertical edge's top. Edges whose one coordinate equals the
    # other end's other coordinate (b's y is a's x; b's x is a's y): x and y are not mixed up.
    cases = [
        (((10, 20), (110, 40)), 60, (60, 30)),
        (((10, 20), (110, 40)), 0, (10, 20)),
        (((10, 20), (110, 40)), 200, (110, 40)),
        (((10, 20), (10, 60)), 30, (10, 20)),
        (((40, 5), (100, 40)), 70, (70, 22.5)),
        (((10, 100), (100, 50)), 55, (55, 75)),
    ]
    for (a, b), x, want in cases:
        got = gutters._along(np.asarray(a, dtype=float), np.asarray(b, dtype=float), x)
        assert got.tolist() == pytest.approx(list(want)), (a, b, x)


def test_a_box_with_one_piece_moved_is_cut_to_it():
    # One piece that is not the box's whole width (an end pulled back): cut along the edges, not kept.
    quad = [[0, 10], [100, 20], [100, 50], [0, 40]]
    got, source = fitted_quads(np.asarray([quad]), [[(20.0, 100.0)]])
    assert source == [0]
    np.testing.assert_allclose(got, np.asarray([[[20, 12], [100, 20], [100, 50], [20, 42]]], dtype=float))
    with pytest.raises(ValueError, match="shorter"):  # pieces for fewer boxes: a caller's mistake
        fitted_quads(np.asarray([quad, quad]), [[(20.0, 100.0)]])


@pytest.mark.parametrize(
    ("height", "length", "long"),
    [
        (0.0, 10.0, False),
        (8.0, 16.0, True),
        (8.0, 15.9, False),
        (7.9, 100.0, False),
        (36.0, 72.0, True),
        (36.0, 71.9, False),
    ],
)
def test_a_box_is_long_at_two_heights_and_at_least_min_height_tall(height, length, long):
    # Two heights long, and MIN_HEIGHT (8 px) tall: a box 7.9 px tall is left as it is however long.
    quad = [[5, 5], [5 + length, 5], [5 + length, 5 + height], [5, 5 + height]]
    assert gutters._long(gutters._Quad(np.asarray(quad, dtype=float))) is long


# --- Through the engine --------------------------------------------------------------------------------

GUTTER = 30  # px between the columns' text at 30 px type: about 0.7 of the detector's line box height


def justified(columns: list[list[str]], gutter: int = GUTTER, size: int = 30) -> Image.Image:
    """Text columns set justified (each line's words spread to the column's full width, as a newsletter
    sets them) on shared baselines, `gutter` px apart: the page the detector reads across."""
    from PIL import ImageDraw

    from .docs import font_for

    font, margin, width, pitch = font_for("en", size), 60, 1400, size * 4 // 3
    column = (width - 2 * margin - gutter * (len(columns) - 1)) // len(columns)
    image = Image.new("RGB", (width, 2 * margin + pitch * max(map(len, columns))), "white")
    draw = ImageDraw.Draw(image)
    for c, lines in enumerate(columns):
        x0 = margin + c * (column + gutter)
        for k, line in enumerate(lines):
            words = line.split()
            lengths = [font.getlength(w) for w in words]
            assert sum(lengths) + 4 * (len(words) - 1) <= column, f"{line!r} is wider than its column"
            space = (column - sum(lengths)) / (len(words) - 1)
            x = float(x0)
            for word, length in zip(words, lengths, strict=True):
                draw.text((round(x), margin + k * pitch), word, fill="black", font=font)
                x += length + space
    return image


def test_columns_the_detector_joins_are_read_column_by_column(engine, monkeypatch):
    from ocr_app.engines.rapidocr import orientation

    from .docs import ARTICLE

    image = justified(ARTICLE["columns"])
    expected = " ".join(line for column in ARTICLE["columns"] for line in column)
    got = " ".join(line.text for line in engine._run(image).lines)
    # Without the fitting (the detector's boxes as they are) the same page reads across the columns.
    monkeypatch.setattr(orientation, "fit_gutters", lambda inst, img, det_res, crops: crops)
    joined = " ".join(line.text for line in engine._run(image).lines)
    after, before = jiwer.cer(expected, got), jiwer.cer(expected, joined)
    print(f"justified columns {GUTTER} px apart: CER {after:.3f}, {before:.3f} without the gutter fitting")
    assert before > 0.3
    assert after < 0.03


@pytest.mark.parametrize(("left_end", "split"), [(434, True), (435, False)], ids=["edge", "past"])
def test_the_middle_taken_in_from_a_wide_runs_end(left_end, split):
    # EDGE: row 3's short line (60-200) joined to the right column's (from 448): its run's far middle is
    # taken 0.1 h + 0.15 h (9) in from 448, at 439, its core the columns 434 to 443. The rows around end
    # their left text at `left_end`: ink to 433 leaves that core blank (split: 52-203.6, 444.4-816); to 434
    # crosses it, and the run's other middles (209, 324) lie in the left column's text.
    page = blank_page()
    quads = []
    for r in range(8):
        text(page, 60, 200 if r == 3 else left_end, r)
        text(page, *RIGHT, r)
        quads.append(box(60, 808, r))
    got = both_ways(quads, page)
    assert got[3] == ([pytest.approx((52, 203.6)), pytest.approx((444.4, 816))] if split else as_is(quads)[3])


@pytest.mark.parametrize(("mark", "split"), [(423, True), (424, False)], ids=["beside", "in-the-middle"])
def test_a_mark_in_the_column_beside_the_middle_is_its_sides_text(mark, split):
    # The joined line's gutter 420-438, its middle's columns 424 to 433 (as in test_the_rows_that_confirm_a
    # _gutter). Under it, rows whose left text ends beyond reach (at 300): of it only a mark one column wide
    # is left within 1.5 h of the middle. In column 423, next to the middle, it is the side's text: the rows
    # show a gutter (split: 52-423.6 and 434.4-816). In 424 it is ink in the middle: the rows cross it.
    page, quads = under_a_headline(438)
    for r in (2, 3):
        text(page, 60, 300, r)
        page[top(r) : top(r) + INK, mark] = 0
        text(page, 438, 808, r)
        quads += [box(60, mark + 1, r), box(438, 808, r)]
    got = both_ways(quads, page)
    assert got[1] == (cut(438) if split else as_is(quads)[1])


@pytest.mark.parametrize(
    ("dys", "split"),
    [((18, 36), True), ((17, 36), False), ((18, 35), False)],
    ids=["0.5h-and-0.5h-apart", "nearer-than-0.5h", "apart-by-under-0.5h"],
)
def test_rows_half_a_height_away_and_apart(dys, split):
    # A headline across (row 0), the joined line (row 1), and under it two lines set close (a line of
    # smaller type, its box overlapping the next): their middles `dys` under the joined line's. A row counts
    # from 0.5 h (18) away, and two rows count as two from 0.5 h apart; a row nearer the line, or nearer the
    # row before, is not another row: one is left under MIN_ROWS.
    page, quads = under_a_headline()
    rows_at(page, quads, dys)
    got = both_ways(quads, page)
    assert got[1] == (cut() if split else as_is(quads)[1])


@pytest.mark.parametrize(("height", "split"), [(1, True), (0, False)], ids=["1px", "flat"])
def test_a_box_of_no_height_is_no_row(height, split):
    # A headline across (row 0), the joined line (row 1), one row under it in two boxes (row 2) and row 3's
    # line, whose box the detector gave `height` px tall through its ink's middle. One pixel tall it is a
    # row, blank at the gutter with text both sides: two rows confirm it. Flat, it is no row: one is left.
    page, quads = under_a_headline()
    story_over(page, quads, [2], LEFT, RIGHT)
    text(page, *LEFT, 3)
    text(page, *RIGHT, 3)
    y = top(3) + INK // 2
    quads.append([[52, y], [816, y], [816, y + height], [52, y + height]])
    got = both_ways(quads, page)
    assert got[1] == (cut() if split else as_is(quads)[1])


@pytest.mark.parametrize(("x0", "split"), [(497.4, True), (497.5, False)], ids=["in-reach", "past"])
def test_a_row_is_looked_at_when_its_box_reaches_the_gutters_sides(x0, split):
    # The joined line's gutter 420-438 (its middle 429, the core 5.4 each side). Under it, two rows whose
    # boxes the detector drew over the right half of their ink only, from x0: a box is one of the gutter's
    # rows when it reaches the core and REACH h beyond it (438 + 5.4 + 54 = 497.4), the ink its row holds
    # being read across the page. Past that, no row is left under the line (the mirror image: its x1).
    page, quads = under_a_headline(438)
    for r in (2, 3):
        text(page, 60, 420, r)
        text(page, 438, 808, r)
        y0, y1 = top(r) - PAD, top(r) + INK + PAD
        quads.append([[x0, y0], [816, y0], [816, y1], [x0, y1]])
    got = both_ways(quads, page)
    assert got[1] == (cut(438) if split else as_is(quads)[1])


def test_blanks_in_the_margin_do_not_stop_the_search():
    # Each line has a change bar (columns 2-5) and a line number (44-49) in the margin, outside its box
    # (from 52): the blank between them (6-43, 38 wide) is wider than GAP_MIN but lies before the box's
    # ink, and one that does not reach it: neither a gutter of the box nor an end's overhang. The number is
    # too near the text (10) for a gutter; the one between the columns is cut as before.
    page, quads = two_columns(8)
    for r in range(8):
        page[top(r) : top(r) + INK, 2:6] = 0
        page[top(r) : top(r) + INK, 44:50] = 0
    assert both_ways(quads, page) == [cut()] * 8


def test_an_end_at_the_pages_edge_is_scanned_from_its_first_column():
    # The text starts at column 18, the boxes at 10; the lines around row 3 have a number at the page's
    # edge (columns 0-3), row 3 has none. Row 3's blank from the page's first column to its text is 18 wide
    # (0.5 h): its left end overhangs a gutter (the numbers' one, blank in the rows around with a number on
    # one side and the text on the other), pulled back to 18 - 3.6. The other rows' blank (4-17) is under
    # GAP_MIN; their ends stay. All are cut at the columns' gutter.
    page = blank_page()
    quads = []
    for r in range(8):
        text(page, 18, 420, r)
        text(page, *RIGHT, r)
        if r != 3:
            page[top(r) : top(r) + INK, 0:4] = 0
        quads.append(box(18, RIGHT[1], r))
    want = [[(10, 423.6), (444.4, 816)]] * 8
    want[3] = [(14.4, 423.6), (444.4, 816)]
    assert both_ways(quads, page) == [[pytest.approx(p) for p in row] for row in want]


def test_a_box_off_the_page_is_left_as_it_is():
    # Boxes wholly left of the page, wholly right of it, and one straddling its left edge: nothing of the
    # first two to read; the third's ink (from 0 to 120) faces no gutter.
    page = blank_page()
    page[40:60, 0:120] = 0
    quads = [box(-300, -100, 0), box(1000, 1200, 0), box(-80, 120, 0)]
    assert both_ways(quads, page) == as_is(quads)
