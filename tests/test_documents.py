"""Preprocessing in-process: limits, page selection, sniffing, resize (no engine needed)."""

from __future__ import annotations

import base64
import io
import subprocess

import numpy as np
import pypdfium2 as pdfium
import pytest
from PIL import Image

from ocr_app.documents.image import PREVIEW_MAX_SIDE, Limits, fit, shrink, shrink_array
from ocr_app.documents.pages import count_pages, load_pages
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


def test_a_malformed_selection_is_quoted_to_its_first_40_characters():
    for spec, quoted in (("a" * 40, "a" * 40), ("b" * 41, "b" * 40), ("1-3;" + "9" * 60, "1-3;" + "9" * 36)):
        with pytest.raises(OcrError) as exc:
            parse_page_selection(spec, 50)
        assert exc.value.message == f"pages must look like '1-3,5', got '{quoted}'"


def test_page_selection_at_max_pages_and_one_past():
    # 50 pages selected: at the limit; 51, in one range or over several: one past it.
    assert parse_page_selection("1-50", 50) == list(range(1, 51))
    assert parse_page_selection("1-25,26-49,50", 50) == list(range(1, 51))
    assert parse_page_selection("1-50,50,3-4", 50) == list(range(1, 51))  # pages named twice count once
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


# 3000 x 2000: under twice the side, decoded whole; 4000 x 3000: decoded at half scale from the DCT.
@pytest.mark.parametrize(
    ("size", "drafted", "out"),
    [((3000, 2000), (3000, 2000), (1540, 1027)), ((4000, 3000), (2000, 1500), (1540, 1155))],
)
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_jpeg_decoded_by_opencv_has_pillows_pixels(mode, size, drafted, out):
    """The JPEG fast path (OpenCV's decode at the draft scale) against Pillow's decode of the same file and
    the same resize: equal pixels; in a decode worker (bgr=True) the same pixels as OpenCV's array."""
    photo = render(["Fast path 12"]).image.resize(size).convert(mode)
    data = encode(photo, "JPEG")
    [page] = load_pages(data, "image/jpeg", None, LIMITS)
    pillow = Image.open(io.BytesIO(data))
    pillow.draft("RGB", out)
    assert pillow.size == drafted
    expected = shrink(pillow.convert("RGB"), out)
    assert page.image.size == expected.size == out
    assert np.array_equal(np.asarray(page.image), np.asarray(expected))
    [worker] = load_pages(data, "image/jpeg", None, LIMITS, bgr=True)
    assert worker.image is None and worker.size == out
    assert np.array_equal(worker.bgr[..., ::-1], np.asarray(expected))


@pytest.mark.parametrize("factor", [1, 2, 4, 8])
def test_every_draft_scale_takes_opencvs_path(factor):
    """Each DCT scale libjpeg offers (1, 1/2, 1/4, 1/8) is decoded by OpenCV in a decode worker (the array,
    no image), with the pixels of Pillow's draft decode."""
    limits = Limits(max_pixels=50_000_000, max_image_side=200, max_pages=50, pdf_dpi=200)
    data = encode(render(["Scale 8"]).image.resize((200 * factor, 150 * factor)), "JPEG")
    pillow = Image.open(io.BytesIO(data))
    pillow.draft("RGB", (200, 150))
    assert pillow.size == (200, 150)
    [worker] = load_pages(data, "image/jpeg", None, limits, bgr=True)
    assert worker.image is None and worker.size == (200, 150)
    assert np.array_equal(worker.bgr[..., ::-1], np.asarray(pillow.convert("RGB")))


@pytest.mark.parametrize(
    "opencv",
    [lambda data, flags: None, lambda data, flags: np.zeros((7, 9, 3), np.uint8)],
    ids=["refused", "other-size"],
)
def test_a_jpeg_opencv_refuses_or_reads_at_another_size_takes_pillows_path(monkeypatch, opencv):
    """OpenCV's fast path answers only with an array of Pillow's size: refused (None) or another size, the
    page is Pillow's decode (recomputed here), in a decode worker too."""
    from ocr_app.documents import raster

    data = encode(render(["Slow path"]).image.resize((400, 300)), "JPEG")
    monkeypatch.setattr(raster.cv2, "imdecode", opencv)
    want = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    [page] = load_pages(data, "image/jpeg", None, LIMITS)
    assert np.array_equal(np.asarray(page.image), want)
    [worker] = load_pages(data, "image/jpeg", None, LIMITS, bgr=True)
    assert worker.size == (400, 300)


def test_jpeg_without_its_end_marker_is_refused_not_filled_in():
    data = encode(render(["Cut short"]).image.resize((3000, 2000)), "JPEG")
    assert code_of(load_pages, data[: len(data) * 2 // 3], "image/jpeg", None, LIMITS) == "invalid_image"


@pytest.mark.parametrize("orientation", [2, 3, 4, 5, 6, 7, 8])
def test_every_exif_orientation_is_shown_upright(orientation):
    # Quadrants of four colours, 120 x 80: stored turned or mirrored, read back upright with its size.
    quads = {(0, 0): (255, 0, 0), (60, 0): (0, 255, 0), (0, 40): (0, 0, 255), (60, 40): (255, 255, 255)}
    img = Image.new("RGB", (120, 80))
    for (x, y), colour in quads.items():
        img.paste(colour, (x, y, x + 60, y + 40))
    [page] = load_pages(jpeg_with_orientation(img, orientation), "image/jpeg", None, LIMITS)
    assert (page.width, page.height) == page.image.size == (120, 80)
    for (x, y), colour in quads.items():
        got = page.image.getpixel((x + 30, y + 20))
        assert max(abs(a - b) for a, b in zip(got, colour, strict=True)) < 40, (x, y, got, colour)


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


# Through one form drawn 100 times (each invocation its own copies), flat on the page, through 100 empty
# forms (each counts itself, nothing more), and with the page's own objects one short of the bound, a form
# among them (one more fill there: the page's own count reaches the bound, its form's fill goes past it).
@pytest.mark.parametrize(
    ("forms", "fills", "extra"),
    [
        (100, 999, 0),
        (0, 0, MAX_PDF_PAGE_OBJECTS),
        (100, 0, MAX_PDF_PAGE_OBJECTS - 100),
        (1, 1, MAX_PDF_PAGE_OBJECTS - 2),
    ],
)
def test_pdf_page_at_the_object_bound_is_served_and_one_more_is_refused(forms, fills, extra):
    assert forms * (1 + fills) + extra == MAX_PDF_PAGE_OBJECTS == 100_000
    [page] = load_pages(h.pdf_form_fills(forms, fills, extra), "application/pdf", None, LIMITS)
    assert page.image.size == (1190, 1540)
    with pytest.raises(OcrError) as exc:
        load_pages(h.pdf_form_fills(forms, fills, extra + 1), "application/pdf", None, LIMITS)
    assert exc.value.code == "invalid_image"
    assert "PDF page 1 draws more than 100 000 objects" in exc.value.message
    # The nesting is named only where forms were walked: one level here, none on the flat page nor where the
    # page's own objects (each form drawn counts one) are past the bound already.
    walked = forms > 0 and forms + extra + 1 <= MAX_PDF_PAGE_OBJECTS
    assert ("(form XObjects nested 1 deep)" in exc.value.message) == walked, exc.value.message
    assert ("nested" in exc.value.message) == walked, exc.value.message


def test_pdf_nested_forms_are_refused_before_anything_renders(monkeypatch):
    def render(*args, **kwargs):
        raise AssertionError("rendered")

    monkeypatch.setattr(pdfium.PdfPage, "render", render)
    # 6 forms nested, each drawing the next 10 times: 211 111 objects from 3 KB (10^5 page-sized fills).
    with pytest.raises(OcrError) as exc:
        load_pages(h.nested_xobject_pdf(5), "application/pdf", None, LIMITS)
    assert exc.value.code == "invalid_image"
    assert "more than 100 000 objects (form XObjects nested 6 deep)" in exc.value.message


@pytest.mark.parametrize("frames", [2, 3])
def test_tiff_frames_are_pages_each_its_own(frames):
    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255)][:frames]
    data = multipage_tiff([Image.new("RGB", (40, 30), c) for c in colours])
    pages = load_pages(data, "image/tiff", None, LIMITS)
    assert [(p.number, p.image.getpixel((0, 0))) for p in pages] == list(enumerate(colours, 1))


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
    one_more = tiny * MAX_MULTIPART_PARTS + file_part + b"--B--\r\n"
    many = tiny * 200_000 + file_part + b"--B--\r\n"
    headers = b"".join(b"X-H%d: v\r\n" % i for i in range(10_000))
    crowded = b'--B\r\nContent-Disposition: form-data; name="file"\r\n' + headers + b"\r\nPNG\r\n--B--\r\n"
    bound = f"more than {MAX_MULTIPART_PARTS} parts"
    for body, why in ((one_more, bound), (many, bound), (crowded, "header count")):
        with pytest.raises(OcrError) as err:
            extract_multipart_file(body, ctype)
        assert err.value.code == "invalid_parameter" and why in err.value.message


def test_a_page_of_max_pixels_is_read_and_one_pixel_more_is_refused():
    limits = Limits(max_pixels=300 * 100, max_image_side=1540, max_pages=50, pdf_dpi=200)
    [page] = load_pages(encode(Image.new("RGB", (300, 100), "white"), "PNG"), "image/png", None, limits)
    assert page.image.size == (300, 100)
    with pytest.raises(OcrError) as exc:
        load_pages(encode(Image.new("RGB", (301, 100), "white"), "PNG"), "image/png", None, limits)
    assert exc.value.code == "image_too_large"
    assert exc.value.message == "page 1 is 301x100 = 30100 pixels; at most 30000"


def test_a_selection_past_the_documents_end_names_its_last_page():
    data = multipage_tiff([Image.new("RGB", (40, 30), "white")] * 3)
    assert [p.number for p in load_pages(data, "image/tiff", [1, 3], LIMITS)] == [1, 3]
    with pytest.raises(OcrError) as exc:
        load_pages(data, "image/tiff", [1, 2, 9], LIMITS)
    assert exc.value.code == "invalid_parameter"
    assert exc.value.message == "page 9 is out of range: the document has 3 page(s)"


def test_sixteen_bit_grey_keeps_its_high_byte():
    # PNG's 16-bit samples to 8: the high byte (v >> 8), as numpy computes it here.
    values = np.array([[0, 255, 256, 511, 32768, 51199, 65000, 65279, 65280, 65535]], dtype=np.uint16)
    [page] = load_pages(encode(Image.fromarray(values), "PNG"), "image/png", None, LIMITS)
    rgb = np.asarray(page.rgb())
    assert rgb.shape == (1, 10, 3)
    assert rgb[0, :, 0].tolist() == (values[0] >> 8).tolist() == [0, 0, 1, 1, 128, 199, 253, 254, 255, 255]
    assert (rgb[..., 0] == rgb[..., 1]).all() and (rgb[..., 1] == rgb[..., 2]).all()


def test_a_page_a_pixel_thin_keeps_a_pixel():
    assert fit((4000, 1), 1540) == (1540, 1)
    assert fit((1, 4000), 1540) == (1, 1540)
    assert fit((3000, 1500), 1540) == (1540, 770)
    [page] = load_pages(encode(Image.new("RGB", (4000, 1), "black"), "PNG"), "image/png", None, LIMITS)
    assert page.image.size == (1540, 1) and (page.width, page.height) == (4000, 1)


def test_a_whole_factor_shrink_is_the_mean_of_each_block():
    # Noise shrunk 4x (wider than high: each side's own factor counts): each pixel the mean of its 4 x 4
    # block, recomputed with numpy; a bilinear resize instead samples two of the four columns (off by tens).
    noise = np.random.default_rng(7).integers(0, 256, (100, 400, 3), dtype=np.uint8)
    mean = noise.reshape(25, 4, 100, 4, 3).mean(axis=(1, 3))
    for got in (np.asarray(shrink(Image.fromarray(noise), (100, 25))), shrink_array(noise, 100)):
        assert got.shape == (25, 100, 3)
        assert np.abs(got.astype(float) - mean).max() <= 1.0
    # Higher than wide: the factor is each side's own there too (the width's over the width).
    tall = np.ascontiguousarray(noise.transpose(1, 0, 2))
    for got in (np.asarray(shrink(Image.fromarray(tall), (25, 100))), shrink_array(tall, 100)):
        assert got.shape == (100, 25, 3)
        assert np.abs(got.astype(float) - mean.transpose(1, 0, 2)).max() <= 1.0
    # 4x across and 2x down: the box filter takes the smaller whole factor (2), the bilinear the rest,
    # which at exactly 2x is the mean of each pair: each pixel the mean of its 4 x 2 block.
    got = np.asarray(shrink(Image.fromarray(noise), (100, 50)))
    assert got.shape == (50, 100, 3)
    assert np.abs(got.astype(float) - noise.reshape(50, 2, 100, 4, 3).mean(axis=(1, 3))).max() <= 1.0
    # And 2x across, 4x down: the 2 x 4 block's.
    got = np.asarray(shrink(Image.fromarray(tall), (50, 100)))
    assert got.shape == (100, 50, 3)
    assert np.abs(got.astype(float) - tall.reshape(100, 4, 50, 2, 3).mean(axis=(1, 3))).max() <= 1.0


@pytest.mark.parametrize(
    ("declared", "code"),
    [
        ("image/png", "invalid_image"),  # a type we read, but the bytes are none of them
        ("application/pdf", "invalid_image"),
        ("", "invalid_image"),
        ("application/octet-stream", "invalid_image"),
        ("text/plain", "unsupported_media_type"),
        ("image/gif", "unsupported_media_type"),
    ],
)
def test_bytes_of_no_known_kind_are_refused_by_what_they_claim(declared, code):
    assert code_of(classify, b"GIF89a not a page we read", declared) == code


@pytest.mark.parametrize(
    ("size", "shown"), [((3000, 1500), (1024, 512)), ((1024, 300), (1024, 300)), ((600, 40), (600, 40))]
)
def test_a_preview_is_the_page_within_its_side(size, shown):
    assert PREVIEW_MAX_SIDE == 1024
    data = encode(Image.new("RGB", size, "white"), "PNG")
    [page] = load_pages(data, "image/png", None, LIMITS)
    assert page.preview is None  # only when asked
    [page] = load_pages(data, "image/png", None, LIMITS, preview=True)
    head, _, b64 = page.preview.partition(",")
    assert head == "data:image/jpeg;base64"
    with Image.open(io.BytesIO(base64.b64decode(b64))) as shot:
        assert (shot.format, shot.size) == ("JPEG", shown)


def test_pages_are_counted_without_reading_them_up_to_the_bound():
    white = Image.new("RGB", (40, 30), "white")
    five_pages, tiff = pdf([white] * 5, dpi=72), multipage_tiff([white] * 3)
    assert count_pages(five_pages, "application/pdf", 10) == 5
    assert count_pages(five_pages, "application/pdf", 5) == 5
    assert count_pages(five_pages, "application/pdf", 4) == 4
    assert count_pages(tiff, "image/tiff", 10) == 3
    assert count_pages(tiff, "image/tiff", 2) == 2
    assert count_pages(encode(white, "PNG"), "image/png", 10) == 1


def pdf_of_mediabox(box: list[int]) -> bytes:
    return h.text_pdf(media_box=b" ".join(b"%d" % n for n in box))


def test_a_pdf_page_at_the_side_bound_is_read_and_one_point_more_is_refused():
    [page] = load_pages(pdf_of_mediabox([0, 0, 14_400, 100]), "application/pdf", None, LIMITS)
    # 14 400 x 100 pt at 200 dpi: 40 000 x 278 px, rendered within 1540 px (26 px a pixel, the height so).
    assert page.image.size == (1540, 11) and page.width == 40_000 and abs(page.height - 278) < 26
    for box in ([0, 0, 14_401, 100], [0, 0, 100, 14_401]):
        with pytest.raises(OcrError) as exc:
            load_pages(pdf_of_mediabox(box), "application/pdf", None, LIMITS)
        assert exc.value.code == "invalid_image"
        assert exc.value.message.startswith(
            f"PDF page 1 is {box[2]} x {box[3]} pt: a page is at most 14 400 pt"
        )
    # Under a point a side is a page all the same (the bound is above 0): a pixel or two at 200 dpi.
    for box, size in ((b"0 0 100 0.5", (278, 2)), (b"0 0 0.5 100", (2, 278))):
        [page] = load_pages(h.text_pdf(media_box=box), "application/pdf", None, LIMITS)
        assert (page.width, page.height) == size
    # A page of no area is not refused: PDFium reports US Letter for it (pdf.py relies on this).
    for box in ([0, 0, 100, 0], [0, 0, 0, 100]):
        [page] = load_pages(pdf_of_mediabox(box), "application/pdf", None, LIMITS)
        assert (page.width, page.height) == (1700, 2200)


def test_a_filled_in_form_fields_value_is_drawn(tmp_path):
    # A text field's value with no appearance stream of its own (NeedAppearances): drawn by PDFium's form
    # layer, inside the field's rectangle (20-280 x 80-120 pt: at 200 dpi x 56-778, y 222-333 from the
    # top), and nothing elsewhere on the page; where poppler (a second reader) draws it, within 3 px.
    # Without the form layer the page is blank.
    data = h.filled_form_pdf()
    [page] = load_pages(data, "application/pdf", None, LIMITS)
    ink = np.asarray(page.image.convert("L")) < 128
    assert page.image.size == (834, 556)
    field = np.zeros_like(ink)
    field[222:334, 55:779] = True
    assert ink[field].sum() > 500, "the field's value is not drawn"
    assert not ink[~field].any(), np.argwhere(ink & ~field)[:5]
    (tmp_path / "form.pdf").write_bytes(data)
    poppler_cmd = ["pdftoppm", "-r", "200", "-gray", "-singlefile", "form.pdf", "poppler"]
    subprocess.run(poppler_cmd, cwd=tmp_path, check=True)
    poppler = np.asarray(Image.open(tmp_path / "poppler.pgm")) < 128

    def bbox(a):
        ys, xs = np.nonzero(a)
        return np.asarray([ys.min(), ys.max(), xs.min(), xs.max()])

    assert poppler.shape == ink.shape
    assert np.abs(bbox(ink) - bbox(poppler)).max() <= 3, (bbox(ink), bbox(poppler))


def test_a_pdf_page_pdfium_cannot_render_is_named(monkeypatch):
    # PDFium refuses a bitmap or a render (pypdfium2's PdfiumError): the page is named, as an invalid
    # document, not a server error.
    def refuse(self, **kwargs):
        raise pdfium.PdfiumError("Failed to create bitmap")

    monkeypatch.setattr(pdfium.PdfPage, "render", refuse)
    with pytest.raises(OcrError) as exc:
        load_pages(pdf_of_mediabox([0, 0, 100, 100]), "application/pdf", None, LIMITS)
    assert exc.value.code == "invalid_image"
    assert exc.value.message == "cannot render PDF page 1: Failed to create bitmap"


def test_a_document_that_cannot_be_opened_cannot_be_counted():
    assert code_of(count_pages, b"%PDF-1.4 garbage", "application/pdf", 10) == "invalid_image"
    assert code_of(count_pages, b"\x89PNG\r\n\x1a\n garbage", "image/png", 10) == "invalid_image"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"RIFF\x24\x00\x00\x00WEBPVP8 ", "image/webp"),
        (b"RIFF\x24\x00\x00\x00WAVEfmt ", None),  # a RIFF of another kind
        (b"RIFX\x24\x00\x00\x00WEBPVP8 ", None),
        # the header may start anywhere in the first 1024 bytes ...
        (b" " * 1019 + b"%PDF-1.7", "application/pdf"),
        (b" " * 1020 + b"%PDF-1.7", None),  # ... and end there
    ],
)
def test_sniffing_at_the_edges_of_the_magic(data, expected):
    if expected is None:
        assert code_of(classify, data, "") == "invalid_image"
    else:
        assert classify(data, "") == expected


def test_a_transparent_palette_page_is_on_white_paper():
    img = Image.new("P", (40, 30), 0)
    img.putpalette([0, 0, 0, 200, 0, 0] + [0] * 762)
    img.paste(1, (0, 0, 20, 30))  # the left half red, the right half index 0: black, and transparent
    img.info["transparency"] = 0
    [page] = load_pages(encode(img, "PNG"), "image/png", None, LIMITS)
    assert page.image.getpixel((5, 15)) == (200, 0, 0)
    assert page.image.getpixel((35, 15)) == (255, 255, 255)


@pytest.mark.parametrize(
    ("mode", "ink", "key"),
    [("RGB", (200, 0, 0), (0, 0, 0)), ("L", 90, 0)],
)
def test_a_png_with_a_colour_key_is_on_white_paper(mode, ink, key):
    """An RGB or grey PNG marks its transparent pixels by one colour (a tRNS chunk), here black."""
    img = Image.new(mode, (40, 30), key)
    img.paste(ink, (0, 0, 20, 30))
    data = encode(img, "PNG", transparency=key)
    assert b"tRNS" in data  # the key is in the file, not only in Pillow's info
    [page] = load_pages(data, "image/png", None, LIMITS)
    assert page.image.getpixel((5, 15)) == (ink if mode == "RGB" else (ink,) * 3)
    assert page.image.getpixel((35, 15)) == (255, 255, 255)


def test_a_pdf_page_one_point_wide_is_read():
    [page] = load_pages(pdf_of_mediabox([0, 0, 1, 100]), "application/pdf", None, LIMITS)
    assert page.image.size == (3, 278)
