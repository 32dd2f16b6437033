"""Page orientation (rapidocr engine): a page sent sideways or upside down is turned upright, read as well
as the upright page, reports the rotation applied, and its boxes stay on the page as sent."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from ocr_app.engines.rapidocr.engine import RapidOcrEngine
from ocr_app.engines.rapidocr.orientation import page_rotation, unrotate

from .docs import TEXTS, render
from .test_ocr_contract import cer, iou, normalise


@pytest.fixture(scope="module")
def doc():
    return render(TEXTS["en"][:3])


@pytest.fixture(scope="module")
def upright(engine, doc):
    return engine._run(doc.image)


def text(page) -> str:
    return "\n".join(line.text for line in page.lines)


def test_upright_page_is_not_turned(upright, doc):
    assert upright.rotation == 0
    assert cer(doc.text, text(upright)) <= 0.02


@pytest.mark.parametrize("degrees", [90, 180, 270])
def test_turned_page_is_read_upright(engine, doc, upright, degrees):
    # Pillow turns counterclockwise: the engine turns it back by the same degrees clockwise.
    image = doc.image.rotate(degrees, expand=True)
    before = dict(engine.rotations)
    page = engine._run(image)
    assert page.rotation == degrees
    assert engine.rotations[degrees] == before[degrees] + 1
    assert cer(doc.text, text(page)) <= cer(doc.text, text(upright)) + 0.01, text(page)
    # Each line's box lies on the page as sent: where the drawn line went when the page was turned.
    assert len(page.lines) == len(doc.lines)
    for line, drawn in zip(page.lines, doc.boxes, strict=True):
        x0, y0, x1, y1 = line.bbox
        assert 0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1
        # The drawn box, normalised on the upright page, turned as Pillow turned the page.
        assert iou(line.bbox, turned(normalise(drawn, doc.image.size), degrees)) > 0.5, (line, degrees)
        # Its words too lie on the page as sent, within the line's box, and spell it.
        assert line.words and "".join(w.text for w in line.words) == line.text.replace(" ", "")
        for w in line.words:
            assert x0 - 0.01 <= w.bbox[0] < w.bbox[2] <= x1 + 0.01, (w, line.bbox)
            assert y0 - 0.01 <= w.bbox[1] < w.bbox[3] <= y1 + 0.01, (w, line.bbox)


def turned(box, degrees: int):
    """A normalised box on the upright page, on that page turned `degrees` counterclockwise (Pillow)."""
    x0, y0, x1, y1 = box
    if degrees == 90:  # the left edge went to the bottom
        return (y0, 1 - x1, y1, 1 - x0)
    if degrees == 180:
        return (1 - x1, 1 - y1, 1 - x0, 1 - y0)
    return (1 - y1, x0, 1 - y0, x1)  # 270: the left edge went to the top


@pytest.mark.parametrize("degrees", [0, 90])
def test_a_page_as_opencvs_array_reads_as_its_image(engine, doc, degrees):
    # What the decode pool hands the engine: the pixels as a BGR array (the page file, mapped), which
    # RapidOCR takes as it is. The same lines, boxes and rotation as from the RGB image.
    image = doc.image.rotate(degrees, expand=True)
    from_image = engine._run(image)
    from_array = engine._run(np.ascontiguousarray(np.asarray(image)[:, :, ::-1]))
    assert from_array.rotation == from_image.rotation == degrees
    assert [(ln.text, ln.bbox) for ln in from_array.lines] == [(ln.text, ln.bbox) for ln in from_image.lines]


def test_a_flip_the_classifier_calls_is_checked_by_the_recogniser(engine, doc):
    # A classifier that says 180 for every line sampled, as the real one did for the tightly set, tilted
    # headnote of the development set's census table: the recogniser reads the lines far more surely as
    # they are, so the page is not turned; the same lines upside down are.
    def says_180(crops):
        return SimpleNamespace(cls_res=[("180", 0.9)] * len(crops))

    quads = np.asarray([[(x0, y0), (x1, y0), (x1, y1), (x0, y1)] for x0, y0, x1, y1 in doc.boxes], float)
    bgr = np.asarray(doc.image.convert("RGB"))[:, :, ::-1]
    crops = [np.ascontiguousarray(bgr[y0 - 4 : y1 + 4, x0 - 4 : x1 + 4]) for x0, y0, x1, y1 in doc.boxes]
    inst = engine._idle.get()
    try:
        assert page_rotation(quads, crops, says_180, inst.recognize_txt) == 0
        flipped = [np.ascontiguousarray(np.rot90(c, 2)) for c in crops]
        assert page_rotation(quads, flipped, says_180, inst.recognize_txt) == 180
    finally:
        engine._idle.put(inst)
    assert page_rotation(quads, crops, says_180) == 180  # the classifier alone


def test_unrotate_is_the_inverse_of_the_turn():
    # A box in the top-left corner of the upright page; the page as sent was the upright one turned
    # counterclockwise 90 (the top-left corner went to the bottom left), 180 (bottom right), 270 (top right).
    box = (0.1, 0.2, 0.3, 0.25)
    assert unrotate(box, 90) == pytest.approx((0.2, 0.7, 0.25, 0.9))
    assert unrotate(box, 180) == pytest.approx((0.7, 0.75, 0.9, 0.8))
    assert unrotate(box, 270) == pytest.approx((0.75, 0.1, 0.8, 0.3))


def test_orientation_off_reads_the_page_as_sent(doc):
    eng = RapidOcrEngine(workers=1, threads=2, orientation=False)
    asyncio.run(eng.load())
    try:
        page = eng._run(doc.image.rotate(180, expand=True))
    finally:
        asyncio.run(eng.close())
    assert page.rotation == 0
    assert cer(doc.text, text(page)) > 0.3


def test_rotations_metric():
    from prometheus_client import generate_latest

    from ocr_app.metrics import Metrics

    m = Metrics()

    def none() -> int:
        return 0

    m.track(
        inflight=none,
        queued=none,
        job_pages_inflight=none,
        engine_pages=lambda: 4,
        engine_rotations=lambda: {0: 3, 90: 1, 180: 0, 270: 0},
    )
    text = generate_latest(m.registry).decode()
    assert 'ocr_page_rotations_total{degrees="0"} 3.0' in text
    assert 'ocr_page_rotations_total{degrees="90"} 1.0' in text
