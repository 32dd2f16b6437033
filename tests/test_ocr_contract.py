"""POST /v1/ocr through real HTTP against the real app and engine: text, boxes and the response shape."""

from __future__ import annotations

import base64
import io
import re

import jiwer
import pytest
from PIL import Image

from .docs import TEXTS, encode, jpeg_with_orientation, multipage_tiff, pdf, render


def cer(expected: str, got: str) -> float:
    # Whitespace collapsed: the engine's spacing in CJK and around punctuation is not the test's concern.
    return jiwer.cer("".join(expected.split()), "".join(got.split()))


# Limits chosen above what the engine reaches on these renders (see the bench note), well below noise.
CER_LIMITS = {"en": 0.02, "latin": 0.04, "zh": 0.05, "ja": 0.06}


@pytest.mark.parametrize("lang", sorted(TEXTS))
@pytest.mark.parametrize(
    ("fmt", "ctype", "params"), [("PNG", "image/png", {}), ("JPEG", "image/jpeg", {"quality": 50})]
)
def test_text_is_recognised_within_cer(server, lang, fmt, ctype, params):
    doc = render(TEXTS[lang], lang)
    r = server.ocr(encode(doc.image, fmt, **params), ctype)
    assert r.status_code == 200, r.text
    body = r.json()
    [page] = body["pages"]
    assert cer(doc.text, page["text"]) <= CER_LIMITS[lang], page["text"]
    # Blocks take every line once, in order; the text is their lines, blocks apart by a blank line.
    assert [i for b in page["blocks"] for i in b["lines"]] == list(range(len(page["lines"])))
    texts = [line["text"] for line in page["lines"]]
    assert page["text"] == "\n\n".join("\n".join(texts[i] for i in b["lines"]) for b in page["blocks"])


def test_response_shape_boxes_and_reading_order(server):
    doc = render(TEXTS["en"])
    r = server.ocr(encode(doc.image, "PNG"), "image/png", headers={"X-Request-ID": "trace-42.abc"})
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"request_id", "engine", "model", "pages", "timings_ms"}
    assert body["request_id"] == "trace-42.abc" == r.headers["x-request-id"]
    assert body["engine"] == "rapidocr" and "PP-OCRv6" in body["model"]
    assert set(body["timings_ms"]) == {"queue", "preprocess", "inference", "total"}
    assert body["timings_ms"]["total"] >= body["timings_ms"]["inference"] > 0
    [page] = body["pages"]
    assert (page["page"], page["width"], page["height"]) == (1, doc.image.width, doc.image.height)
    assert len(page["lines"]) == len(doc.lines)
    for line, expected, drawn in zip(page["lines"], doc.lines, doc.boxes, strict=True):
        assert cer(expected, line["text"]) < 0.1
        assert 0.0 <= line["confidence"] <= 1.0
        x0, y0, x1, y1 = line["bbox"]
        assert 0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1
        assert iou(line["bbox"], normalise(drawn, doc.image.size)) > 0.5
    # One paragraph: one text block around every line.
    [block] = page["blocks"]
    assert (block["type"], block["lines"]) == ("text", list(range(len(doc.lines))))
    corners = list(zip(*(line["bbox"] for line in page["lines"]), strict=True))
    union = (min(corners[0]), min(corners[1]), max(corners[2]), max(corners[3]))
    assert block["bbox"] == pytest.approx(union, abs=1e-5)


def normalise(box, size):
    w, h = size
    return (box[0] / w, box[1] / h, box[2] / w, box[3] / h)


def iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union


def test_two_columns_read_row_by_row(server):
    # Left and right cells of a row come out left to right, rows top to bottom.
    doc = render(["Name", "Alice"], size=44)
    right = render(["Amount", "1200"], size=44)
    page = Image.new("RGB", (1400, doc.image.height), "white")
    page.paste(doc.image, (0, 0))
    page.paste(right.image.crop((0, 0, 700, right.image.height)), (700, 0))
    r = server.ocr(encode(page, "PNG"), "image/png")
    assert [line["text"] for line in r.json()["pages"][0]["lines"]] == ["Name", "Amount", "Alice", "1200"]


@pytest.mark.parametrize("orientation", [6, 8, 3])
def test_exif_orientation_is_applied_and_boxes_follow_it(server, orientation):
    doc = render(TEXTS["en"][:2])
    r = server.ocr(jpeg_with_orientation(doc.image, orientation), "image/jpeg")
    assert r.status_code == 200
    [page] = r.json()["pages"]
    assert (page["width"], page["height"]) == doc.image.size
    assert cer(doc.text, page["text"]) < 0.03
    for line, drawn in zip(page["lines"], doc.boxes, strict=True):
        assert iou(line["bbox"], normalise(drawn, doc.image.size)) > 0.5


def test_large_image_is_downscaled_but_reported_at_its_size(server):
    doc = render(TEXTS["en"], size=120, width=4200)
    r = server.ocr(encode(doc.image, "JPEG", quality=85), "image/jpeg")
    [page] = r.json()["pages"]
    assert (page["width"], page["height"]) == doc.image.size
    assert cer(doc.text, page["text"]) < 0.03


def test_pdf_pages_and_selection(server):
    docs = [render([TEXTS["en"][i], f"Page number {i + 1}"]) for i in range(3)]
    data = pdf([d.image for d in docs])
    with server.client() as c:
        r = c.post("/v1/ocr", files={"file": ("doc.pdf", data, "application/pdf")})
        assert r.status_code == 200, r.text
        assert [p["page"] for p in r.json()["pages"]] == [1, 2, 3]
        for got, doc in zip(r.json()["pages"], docs, strict=True):
            assert cer(doc.text, got["text"]) < 0.03
        r = c.post(
            "/v1/ocr", params={"pages": "1,3"}, content=data, headers={"Content-Type": "application/pdf"}
        )
    pages = r.json()["pages"]
    assert [p["page"] for p in pages] == [1, 3]
    assert "Page number 3" in pages[1]["text"]
    # PDF pages are reported at pdf_dpi (200): the page was written at 150 DPI.
    assert abs(pages[0]["width"] - docs[0].image.width * 200 / 150) <= 2


def test_multipage_tiff_frames_become_pages(server):
    docs = [render([f"Frame {n} of the scan"]) for n in (1, 2)]
    r = server.ocr(multipage_tiff([d.image for d in docs]), "image/tiff")
    assert [p["page"] for p in r.json()["pages"]] == [1, 2]
    assert "Frame 1" in r.json()["pages"][0]["text"] and "Frame 2" in r.json()["pages"][1]["text"]


@pytest.mark.parametrize(("fmt", "ctype"), [("WEBP", "image/webp"), ("BMP", "image/bmp")])
def test_other_formats(server, fmt, ctype):
    doc = render(TEXTS["en"][:1])
    r = server.ocr(encode(doc.image, fmt), ctype)
    assert r.status_code == 200
    assert cer(doc.text, r.json()["pages"][0]["text"]) < 0.03


def test_transparent_png_is_read_on_white(server):
    doc = render(TEXTS["en"][:1])
    rgba = doc.image.convert("L").point(lambda v: 255 - v)  # alpha = ink
    layer = Image.new("RGBA", doc.image.size, (0, 0, 0, 0))
    layer.putalpha(rgba)
    r = server.ocr(encode(layer, "PNG"), "image/png")
    assert cer(doc.text, r.json()["pages"][0]["text"]) < 0.03


def test_blank_page_has_no_lines(server):
    r = server.ocr(encode(Image.new("RGB", (800, 600), "white"), "PNG"), "image/png")
    assert r.status_code == 200
    assert r.json()["pages"][0]["lines"] == [] and r.json()["pages"][0]["text"] == ""


@pytest.mark.parametrize("sent", ["bad id\twith spaces", "x" * 129, "a/b", ""])
def test_sent_request_id_must_be_sane(server, sent):
    r = server.ocr(b"", "image/png", headers={"X-Request-ID": sent})
    rid = r.headers["x-request-id"]
    assert re.fullmatch("[0-9a-f]{32}", rid), rid  # replaced by one of the app's own
    assert r.json()["error"]["request_id"] == rid


def test_sane_request_id_is_kept(server):
    sent = "lb-7f3a:retry.1@edge_2"
    r = server.ocr(b"", "image/png", headers={"X-Request-ID": sent})
    assert r.headers["x-request-id"] == r.json()["error"]["request_id"] == sent


def decode_preview(page: dict) -> Image.Image:
    head, _, b64 = page["preview"].partition(",")
    assert head == "data:image/jpeg;base64"
    im = Image.open(io.BytesIO(base64.b64decode(b64, validate=True)))
    assert im.format == "JPEG"
    im.load()
    return im


def assert_preview_is_the_page(page: dict) -> Image.Image:
    im = decode_preview(page)
    assert max(im.size) <= 1024
    assert im.width / im.height == pytest.approx(page["width"] / page["height"], rel=0.01)
    # The boxes are drawn over this picture: ink inside each line's box, paper outside all of them.
    gray = im.convert("L")
    for line in page["lines"]:
        x0, y0, x1, y1 = line["bbox"]
        box = gray.crop((x0 * im.width, y0 * im.height, x1 * im.width, y1 * im.height))
        assert box.getextrema()[0] < 100, line["text"]
    below_last = max(line["bbox"][3] for line in page["lines"])
    assert gray.crop((0, (below_last + 0.02) * im.height, im.width, im.height)).getextrema()[0] > 200
    return im


@pytest.mark.parametrize(
    ("data", "ctype"),
    [
        pytest.param(lambda doc: encode(doc.image, "PNG"), "image/png", id="png"),
        pytest.param(lambda doc: jpeg_with_orientation(doc.image, 6), "image/jpeg", id="exif-rotated-jpeg"),
    ],
)
def test_preview_is_the_page_the_boxes_refer_to(server, data, ctype):
    doc = render(TEXTS["en"], size=60, width=2400)  # larger than max_image_side and the preview
    r = server.ocr(data(doc), ctype, params={"preview": "true"})
    assert r.status_code == 200, r.text
    [page] = r.json()["pages"]
    assert (page["width"], page["height"]) == doc.image.size
    assert len(page["lines"]) == len(doc.lines)
    im = assert_preview_is_the_page(page)
    assert max(im.size) == 1024


def test_preview_of_each_pdf_page(server):
    docs = [render([TEXTS["en"][0], "First page"]), render(["Second page", "of two"], width=900)]
    r = server.ocr(pdf([d.image for d in docs]), "application/pdf", params={"preview": "1"})
    assert r.status_code == 200, r.text
    pages = r.json()["pages"]
    assert [p["page"] for p in pages] == [1, 2]
    shapes = [assert_preview_is_the_page(p).size for p in pages]
    assert shapes[0][0] / shapes[0][1] != pytest.approx(shapes[1][0] / shapes[1][1], rel=0.1)


@pytest.mark.parametrize("params", [{}, {"preview": "false"}])
def test_no_preview_unless_asked(server, params):
    r = server.ocr(encode(render(TEXTS["en"][:1]).image, "PNG"), "image/png", params=params)
    assert r.status_code == 200
    [page] = r.json()["pages"]
    assert set(page) == {"page", "width", "height", "text", "rotation", "lines", "blocks", "warnings"}


@pytest.mark.parametrize("value", ["maybe", "", "2"])
def test_bad_preview_value_is_422(server, value):
    r = server.ocr(encode(render(TEXTS["en"][:1]).image, "PNG"), "image/png", params={"preview": value})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "invalid_parameter"
    assert "preview" in r.json()["error"]["message"]
