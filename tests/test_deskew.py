"""Deskew (ocr_app.engines.layout.page_skew, deskewed): a page tilted by up to SKEW_MAX degrees is laid out
upright from the detector's own slanted line polygons, its boxes given back on the page as sent; synthetic
polygons through the rapidocr engine's _to_page (no engine run), and one tilted page read through it."""

from __future__ import annotations

import asyncio
import math
import random
from types import SimpleNamespace

import jiwer
import numpy as np
import pytest
from PIL import Image

from ocr_app.documents.image import PageImage
from ocr_app.engines.layout import SKEW_MAX, page_layout, page_skew, row_order
from ocr_app.engines.rapidocr.engine import RapidOcrEngine, _to_page

from .docs import ARTICLE, render_columns

H = 20  # line height; a 400-wide column holds ~45 characters of it
WIDTH, HEIGHT = 1000, 2000
PARAGRAPH = [400, 395, 398, 402, 250, 400, 397, 180]  # justified lines, paragraph ends shorter


def column(x: float, top: float, lines: int, pitch: float = 30) -> list[tuple[float, float, float, float]]:
    widths = (PARAGRAPH * (lines // len(PARAGRAPH) + 1))[:lines]
    return [(x, top + k * pitch, x + w, top + k * pitch + H) for k, w in enumerate(widths)]


def two_columns() -> list[tuple[float, float, float, float]]:
    """A title over two 60-line columns (1800 px) with a 30 px gutter: 1° of tilt drifts a column 31 px."""
    return [(50, 40, 850, 40 + 1.6 * H), *column(50, 100, 60), *column(480, 100, 60)]


def tilted(boxes: list[tuple], degrees: float) -> np.ndarray:
    """The boxes' corners (top-left, top-right, bottom-right, bottom-left) turned by `degrees` about the
    page centre, as a scanner tilts them (positive: lines descend to the right, y down)."""
    a = math.radians(degrees)
    c, s = math.cos(a), math.sin(a)
    cx, cy = WIDTH / 2, HEIGHT / 2
    quads = np.asarray([[(x0, y0), (x1, y0), (x1, y1), (x0, y1)] for x0, y0, x1, y1 in boxes], dtype=float)
    x, y = quads[..., 0] - cx, quads[..., 1] - cy
    return np.stack([cx + c * x - s * y, cy + s * x + c * y], axis=-1)


def read(polygons: np.ndarray, deskew: bool = True):
    """_to_page over the polygons, each line's text its index: (reading order, page)."""
    out = SimpleNamespace(
        boxes=polygons, txts=[str(i) for i in range(len(polygons))], scores=[0.9] * len(polygons)
    )
    page = _to_page(out, WIDTH, HEIGHT, deskew=deskew)
    return [int(line.text) for line in page.lines], page


def sent(polygon: np.ndarray) -> tuple[float, float, float, float]:
    """The polygon's axis-aligned box on the page as sent, clipped and normalised as the engine gives it."""
    x0, y0 = max(0.0, polygon[:, 0].min()), max(0.0, polygon[:, 1].min())
    x1, y1 = min(WIDTH, polygon[:, 0].max()), min(HEIGHT, polygon[:, 1].max())
    return (round(x0 / WIDTH, 5), round(y0 / HEIGHT, 5), round(x1 / WIDTH, 5), round(y1 / HEIGHT, 5))


def check_boxes_as_sent(polygons: np.ndarray, page) -> None:
    order = [int(line.text) for line in page.lines]
    assert [line.bbox for line in page.lines] == [sent(polygons[i]) for i in order]
    for block in page.blocks:
        boxes = [page.lines[k].bbox for k in block.lines]
        assert block.bbox == (
            min(b[0] for b in boxes),
            min(b[1] for b in boxes),
            max(b[2] for b in boxes),
            max(b[3] for b in boxes),
        )


@pytest.mark.parametrize("degrees", [1, -1, 2, -2, 4.9, -4.9, SKEW_MAX, -SKEW_MAX])
def test_a_tilted_two_column_page_is_read_column_by_column_with_its_boxes_as_sent(degrees):
    boxes = two_columns()
    polygons = tilted(boxes, degrees)
    assert page_skew(polygons) == pytest.approx(degrees, abs=0.01)
    order, page = read(polygons)
    assert order == list(range(len(boxes)))  # the title, the left column, the right column
    assert [(b.type, len(b.lines)) for b in page.blocks] == [("title", 1), ("text", 60), ("text", 60)]
    check_boxes_as_sent(polygons, page)
    # Without deskew the page is read across the columns: the test is one deskew decides.
    assert read(polygons, deskew=False)[0] != order


@pytest.mark.parametrize("degrees", [5.5, -5.5, 8])
def test_past_the_limit_a_page_is_read_as_before(degrees):
    polygons = tilted(two_columns(), degrees)
    assert page_skew(polygons) == 0.0
    order, page = read(polygons)
    before_order, before = read(polygons, deskew=False)
    assert order == before_order
    assert page == before
    check_boxes_as_sent(polygons, page)


def upright_pages() -> dict[str, list[tuple]]:
    title = [(50, 30, 950, 66)]
    three = [b for c in range(3) for b in column(50 + c * 320, 100, 12)]
    receipt = [
        b
        for k in range(10)
        for b in [(20, 40 + 26 * k, 300, 60 + 26 * k), (600, 40 + 26 * k, 660, 60 + 26 * k)]
    ]
    table = [(80 + 150 * c, 40 + 30 * r, 180 + 150 * c, 60 + 30 * r) for r in range(8) for c in range(4)]
    return {"two-column": two_columns(), "three-column": title + three, "receipt": receipt, "table": table}


@pytest.mark.parametrize("name", list(upright_pages()))
@pytest.mark.parametrize("degrees", [0, 0.05])
def test_an_upright_page_is_laid_out_exactly_as_before(name, degrees):
    polygons = tilted(upright_pages()[name], degrees)
    assert page_skew(polygons) == 0.0  # 0.05 is under the floor: read as it is
    order, page = read(polygons)
    boxes = [
        (
            max(0.0, p[:, 0].min()),
            max(0.0, p[:, 1].min()),
            min(WIDTH, p[:, 0].max()),
            min(HEIGHT, p[:, 1].max()),
        )
        for p in polygons
    ]
    expected = page_layout(boxes, HEIGHT)
    assert order == [i for b in expected for i in b.lines]
    assert [(b.type, len(b.lines)) for b in page.blocks] == [(b.type, len(b.lines)) for b in expected]
    assert page == read(polygons, deskew=False)[1]


def test_lines_at_mixed_angles_are_not_turned():
    boxes = two_columns()
    rng = random.Random(1)
    # Spread over 0-4°: their median (~2°) is no tilt the lines share, a quarter of them near it.
    polygons = np.concatenate([tilted([b], rng.uniform(0, 4)) for b in boxes])
    assert page_skew(polygons) == 0.0
    assert read(polygons)[1] == read(polygons, deskew=False)[1]


def test_too_few_long_lines_are_not_trusted():
    # Four long lines at 2°, the rest short words at mixed angles: no tilt to trust.
    rng = random.Random(2)
    long = tilted(column(50, 100, 4), 2)
    words = np.concatenate(
        [
            tilted([(x, 300 + 30 * k, x + 60, 320 + 30 * k)], rng.uniform(-3, 3))
            for k in range(20)
            for x in (50, 480)
        ]
    )
    polygons = np.concatenate([long, words])
    assert page_skew(polygons) == 0.0
    assert read(polygons)[1] == read(polygons, deskew=False)[1]


def test_a_few_outliers_do_not_move_the_tilt():
    boxes = two_columns()
    polygons = tilted(boxes, 1.5)
    polygons[:10] = tilted(boxes[:10], -3)  # a tenth of the lines at another angle (a figure's labels)
    assert page_skew(polygons) == pytest.approx(1.5, abs=0.01)


def test_no_lines_and_degenerate_polygons():
    assert page_skew(np.zeros((0, 4, 2))) == 0.0
    assert page_skew(np.zeros((7, 4, 2))) == 0.0  # no height: nothing to measure
    assert read(tilted(column(50, 100, 3), 2))[0] == [0, 1, 2]


def cer(expected: str, got: str) -> float:
    return jiwer.cer(expected, got)


def test_a_tilted_two_column_article_read_through_the_engine_comes_out_column_by_column():
    # Three times the article's columns (24 lines, ~1100 px) and a narrow gutter: at 2.5° the columns'
    # edges drift across it, so without deskew no blank strip runs the columns' height.
    columns = [col * 3 for col in ARTICLE["columns"]]
    doc = render_columns(ARTICLE["title"], columns, gutter=40)
    image = doc.image.rotate(2.5, expand=True, fillcolor="white", resample=Image.Resampling.BICUBIC)
    engine = RapidOcrEngine(workers=1, threads=2)

    async def run():
        await engine.load()
        try:
            [page] = await engine.recognize([PageImage(1, image, *image.size)])
        finally:
            await engine.close()
        return page

    page = asyncio.run(run())
    got = [line.text for line in page.lines]
    boxes = [line.bbox for line in page.lines]
    by_rows = [got[i] for i in row_order(boxes, range(len(boxes)))]
    expected = " ".join(doc.lines)
    after, before = cer(expected, " ".join(got)), cer(expected, " ".join(by_rows))
    print(f"tilted two-column article: CER {after:.3f} in layout order, {before:.3f} in row order")
    assert after < 0.05
    assert after < before
    assert [b.type for b in page.blocks] == ["title", "text", "text"]
    # The boxes are on the page as sent: every line lies within the tilted image, the left column's
    # lines left of the right column's.
    assert all(0 <= b[0] < b[2] <= 1 and 0 <= b[1] < b[3] <= 1 for b in boxes)
