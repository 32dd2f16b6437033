"""Preprocessing in-process: limits, page selection, sniffing, resize (no engine needed)."""

from __future__ import annotations

import io

import numpy as np
import pypdfium2 as pdfium
import pytest
from PIL import Image

from ocr_app.documents.image import Limits, shrink
from ocr_app.documents.pages import load_pages
from ocr_app.documents.pdf import MAX_PDF_PAGE_OBJECTS
from ocr_app.documents.upload import (
    MAX_MULTIPART_PARTS,
    classify,
    extract_multipart_file,
    parse_page_selection,
)
from ocr_app.errors import OcrError

from . import hostile as h
from .docs import encode, jpeg_with_orientation, multipage_tiff, pdf, png_bomb, render

LIMITS = Limits(max_pixels=50_000_000, max_image_side=1540, max_pages=50, pdf_dpi=200)


def code_of(fn, *args) -> str:
    with pytest.raises(OcrError) as exc:
        fn(*args)
    return exc.value.code


@pytest.mark.parametrize(
    ("spec", "pages"),
    [("1-3,5", [1, 2, 3, 5]), ("2", [2]), (" 4 , 1-2 ", [1, 2, 4]), ("3,3", [3]), (None, None)],
)
def test_page_selection(spec, pages):
    assert parse_page_selection(spec, 50) == pages


def test_page_selection_limits():
    assert code_of(parse_page_selection, "1-1000000000", 50) == "too_many_pages"
    assert code_of(parse_page_selection, "0-2", 50) == "invalid_parameter"


def test_page_selection_at_max_pages_and_one_past():
    # 50 pages selected: at the limit; 51, in one range or over several: one past it.
    assert parse_page_selection("1-50", 50) == list(range(1, 51))
    assert parse_page_selection("1-25,26-49,50", 50) == list(range(1, 51))
    assert code_of(parse_page_selection, "1-51", 50) == "too_many_pages"
    assert code_of(parse_page_selection, "1-25,26-50,51", 50) == "too_many_pages"
    assert code_of(parse_page_selection, ",".join(str(n) for n in range(1, 52)), 50) == "too_many_pages"


@pytest.mark.parametrize("kind", ["tiff", "pdf"])
def test_a_document_of_max_pages_is_read_and_one_page_more_is_413(kind):
    tiny = [Image.new("RGB", (8, 8), (n, 0, 0)) for n in range(LIMITS.max_pages + 1)]

    def doc(pages):
        return (multipage_tiff(pages), "image/tiff") if kind == "tiff" else (pdf(pages), "application/pdf")

    pages = load_pages(*doc(tiny[: LIMITS.max_pages]), None, LIMITS)
    assert [p.number for p in pages] == list(range(1, LIMITS.max_pages + 1))
    assert code_of(load_pages, *doc(tiny), None, LIMITS) == "too_many_pages"


def test_a_tiffs_frames_are_walked_no_further_than_the_limit(monkeypatch):
    # 300 frames: refused after reading max_pages + 1 of their directories, not all 300.
    from PIL import TiffImagePlugin

    seeks: list[int] = []
    seek = TiffImagePlugin.TiffImageFile.seek

    def counting(self, frame):
        seeks.append(frame)
        return seek(self, frame)

    data = multipage_tiff([Image.new("1", (4, 4))] * 300)
    monkeypatch.setattr(TiffImagePlugin.TiffImageFile, "seek", counting)
    assert code_of(load_pages, data, "image/tiff", None, LIMITS) == "too_many_pages"
    assert max(seeks) == LIMITS.max_pages


# What API fuzzing found (a 500: int() refused what the pattern let through) and its neighbours.
@pytest.mark.parametrize("spec", ["0\x1f", "1\n", "1\x1c-2", "\u0663", "1-\uff12", "1" * 5000, "", ",", "1-"])
def test_page_selection_refuses_what_is_not_ascii_digits(spec):
    assert code_of(parse_page_selection, spec, 50) == "invalid_parameter"


def test_jpeg_is_draft_decoded_and_downscaled_to_max_side():
    big = Image.new("RGB", (4000, 3000), "white")
    [page] = load_pages(encode(big, "JPEG"), "image/jpeg", None, LIMITS)
    assert (page.width, page.height) == (4000, 3000)
    assert page.image.size == (1540, 1155)
    assert page.image.mode == "RGB"


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_jpeg_decoded_by_opencv_has_pillows_pixels(mode):
    """The JPEG fast path (OpenCV's decode at the draft scale) against Pillow's decode of the same file and
    the same resize: equal pixels; in a decode worker (bgr=True) the same pixels as OpenCV's array."""
    photo = render(["Fast path 12"]).image.resize((3000, 2000)).convert(mode)
    data = encode(photo, "JPEG")
    [page] = load_pages(data, "image/jpeg", None, LIMITS)
    pillow = Image.open(io.BytesIO(data))
    pillow.draft("RGB", (1540, 1027))
    expected = shrink(pillow.convert("RGB"), (1540, 1027))
    assert page.image.size == expected.size == (1540, 1027)
    assert np.array_equal(np.asarray(page.image), np.asarray(expected))
    [worker] = load_pages(data, "image/jpeg", None, LIMITS, bgr=True)
    assert worker.image is None and worker.size == (1540, 1027)
    assert np.array_equal(worker.bgr[..., ::-1], np.asarray(expected))


def test_jpeg_without_its_end_marker_is_refused_not_filled_in():
    data = encode(render(["Cut short"]).image.resize((3000, 2000)), "JPEG")
    assert code_of(load_pages, data[: len(data) * 2 // 3], "image/jpeg", None, LIMITS) == "invalid_image"


def test_exif_rotation_swaps_reported_size():
    img = render(["upright"]).image
    [page] = load_pages(jpeg_with_orientation(img, 6), "image/jpeg", None, LIMITS)
    assert (page.width, page.height) == img.size == page.image.size


def test_pdf_poster_page_is_rendered_within_max_side():
    poster = Image.new("RGB", (2000, 1000), "white")
    data = pdf([poster], dpi=10)  # a 200 x 100 inch page: 40000 x 20000 px at 200 DPI
    [page] = load_pages(data, "application/pdf", None, LIMITS)
    assert max(page.image.size) == 1540
    assert (page.width, page.height) == (40000, 20000)


# Through one form drawn 100 times (each invocation its own copies), and flat on the page.
@pytest.mark.parametrize(("forms", "fills", "extra"), [(100, 999, 0), (0, 0, MAX_PDF_PAGE_OBJECTS)])
def test_pdf_page_at_the_object_bound_is_served_and_one_more_is_refused(forms, fills, extra):
    assert forms * (1 + fills) + extra == MAX_PDF_PAGE_OBJECTS == 100_000
    [page] = load_pages(h.pdf_form_fills(forms, fills, extra), "application/pdf", None, LIMITS)
    assert page.image.size == (1190, 1540)
    with pytest.raises(OcrError) as exc:
        load_pages(h.pdf_form_fills(forms, fills, extra + 1), "application/pdf", None, LIMITS)
    assert exc.value.code == "invalid_image"
    assert "PDF page 1 draws more than 100 000 objects" in exc.value.message


def test_pdf_nested_forms_are_refused_before_anything_renders(monkeypatch):
    def render(*args, **kwargs):
        raise AssertionError("rendered")

    monkeypatch.setattr(pdfium.PdfPage, "render", render)
    # 6 forms nested, each drawing the next 10 times: 211 111 objects from 3 KB (10^5 page-sized fills).
    with pytest.raises(OcrError) as exc:
        load_pages(h.nested_xobject_pdf(5), "application/pdf", None, LIMITS)
    assert exc.value.code == "invalid_image"
    assert "more than 100 000 objects (form XObjects nested 6 deep)" in exc.value.message


def test_tiff_frames_are_pages_each_its_own():
    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255)]
    data = multipage_tiff([Image.new("RGB", (40, 30), c) for c in colours])
    pages = load_pages(data, "image/tiff", None, LIMITS)
    assert [(p.number, p.image.getpixel((0, 0))) for p in pages] == [
        (1, colours[0]),
        (2, colours[1]),
        (3, colours[2]),
    ]


def test_bomb_refused_from_header():
    assert code_of(load_pages, png_bomb(), "image/png", None, LIMITS) == "image_too_large"


def test_sixteen_bit_grey_and_palette_images_become_rgb():
    grey16 = Image.new("I;16", (300, 100), 40000)
    palette = Image.new("P", (300, 100), 3)
    for img, fmt in ((grey16, "PNG"), (palette, "PNG"), (Image.new("CMYK", (300, 100)), "JPEG")):
        [page] = load_pages(encode(img, fmt), classify(encode(img, fmt), ""), None, LIMITS)
        assert page.image.mode == "RGB"


@pytest.mark.parametrize(
    ("data", "declared", "expected"),
    [
        (b"%PDF-1.4 ...", "application/octet-stream", "application/pdf"),
        (b"\xff\xd8\xff\xe0rest", "image/png", "image/jpeg"),  # content wins over a wrong label
        (b"II*\x00....", "", "image/tiff"),
    ],
)
def test_sniffing(data, declared, expected):
    assert classify(data, declared) == expected


def test_multipart_parsed_in_memory():
    body = (
        b'--XyZ\r\nContent-Disposition: form-data; name="note"\r\n\r\nhello\r\n'
        b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a.png"\r\n'
        b"Content-Type: image/png\r\n\r\n\x89PNG-bytes\r\n--XyZ--\r\n"
    )
    assert extract_multipart_file(body, "multipart/form-data; boundary=XyZ") == (
        b"\x89PNG-bytes",
        "image/png",
    )
    assert code_of(extract_multipart_file, body, "multipart/form-data") == "invalid_parameter"


def test_multipart_parsing_is_bounded():
    file_part = b'--B\r\nContent-Disposition: form-data; name="file"\r\n\r\nPNG\r\n'
    tiny = b'--B\r\nContent-Disposition: form-data; name="x"\r\n\r\n\r\n'
    ctype = "multipart/form-data; boundary=B"
    few = tiny * (MAX_MULTIPART_PARTS - 1) + file_part + b"--B--\r\n"
    assert extract_multipart_file(few, ctype) == (b"PNG", "")
    # Thousands of parts (the file last): refused at the first part past the bound.
    many = tiny * 200_000 + file_part + b"--B--\r\n"
    headers = b"".join(b"X-H%d: v\r\n" % i for i in range(10_000))
    crowded = b'--B\r\nContent-Disposition: form-data; name="file"\r\n' + headers + b"\r\nPNG\r\n--B--\r\n"
    for body, why in ((many, f"more than {MAX_MULTIPART_PARTS} parts"), (crowded, "header count")):
        with pytest.raises(OcrError) as err:
            extract_multipart_file(body, ctype)
        assert err.value.code == "invalid_parameter" and why in err.value.message
