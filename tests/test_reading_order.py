"""A page's layout (ocr_app.engines.layout): reading order by a recursive XY-cut over the line boxes, and
the blocks it groups them into; synthetic boxes with the exact order and blocks expected, and one rendered
two-column page read through the real rapidocr engine."""

from __future__ import annotations

import asyncio
import itertools
import random

import jiwer
import pytest
from PIL import Image, ImageDraw

from ocr_app.documents.image import PageImage
from ocr_app.engines.layout import HEAD_GAP, page_layout, reading_order, row_order
from ocr_app.engines.rapidocr.engine import RapidOcrEngine

from .docs import ARTICLE, TABLE, font_for, layout_pages, photo_like, render_columns

H = 20  # line height of the synthetic boxes; a 400-wide column holds ~45 characters of it


def line(x: float, y: float, w: float, h: float = H) -> tuple[float, float, float, float]:
    return (x, y, x + w, y + h)


def column(x: float, top: float, widths: list[float], pitch: float = 30) -> list[tuple]:
    return [line(x, top + k * pitch, w) for k, w in enumerate(widths)]


def ordered(boxes: list[tuple]) -> list[tuple]:
    return [boxes[i] for i in reading_order(boxes)]


def shuffled(boxes: list[tuple], seed: int = 0) -> list[tuple]:
    # The detector's own order is no help: the order must come from the geometry alone.
    out = list(boxes)
    random.Random(seed).shuffle(out)
    return out


PARAGRAPH = [400, 395, 398, 402, 250, 400, 397, 180]  # justified lines, paragraph ends shorter


@pytest.mark.parametrize("offset", [0, 12], ids=["shared-baselines", "offset-baselines"])
def test_two_columns_left_then_right(offset):
    left = column(50, 100, PARAGRAPH)
    right = column(480, 100 + offset, PARAGRAPH[::-1])
    assert ordered(shuffled(left + right)) == left + right


def test_three_columns_under_a_full_width_title():
    title = [line(50, 30, 900, 36)]
    cols = [column(50 + c * 320, 100, [290, 288, 285, 290, 140, 289][c:] + [200] * c) for c in range(3)]
    assert ordered(shuffled(title + cols[0] + cols[1] + cols[2])) == title + cols[0] + cols[1] + cols[2]


def test_header_two_columns_of_unequal_length_and_footer():
    header = [line(50, 20, 830), line(50, 50, 600)]  # a title and a standfirst, both above the columns
    left = column(50, 100, [*PARAGRAPH, 400, 300])  # two lines longer than the right column
    right = column(480, 100, PARAGRAPH)
    footer = [line(50, 420, 830), line(430, 450, 60)]  # a full-width note and a page number
    boxes = header + left + right + footer
    assert ordered(shuffled(boxes)) == boxes


def running_heads(gap: float) -> list[tuple]:
    """A left and a right running head (one row, each over its column) `gap` above two columns, read."""
    heads = [line(50, 20, 250), line(780, 20, 100)]  # "Journal title" ... "Author et al."
    left, right = column(50, 20 + H + gap, PARAGRAPH), column(480, 20 + H + gap, PARAGRAPH[::-1])
    return ordered(shuffled(heads + left + right)), heads + left + right, heads[:1] + left + heads[1:] + right


def test_running_heads_over_columns_are_read_first():
    # HEAD_GAP h of blank under the heads: they are read first, the row left to right; a unit less and each
    # is read with the column it lies over (the lines of a column are 10 apart: half a line height).
    got, heads_first, with_columns = running_heads(HEAD_GAP * H)
    assert got == heads_first
    got, heads_first, with_columns = running_heads(HEAD_GAP * H - 1)
    assert got == with_columns


def test_a_spanning_line_between_two_column_runs_stays_where_it_stands():
    top_left, top_right = column(50, 20, PARAGRAPH[:4]), column(480, 20, PARAGRAPH[4:])
    quote = [line(50, 150, 830, 30)]
    low_left, low_right = column(50, 200, PARAGRAPH[:3]), column(480, 200, PARAGRAPH[3:6])
    boxes = top_left + top_right + quote + low_left + low_right
    assert ordered(shuffled(boxes)) == boxes


def receipt(items: list[float], price_widths: list[float], right: float) -> list[tuple]:
    rows = []
    for k, (w, pw) in enumerate(zip(items, price_widths, strict=True)):
        rows += [line(20, 40 + k * 26, w), line(right - pw, 40 + k * 26, pw)]  # item, right-aligned price
    return rows


@pytest.mark.parametrize(
    ("items", "right"),
    [
        ([90, 140, 60, 120, 100, 75], 300),  # a till receipt: short items, a wide blank before the prices
        ([260, 300, 180, 290, 240, 310], 460),  # long descriptions (15 h), a gap of 2 h
    ],
    ids=["till", "long-items"],
)
def test_a_receipt_reads_item_then_price_row_by_row(items, right):
    boxes = receipt(items, [50, 60, 50, 70, 60, 90], right)
    total = [line(20, 40 + 7 * 26, 70), line(right - 80, 40 + 7 * 26, 80)]
    assert ordered(shuffled(boxes + total)) == boxes + total


def test_a_single_column_with_indents_and_a_split_line_is_read_as_rows():
    boxes = [
        line(50, 20, 600, 30),  # heading
        line(50, 70, 700),
        line(50, 100, 690),
        line(50, 130, 320),
        line(80, 160, 670),  # indented first line of a paragraph
        line(50, 190, 700),
        line(50, 220, 260),
        line(300, 222, 380),  # the same line, split by the detector at a wide space
        line(110, 260, 540),  # an indented quotation
        line(110, 290, 480),
        line(50, 330, 25, 18),  # a list bullet
        line(90, 330, 500),
    ]
    assert ordered(shuffled(boxes)) == boxes


def test_a_single_column_page_is_ordered_exactly_as_rows():
    rng = random.Random(7)
    # Written in reading order: a row starts 1.1 to 1.8 line heights below the last, so whatever the skew
    # (3 up or down) its middle lies below the last row's bottom; a split line's second piece lies 15 right
    # of the first, its middle within the first's height.
    boxes = []
    y = 0.0
    for _ in range(300):  # ragged lines, skew, varying sizes, a few split lines
        h = rng.uniform(14, 26)
        x = 50 + rng.choice([0, 0, 0, 30, 60])
        w = rng.uniform(100, 700)
        boxes.append(line(x, y + rng.uniform(-3, 3), w, h))
        if rng.random() < 0.1:
            boxes.append(line(x + w + 15, y + rng.uniform(-3, 3), rng.uniform(40, 200), h))
        y += h * rng.uniform(1.1, 1.8)
    assert ordered(shuffled(boxes, 1)) == boxes


def test_a_table_reads_row_by_row():
    rows = []
    for r in range(5):
        y = 30 + r * 28
        rows += [line(20, y, [140, 90, 160, 120, 100][r])]  # labels
        rows += [line(x - w, y, w) for x, w in ((300, 50), (380, 60), (460, 45))]  # right-aligned figures
    assert ordered(shuffled(rows)) == rows


def test_a_form_of_long_labels_and_values_reads_row_by_row():
    # Both sides wide enough to be columns, but they pair up row by row and are ragged: label, value.
    labels, values = [150, 260, 130, 310, 200, 170], [300, 180, 420, 150, 260, 330]
    rows = []
    for k, (lw, vw) in enumerate(zip(labels, values, strict=True)):
        rows += [line(40, 40 + k * 30, lw), line(400, 40 + k * 30, vw)]
    assert ordered(shuffled(rows)) == rows


def test_a_form_of_short_fields_reads_row_by_row():
    # Two short cells a row, far apart: not columns (cf. test_ocr_contract.test_two_columns_read_row_by_row).
    boxes = [line(60, 60, 110, 44), line(760, 60, 170, 44), line(60, 150, 120, 44), line(760, 150, 100, 44)]
    assert ordered(shuffled(boxes)) == boxes


def pieces(x: float, y: float, w: float, cuts: list[float], gap: float = 15) -> list[tuple]:
    """One printed line from x to x + w on baseline y, as the detector may give it: split at the fractions
    `cuts` of its width, `gap` blank at each split (a justified line's wide spaces)."""
    edges = [x, *(x + c * w for c in cuts), x + w]
    inner = [(a + (gap / 2 if k else 0), b - (gap / 2 if k < len(cuts) else 0))
             for k, (a, b) in enumerate(itertools.pairwise(edges))]  # fmt: skip
    return [line(a, y, b - a) for a, b in inner]


def justified(x: float, top: float, widths: list[float], splits: dict[int, list[float]]) -> list[list[tuple]]:
    """A column's lines (pitch 30), each as its boxes left to right; lines in `splits` cut into pieces."""
    return [pieces(x, top + k * 30, w, splits.get(k, [])) for k, w in enumerate(widths)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_justified_columns_on_shared_baselines_with_split_lines_read_column_by_column(seed):
    # Two justified columns set on the same baselines, 8 rows, 5 lines a side split by the detector into
    # 2-3 boxes: the split pieces are short, so the boxes no longer fill the column, but the rows do. Read
    # left column top to bottom (each line's pieces left to right), then the right one; text blocks, no table.
    left = justified(50, 100, PARAGRAPH, {0: [0.55], 1: [0.4], 3: [0.3, 0.7], 5: [0.35, 0.6], 6: [0.5]})
    right = justified(
        480, 100, PARAGRAPH[::-1], {0: [0.6], 2: [0.25, 0.55], 4: [0.5], 5: [0.45], 7: [0.3, 0.65]}
    )
    expected = [b for ln in left + right for b in ln]
    assert ordered(shuffled(expected, seed)) == expected
    assert {kind for kind, _ in layout(shuffled(expected, seed))} == {"text"}


def test_a_table_of_equal_short_cells_on_shared_baselines_reads_row_by_row():
    # Four columns of figures, every cell the same width (6.5 h: wide enough to be a column, and filling it,
    # as prose columns do), 6 rows: short cells are a table's, read row by row, not column by column.
    rows = [[line(50 + c * 170, 40 + r * 28, 130) for c in range(4)] for r in range(6)]
    expected = [b for row in rows for b in row]
    assert ordered(shuffled(expected)) == expected


@pytest.mark.parametrize(
    ("width", "columns"), [(140, True), (139, False)], ids=["7h-prose", "under-7h-cells"]
)
def test_the_prose_width_limit_between_columns_and_table_cells(width, columns):
    # Two sides of a gutter, 5 paired rows, each filling its side: lines 7 line heights long (H = 20) are
    # prose, read column by column; one unit shorter they are a table's cells, read row by row.
    left = column(50, 100, [width] * 5)
    right = column(50 + width + 40, 100, [width] * 5)
    rows = [b for pair in zip(left, right, strict=True) for b in pair]
    assert ordered(shuffled(left + right)) == (left + right if columns else rows)


def test_noise_neither_makes_nor_bridges_a_gutter():
    left, right = column(50, 100, PARAGRAPH), column(480, 100, PARAGRAPH)
    noise = [
        line(462, 125, 3, 215),  # a vertical rule down the gutter
        line(455, 150, 6, 6),  # specks in the gutter
        line(465, 230, 4, 5),
        line(300, 93, 5, 4),  # and one between two lines of the left column
        line(300, 213, 300, 2),  # a streak across the gutter, between two rows
    ]
    got = ordered(shuffled(left + right + noise))
    assert sorted(got) == sorted(left + right + noise)
    assert [b for b in got if b not in noise] == left + right


def test_empty_one_and_two_boxes():
    assert reading_order([]) == []
    assert reading_order([line(10, 10, 100)]) == [0]
    assert reading_order([line(10, 50, 100), line(10, 10, 100)]) == [1, 0]
    assert reading_order([line(200, 10, 100), line(10, 12, 100)]) == [1, 0]


def test_degenerate_boxes_do_not_break_it():
    boxes = [(0.1, 0.1, 0.1 + 1e-6, 0.1 + 1e-6)] * 3 + [(0.2, 0.2, 0.2, 0.2)]
    assert sorted(reading_order(boxes)) == [0, 1, 2, 3]


def test_two_thousand_lines_of_three_columns_read_column_by_column():
    # Three columns of ~667 lines, as on a dense newspaper page. Its cost is make bench's (measurement 7:
    # 2000 lines beside 500, so that a quadratic step shows as a ratio), not a timed assertion here.
    boxes = shuffled(
        [line(50 + c * 320, k * 1.5 * H, 290 - (k % 7) * 20) for c in range(3) for k in range(667)]
    )
    got = reading_order(boxes)
    assert [boxes[i][0] for i in got] == sorted(b[0] for b in boxes)  # column by column


def cer(expected: str, got: str) -> float:
    return jiwer.cer(expected, got)


def test_a_two_column_article_is_read_column_by_column():
    doc = render_columns(ARTICLE["title"], ARTICLE["columns"])
    engine = RapidOcrEngine(workers=1, threads=2)

    async def read():
        await engine.load()
        try:
            [page] = await engine.recognize([PageImage(1, doc.image, *doc.image.size)])
        finally:
            await engine.close()
        return page

    page = asyncio.run(read())
    # Blocks: the title, then each column (its lines one paragraph), on the page as drawn.
    assert [(b.type, len(b.lines)) for b in page.blocks] == [("title", 1)] + [
        ("text", len(col)) for col in ARTICLE["columns"]
    ]
    assert page.joined_text().split("\n\n")[0] == page.lines[0].text
    got = [line.text for line in page.lines]
    boxes = [line.bbox for line in page.lines]
    by_rows = [got[i] for i in row_order(boxes, range(len(boxes)))]  # the order before layout
    expected = " ".join(doc.lines)
    after, before = cer(expected, " ".join(got)), cer(expected, " ".join(by_rows))
    print(f"two-column article: CER {after:.3f} in layout order, {before:.3f} in row order")
    print("layout order:", got, "\nrow order:", by_rows, sep="\n")
    assert len(got) == len(doc.lines)
    assert after < 0.03
    assert before > 0.3  # the page is one a row sort gets wrong


def layout(boxes: list[tuple], height: float = 600) -> list[tuple[str, list[tuple]]]:
    """(type, its boxes) of each block, and a check of the contract: the blocks' lines, one block after
    another, are the reading order, every box once."""
    blocks = page_layout(boxes, height)
    assert [i for b in blocks for i in b.lines] == reading_order(boxes)
    for b in blocks:
        mine = [boxes[i] for i in b.lines]
        assert b.bbox == (min(x[0] for x in mine), min(x[1] for x in mine), max(x[2] for x in mine),
                          max(x[3] for x in mine))  # fmt: skip
    return [(b.type, [boxes[i] for i in b.lines]) for b in blocks]


def test_blocks_a_title_over_three_columns():
    title = [line(50, 30, 900, 36)]
    cols = [column(50 + c * 320, 100, [290, 288, 285, 290, 140, 289]) for c in range(3)]
    got = layout(shuffled(title + cols[0] + cols[1] + cols[2]))
    assert got == [("title", title), ("text", cols[0]), ("text", cols[1]), ("text", cols[2])]


def test_blocks_paragraphs_split_at_an_empty_line_not_at_the_line_spacing():
    first, second = column(50, 100, PARAGRAPH[:4]), column(50, 100 + 4 * 30 + 30, PARAGRAPH[4:])
    assert layout(shuffled(first + second)) == [("text", first), ("text", second)]
    double = column(50, 100, PARAGRAPH, pitch=2.1 * H)  # double spacing throughout: one paragraph
    assert layout(double) == [("text", double)]
    heading = [line(50, 60, 300, 30)]  # a larger heading right over its paragraph
    assert layout(heading + first) == [("title", heading), ("text", first)]


def test_blocks_a_running_head_and_a_page_number():
    head = [line(50, 15, 200)]
    body = column(50, 100, PARAGRAPH)
    number = [line(440, 570, 30)]
    assert layout(shuffled(head + body + number)) == [("header", head), ("text", body), ("footer", number)]
    # The same lines nearer the body are not margins: they are read as the body's own lines.
    got = layout(shuffled([line(50, 70, 200), *body]))
    assert [kind for kind, _ in got] == ["text"]


def test_blocks_a_table_and_a_receipt_are_one_table_each():
    rows = []
    for r in range(5):
        y = 30 + r * 28
        rows += [line(20, y, [140, 90, 160, 120, 100][r])]
        rows += [line(x - w, y, w) for x, w in ((300, 50), (380, 60), (460, 45))]
    assert layout(shuffled(rows)) == [("table", rows)]
    items = receipt([120, 200, 90, 160], [60, 55, 70, 60], right=400)
    assert layout(shuffled(items)) == [("table", items)]


def test_blocks_of_nothing_and_of_one_line():
    assert page_layout([]) == []
    [block] = page_layout([line(10, 10, 100)], 600)
    assert (block.type, block.lines) == ("text", [0])


def flat(text: str) -> str:
    # Order-sensitive: only runs of whitespace are made one space (line breaks are the blocks' business).
    return " ".join(text.split())


# The layout pages (tests/docs.py) with the blocks expected, upright, turned and photographed; CER limits
# well above what the engine reaches on them (0.000 for every one, `make bench`'s layout table).
PAGES = {
    "three-column": [("title", 1), ("text", 5), ("text", 5), ("text", 5)],
    "head-and-foot": [("header", 1), ("text", 3), ("text", 3), ("footer", 1)],
    "table": [("table", 18)],
}


@pytest.mark.parametrize(
    ("name", "variant"),
    [("three-column", "upright"), ("head-and-foot", "upright"), ("table", "upright"),
     ("three-column", "turned 90"), ("head-and-foot", "photo")],
)  # fmt: skip
def test_layout_pages_read_in_order_with_their_blocks(engine, name, variant):
    doc = layout_pages()[name]
    image = doc.image
    if variant == "turned 90":
        image = image.rotate(90, expand=True)
    elif variant == "photo":
        image = photo_like(image)
    page = engine._run(image)
    assert cer(flat(doc.text), flat(page.joined_text())) <= 0.02, page.joined_text()
    assert [(b.type, len(b.lines)) for b in page.blocks] == PAGES[name]
    if name == "table":  # its cells: the text it was drawn with, row by row (tests/docs.py TABLE)
        table = page.blocks[0].table
        assert table is not None and (table.rows, table.columns) == (len(TABLE), len(TABLE[0]))
        got = [["" for _ in row] for row in TABLE]
        for c in table.cells:
            assert c.column_span == 1
            got[c.row][c.column] = " ".join(page.lines[i].text for i in c.lines)
        assert [[t.casefold() for t in row] for row in got] == [[t.casefold() for t in row] for row in TABLE]
        assert page.joined_text() == "\n".join("\t".join(row) for row in got)


@pytest.mark.parametrize(("rows", "columns"), [(2, False), (3, True)], ids=["two-rows", "three-rows"])
def test_two_paired_rows_tell_nothing_and_are_read_as_rows(rows, columns):
    # Two sides of a gutter, rows paired, lines long and filling their sides (prose by the width rule):
    # TABLE_MIN_ROWS - 1 rows tell nothing and are read as rows, as before; TABLE_MIN_ROWS rows are columns.
    left = column(50, 100, [400] * rows)
    right = column(480, 100, [400] * rows)
    pairs = [b for pair in zip(left, right, strict=True) for b in pair]
    assert ordered(shuffled(left + right)) == (left + right if columns else pairs)


@pytest.mark.parametrize(("rows", "kinds"), [(3, ["table"]), (2, ["text"])], ids=["three-rows", "two-rows"])
def test_a_table_block_has_at_least_three_rows(rows, kinds):
    # Rows of an item and its price: TABLE_MIN_ROWS of them are a table; one fewer, a paragraph.
    items = receipt([120, 200, 90][:rows], [60, 55, 70][:rows], right=400)
    assert [kind for kind, _ in layout(shuffled(items))] == kinds


# A statistical table set as the census page of the development set sets it: head and foot rules, labels
# indented by level, a label wrapped onto a second, further indented line with the figures on that line.
STATS = [
    (0, ["Violent crime", "467.9", "380.2", "87.7"]),
    (1, ["Murder and nonnegligent"]),
    (2, ["manslaughter", "10.0", "9.0", "1.1"]),
    (1, ["Robbery", "102.1", "90.0", "12.1"]),
    (1, ["Aggravated assault", "338.4", "264.0", "74.4"]),
    (0, ["Property crime", "1,396.4", "875.9", "608.2"]),
    (1, ["Burglary", "240.9", "205.0", "35.9"]),
]


def test_a_wrapped_label_is_one_row_read_through_the_engine(engine):

    size, pitch = 30, 46
    font = font_for("en", size)
    image = Image.new("RGB", (1200, 120 + (len(STATS) + 1) * pitch), "white")
    draw = ImageDraw.Draw(image)
    stops = [680, 880, 1080]  # the figures' right edges
    y = 60
    for x, text in zip([60, *stops], ["Offense", "Total", "Male", "Female"], strict=True):
        draw.text((x, y), text, fill="black", font=font, anchor="la" if x == 60 else "ra")
    draw.line((40, y + pitch - 6, 1160, y + pitch - 6), fill="black", width=2)
    for level, row in STATS:
        y += pitch
        draw.text((60 + 40 * level, y), row[0], fill="black", font=font)
        for x, text in zip(stops, row[1:], strict=False):
            draw.text((x, y), text, fill="black", font=font, anchor="ra")
    draw.line((40, y + pitch, 1160, y + pitch), fill="black", width=2)
    page = engine._run(image)
    [table] = [b.table for b in page.blocks if b.table is not None]
    assert (table.rows, table.columns) == (len(STATS), 4)  # the head and 6 rows: the turnover joined
    got = {(c.row, c.column): " ".join(page.lines[i].text for i in c.lines) for c in table.cells}
    assert got[(2, 0)].casefold() == "murder and nonnegligent manslaughter"
    assert [got.get((2, k)) for k in (1, 2, 3)] == ["10.0", "9.0", "1.1"]
    assert got[(3, 0)] == "Robbery" and got[(1, 0)] == "Violent crime"
