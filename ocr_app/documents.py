"""Upload -> pages: type sniffing, byte/pixel/page limits, EXIF, resize, PDF and TIFF pages.

Everything here is CPU-bound and runs in a decode worker process (ocr_app/decode.py), never in the
server process. Documents live in memory only. Limits are enforced from headers before any full decode,
so a decompression bomb costs a header read.
"""

from __future__ import annotations

import base64
import re
import threading
from dataclasses import dataclass
from io import BytesIO
from typing import TYPE_CHECKING

import cv2
import numpy as np
import pypdfium2 as pdfium
from PIL import Image, ImageOps, UnidentifiedImageError
from python_multipart.multipart import MultipartParser, parse_options_header

from .errors import (
    ImageTooLarge,
    InvalidDocument,
    InvalidParameter,
    TooManyPages,
    UnsupportedMediaType,
)

if TYPE_CHECKING:
    from .config import Settings

RASTER_TYPES = {
    "image/png": "PNG",
    "image/jpeg": "JPEG",
    "image/webp": "WEBP",
    "image/tiff": "TIFF",
    "image/bmp": "BMP",
}
PDF_TYPE = "application/pdf"
SUPPORTED_TYPES = (*RASTER_TYPES, PDF_TYPE)
MULTIPART_TYPE = "multipart/form-data"

# Our max_pixels check runs on every frame's header before any decode; Pillow's own global bomb
# limit would refuse with a less precise message and ignore a max_pixels set above it.
Image.MAX_IMAGE_PIXELS = None

# PDFium is not thread-safe: one document operation at a time in this process.
_PDFIUM_LOCK = threading.Lock()

_EXIF_ORIENTATION = 0x0112
# `preview=true`: the page the engine saw, small enough to send back inside the JSON.
PREVIEW_MAX_SIDE = 1024
PREVIEW_JPEG_QUALITY = 80
# ASCII digits and spaces only, matched whole: Python's `\d`/`\s` take any Unicode digit or separator (the
# fuzzer's "0\x1f", which int() refuses: a 500), `$` a trailing newline; int() refuses over 4300 digits.
_N = r"[ \t]*[0-9]{1,18}[ \t]*"
_SELECTION_RE = re.compile(rf"{_N}(-{_N})?(,{_N}(-{_N})?)*")


@dataclass(frozen=True)
class Limits:
    max_pixels: int
    max_image_side: int
    max_pages: int
    pdf_dpi: int

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(settings.max_pixels, settings.max_image_side, settings.max_pages, settings.pdf_dpi)


@dataclass
class PageImage:
    number: int  # 1-based page or frame number in the document
    image: Image.Image  # RGB, longest side <= max_image_side; None while `bgr` holds the pixels
    width: int  # the page as sent (after EXIF orientation); PDF pages at pdf_dpi
    height: int
    preview: str | None = None  # a JPEG data URL of `image` (longest side <= PREVIEW_MAX_SIDE), if asked
    # The pixels as OpenCV's array (H x W x 3, BGR) instead: in a decode worker where OpenCV decoded them
    # (load_pages(..., bgr=True)), and in the server for every page of the decode pool (its page file,
    # mapped). The rapidocr engine reads it as it is; rgb() makes the image where an engine wants one.
    bgr: np.ndarray | None = None

    @property
    def size(self) -> tuple[int, int]:
        return self.image.size if self.bgr is None else (self.bgr.shape[1], self.bgr.shape[0])

    @property
    def pixels(self) -> Image.Image | np.ndarray:
        """The page as it is held: OpenCV's array (BGR) where there is one, else the RGB image."""
        return self.image if self.bgr is None else self.bgr

    def rgb(self) -> Image.Image:
        """The page as an RGB image: where the array holds it, a new one (one copy) each time."""
        return self.image if self.bgr is None else _from_bgr(self.bgr)


def normalise_media_type(header: str | None) -> str:
    return (header or "").split(";", 1)[0].strip().lower()


def parse_page_selection(spec: str | None, max_pages: int) -> list[int] | None:
    """`1-3,5` -> [1, 2, 3, 5]; None selects every page."""
    if spec is None:
        return None
    if not _SELECTION_RE.fullmatch(spec):
        raise InvalidParameter(f"pages must look like '1-3,5', got {spec[:40]!r}")
    pages: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if first < 1 or last < first:
            raise InvalidParameter(f"invalid page range {part.strip()!r}: pages start at 1")
        if last - first + 1 > max_pages or len(pages) > max_pages:
            raise TooManyPages(f"at most {max_pages} pages per request")
        pages.update(range(first, last + 1))
    if len(pages) > max_pages:
        raise TooManyPages(f"at most {max_pages} pages per request")
    return sorted(pages)


def sniff(data: bytes) -> str | None:
    """The media type from the document's magic bytes; clients' Content-Types are often wrong."""
    head = data[:16]
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "image/tiff"
    if head.startswith(b"BM"):
        return "image/bmp"
    if b"%PDF-" in data[:1024]:
        return PDF_TYPE
    return None


def classify(data: bytes, declared: str) -> str:
    if not data:
        raise InvalidDocument("empty document")
    found = sniff(data)
    if found:
        return found
    if declared in SUPPORTED_TYPES or declared in ("", "application/octet-stream"):
        raise InvalidDocument("not a PNG, JPEG, WebP, TIFF, BMP or PDF document")
    raise UnsupportedMediaType(f"unsupported media type {declared!r}")


# A form sends `file` and perhaps a few fields beside it. Parsing stops at the first part past this bound:
# a body of thousands of tiny parts costs no more than a legitimate one (python-multipart bounds headers).
MAX_MULTIPART_PARTS = 8


class _Unbounded(Exception):
    pass


def extract_multipart_file(body: bytes, content_type: str) -> tuple[bytes, str]:
    """The `file` field of a multipart/form-data body, parsed in memory (never spooled to disk)."""
    _, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if not boundary:
        raise InvalidParameter("multipart/form-data without a boundary")

    parts: list[dict] = []
    current: dict = {}
    field: list[bytes] = []
    value: list[bytes] = []

    def on_part_begin() -> None:
        if len(parts) >= MAX_MULTIPART_PARTS:
            raise _Unbounded(f"more than {MAX_MULTIPART_PARTS} parts")
        current.clear()
        current.update(headers={}, data=[])

    def on_header_end() -> None:
        current["headers"][b"".join(field).lower()] = b"".join(value)
        field.clear()
        value.clear()

    def on_part_end() -> None:
        parts.append(dict(current))

    parser = MultipartParser(
        boundary,
        callbacks={
            "on_part_begin": on_part_begin,
            "on_part_data": lambda d, s, e: current["data"].append(d[s:e]),
            "on_part_end": on_part_end,
            "on_header_field": lambda d, s, e: field.append(d[s:e]),
            "on_header_value": lambda d, s, e: value.append(d[s:e]),
            "on_header_end": on_header_end,
        },
    )
    try:
        parser.write(body)
        parser.finalize()
    except _Unbounded as err:
        raise InvalidParameter(f"multipart body with {err}: send the document as one 'file' field") from None
    except Exception as err:  # python-multipart raises several error types for bad framing
        raise InvalidParameter(f"malformed multipart body: {err}") from None
    for part in parts:
        _, disp = parse_options_header(part["headers"].get(b"content-disposition", b""))
        if disp.get(b"name") == b"file":
            ctype = normalise_media_type(part["headers"].get(b"content-type", b"").decode("latin-1"))
            return b"".join(part["data"]), ctype
    raise InvalidParameter("multipart body has no 'file' field")


def load_pages(
    data: bytes,
    media_type: str,
    selection: list[int] | None,
    limits: Limits,
    preview: bool = False,
    bgr: bool = False,
) -> list[PageImage]:
    """The document's selected pages, each an RGB image; with `bgr`, pages that OpenCV decoded keep its
    array instead (`PageImage.bgr`, `image` None): the decode worker writes those bytes as they are."""
    if media_type == PDF_TYPE:
        pages = _pdf_pages(data, selection, limits)
    else:
        pages = _raster_pages(data, selection, limits)
    for page in pages:
        if not bgr:
            page.image, page.bgr = page.rgb(), None
        if preview:
            page.preview = preview_data_url(page.rgb())
    return pages


def count_pages(data: bytes, media_type: str, bound: int) -> int:
    """The document's page (PDF) or frame (TIFF) count, or `bound` if it has at least that many; nothing is
    rendered. What a bulk job splits into page ranges."""
    if media_type == PDF_TYPE:
        with _PDFIUM_LOCK:
            try:
                pdf = pdfium.PdfDocument(data)
            except pdfium.PdfiumError as err:
                raise InvalidDocument(f"cannot open PDF: {err}") from None
            try:
                return min(len(pdf), bound)
            finally:
                pdf.close()
    try:
        im = Image.open(BytesIO(data), formats=list(RASTER_TYPES.values()))
        return _count_frames(im, bound)
    except Image.DecompressionBombError as err:
        raise ImageTooLarge(str(err)) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, TypeError, KeyError, IndexError) as err:
        raise InvalidDocument(f"cannot decode image: {err}") from None


def preview_data_url(image: Image.Image) -> str:
    """`data:image/jpeg;base64,...` of the image the engine sees (EXIF applied, PDF rendered), longest
    side at most PREVIEW_MAX_SIDE: the picture that a page's normalised bboxes are drawn over."""
    if max(image.size) > PREVIEW_MAX_SIDE:
        image = image.resize(_fit(image.size, PREVIEW_MAX_SIDE), Image.Resampling.BILINEAR, reducing_gap=2.0)
    buf = BytesIO()
    image.save(buf, format="JPEG", quality=PREVIEW_JPEG_QUALITY, optimize=True)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _select(selection: list[int] | None, count: int, limits: Limits) -> list[int]:
    numbers = selection or list(range(1, count + 1))
    if numbers[-1] > count:
        raise InvalidParameter(f"page {numbers[-1]} is out of range: the document has {count} page(s)")
    if len(numbers) > limits.max_pages:
        raise TooManyPages(f"the document has {count} pages; at most {limits.max_pages}")
    return numbers


# ISO 32000-1 annex C: a page is at most 14 400 units (200 in) a side. A larger MediaBox is not a page that
# anyone prints: e.g. 10^9 x 1 pt, which scaled to max_image_side renders less than a pixel high.
MAX_PDF_PAGE_PT = 14_400.0
# A form XObject's objects are drawn each time it is invoked, so forms nested a few deep multiply: 3 KB of
# forms, each drawing the next 10 times, draw 10^5 page-sized fills (minutes of rendering). Real pages draw at
# most tens of thousands of objects (a dense text page a few thousand runs, a detailed map tens of thousands
# of paths); PDFium itself stops nesting at 40 levels. A constant, not a setting.
MAX_PDF_PAGE_OBJECTS = 100_000


def _unloadable_page(number: int, err: Exception) -> InvalidDocument:
    return InvalidDocument(f"cannot load PDF page {number}: {err}")


def _check_pdf_page_sizes(pdf: pdfium.PdfDocument, numbers: list[int]) -> None:
    """Every selected page's size, from the page tree (no page loaded, nothing rendered), before any work."""
    for number in numbers:
        try:
            w_pt, h_pt = pdf.get_page_size(number - 1)
        except pdfium.PdfiumError as err:
            raise _unloadable_page(number, err) from None
        if not (0 < w_pt <= MAX_PDF_PAGE_PT and 0 < h_pt <= MAX_PDF_PAGE_PT):
            raise InvalidDocument(
                f"PDF page {number} is {w_pt:g} x {h_pt:g} pt: a page is at most 14 400 pt (200 in) a side"
            )


def _count_pdf_page_objects(page: pdfium.PdfPage) -> tuple[int, int]:
    """(objects the page draws with its form XObjects expanded, deepest form nesting seen), counted from the
    loaded page (PDFium parses every form invocation at load) without rendering; counting stops once past
    MAX_PDF_PAGE_OBJECTS. Raw calls: pypdfium2's get_objects() wraps each object (3x slower, dense page)."""
    raw = pdfium.raw
    get_type, form_type = raw.FPDFPageObj_GetType, raw.FPDF_PAGEOBJ_FORM
    count = raw.FPDFPage_CountObjects(page)
    if count > MAX_PDF_PAGE_OBJECTS:
        return count, 0
    forms = [(obj, 1) for i in range(count) if get_type(obj := raw.FPDFPage_GetObject(page, i)) == form_type]
    deepest = 0
    while forms:
        form, level = forms.pop()  # depth first: the deepest nesting shows before the count runs out
        deepest = max(deepest, level)
        n = raw.FPDFFormObj_CountObjects(form)
        count += max(n, 0)
        if count > MAX_PDF_PAGE_OBJECTS:
            break
        for i in range(n):
            obj = raw.FPDFFormObj_GetObject(form, i)
            if get_type(obj) == form_type:
                forms.append((obj, level + 1))
    return count, deepest


def _load_pdf_pages(pdf: pdfium.PdfDocument, numbers: list[int]) -> list[pdfium.PdfPage]:
    """Every selected page loaded and its drawing work bounded, before any page renders (pages left open
    on an error are closed with the document)."""
    pages = []
    for number in numbers:
        try:
            page = pdf[number - 1]  # the page count may lie (a broken page tree)
        except pdfium.PdfiumError as err:
            raise _unloadable_page(number, err) from None
        pages.append(page)
        count, deepest = _count_pdf_page_objects(page)
        if count > MAX_PDF_PAGE_OBJECTS:
            nesting = f" (form XObjects nested {deepest} deep)" if deepest else ""
            bound = f"{MAX_PDF_PAGE_OBJECTS:,}".replace(",", " ")
            raise InvalidDocument(
                f"PDF page {number} draws more than {bound} objects{nesting}: a page draws at most {bound}"
            )
    return pages


def _pdf_pages(data: bytes, selection: list[int] | None, limits: Limits) -> list[PageImage]:
    out = []
    with _PDFIUM_LOCK:
        try:
            pdf = pdfium.PdfDocument(data)
        except pdfium.PdfiumError as err:
            raise InvalidDocument(f"cannot open PDF: {err}") from None
        try:
            numbers = _select(selection, len(pdf), limits)
            _check_pdf_page_sizes(pdf, numbers)
            pages = _load_pdf_pages(pdf, numbers)
            for number, page in zip(numbers, pages, strict=True):
                try:
                    w_pt, h_pt = page.get_size()
                    # Render at pdf_dpi, but never beyond max_image_side: a poster-sized page must
                    # not allocate a poster-sized bitmap.
                    full = limits.pdf_dpi / 72.0
                    scale = min(full, limits.max_image_side / max(w_pt, h_pt, 1.0))
                    image = page.render(scale=scale, may_draw_forms=True).to_pil().convert("RGB")
                except pdfium.PdfiumError as err:
                    raise InvalidDocument(f"cannot render PDF page {number}: {err}") from None
                finally:
                    page.close()  # the rest close with the document
                ratio = full / scale
                out.append(PageImage(number, image, round(image.width * ratio), round(image.height * ratio)))
        finally:
            pdf.close()
    return out


def _raster_pages(data: bytes, selection: list[int] | None, limits: Limits) -> list[PageImage]:
    try:
        im = Image.open(BytesIO(data), formats=list(RASTER_TYPES.values()))
        # Only TIFF is a multi-page document format; an animated WebP/PNG counts as its first frame.
        # Frames are walked only as far as the request needs: a 20 000-frame TIFF costs 51 IFD reads.
        count = _count_frames(im, selection[-1] if selection else limits.max_pages + 1)
    except Image.DecompressionBombError as err:
        raise ImageTooLarge(str(err)) from None
    # Pillow raises TypeError/KeyError/IndexError too for corrupt TIFF directories.
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, TypeError, KeyError, IndexError) as err:
        raise InvalidDocument(f"cannot decode image: {err}") from None
    if selection is None and count > limits.max_pages:
        raise TooManyPages(f"the document has more than {limits.max_pages} pages")
    out = []
    for number in _select(selection, count, limits):
        try:
            im.seek(number - 1)
        except (EOFError, OSError, SyntaxError, ValueError, TypeError, KeyError, IndexError) as err:
            raise InvalidDocument(f"cannot read image page {number}: {err}") from None
        page = _prepare_frame(im, data, number, limits)
        if page.image is im and count > 1:  # the frame itself: the next seek would turn it into another
            page.image = im.copy()
        out.append(page)
    return out


def _count_frames(im: Image.Image, bound: int) -> int:
    """The document's frame count, or `bound` if it has at least that many (TIFF only has more than one)."""
    if im.format != "TIFF":
        return 1
    count = 1
    while count < bound:
        try:
            im.seek(count)
        except EOFError:
            break
        count += 1
    return count


def _prepare_frame(im: Image.Image, data: bytes, number: int, limits: Limits) -> PageImage:
    raw_w, raw_h = im.size
    if raw_w * raw_h > limits.max_pixels:
        raise ImageTooLarge(
            f"page {number} is {raw_w}x{raw_h} = {raw_w * raw_h} pixels; at most {limits.max_pixels}",
        )
    try:
        orientation = im.getexif().get(_EXIF_ORIENTATION, 1)
        longest = max(raw_w, raw_h)
        if im.format == "JPEG" and longest > limits.max_image_side:
            # Decode at 1/2, 1/4 or 1/8 scale straight from the DCT: a 12 MP photo costs a 3 MP decode.
            im.draft("RGB", _fit(im.size, limits.max_image_side))
        bgr = _decode_jpeg_bgr(im, data, orientation)
        if bgr is None:
            im.load()
            if orientation != 1:
                im = ImageOps.exif_transpose(im)
            rgb = _to_rgb(im)
    except Image.DecompressionBombError as err:
        raise ImageTooLarge(str(err)) from None
    except (OSError, SyntaxError, ValueError, EOFError, TypeError, KeyError, IndexError) as err:
        raise InvalidDocument(f"cannot decode image page {number}: {err}") from None
    width, height = (raw_h, raw_w) if orientation in (5, 6, 7, 8) else (raw_w, raw_h)
    if bgr is not None:
        bgr = _shrink_array(bgr, limits.max_image_side)
        return PageImage(number, None, width, height, bgr=bgr)  # type: ignore[arg-type]
    if max(rgb.size) > limits.max_image_side:
        rgb = shrink(rgb, _fit(rgb.size, limits.max_image_side))
    return PageImage(number, rgb, width, height)


# Pillow's draft scale -> the same libjpeg-turbo DCT scaling through OpenCV.
_CV2_JPEG_SCALE = {
    1: cv2.IMREAD_COLOR,
    2: cv2.IMREAD_REDUCED_COLOR_2,
    4: cv2.IMREAD_REDUCED_COLOR_4,
    8: cv2.IMREAD_REDUCED_COLOR_8,
}


def _decode_jpeg_bgr(im: Image.Image, data: bytes, orientation: int) -> np.ndarray | None:
    """The JPEG decoded by OpenCV, at the scale Pillow's draft chose, straight into the array that the
    resize takes and the page file receives: the same libjpeg-turbo and the same pixels as Pillow's path,
    without its copies into and out of numpy (6 ms of a 12 MP photo's 46, measured). None where Pillow's
    path must answer instead: a rotated, CMYK or truncated file (OpenCV would fill in the missing rows),
    or one OpenCV refuses (Pillow then says why)."""
    whole = data.endswith(b"\xff\xd9")  # the end-of-image marker: not truncated
    if not (im.format == "JPEG" and im.mode in ("RGB", "L") and orientation == 1 and whole):
        return None
    scale = im.decoderconfig[0] if im.decoderconfig else 1  # type: ignore[attr-defined]
    flags = _CV2_JPEG_SCALE.get(scale)
    if flags is None:
        return None
    bgr = cv2.imdecode(np.frombuffer(data, np.uint8), flags | cv2.IMREAD_IGNORE_ORIENTATION)
    return bgr if bgr is not None and (bgr.shape[1], bgr.shape[0]) == im.size else None


def _from_bgr(bgr: np.ndarray) -> Image.Image:
    """An RGB image of OpenCV's pixels (one copy: Pillow unpacks BGR as it reads)."""
    return Image.frombuffer("RGB", (bgr.shape[1], bgr.shape[0]), bgr, "raw", "BGR", 0, 1)


def _fit(size: tuple[int, int], side: int) -> tuple[int, int]:
    """`size` scaled so that its longest side is `side`."""
    f = side / max(size)
    return max(1, round(size[0] * f)), max(1, round(size[1] * f))


def shrink(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """`image` (RGB) resized down to `size`: whole factors by a box filter (each output pixel the mean of
    k x k), the rest (under 2x, as after JPEG draft mode) by OpenCV's bilinear, which at under 2x still
    samples every source pixel and keeps text sharp: 3.4 ms for 2000x1500 -> 1540x1155 where Pillow's
    antialiased bilinear takes 24-32 (measured)."""
    k = min(image.width // size[0], image.height // size[1])
    if k >= 2:
        image = image.reduce(k)
    if image.size == size:
        return image
    return Image.fromarray(cv2.resize(np.asarray(image), size, interpolation=cv2.INTER_LINEAR))


def _shrink_array(bgr: np.ndarray, side: int) -> np.ndarray:
    """OpenCV's pixels with the longest side at most `side`, filtered as shrink() filters an image."""
    h, w = bgr.shape[:2]
    if max(w, h) <= side:
        return bgr
    size = _fit((w, h), side)
    k = min(w // size[0], h // size[1])
    # INTER_AREA at a whole factor is the box filter (Pillow's reduce); OpenCV takes the rest of it too.
    return cv2.resize(bgr, size, interpolation=cv2.INTER_AREA if k >= 2 else cv2.INTER_LINEAR)


def _to_rgb(im: Image.Image) -> Image.Image:
    if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
        # Transparent pixels are often black: put the page on white paper, as a viewer would.
        rgba = im.convert("RGBA")
        page = Image.new("RGB", rgba.size, "white")
        page.paste(rgba, mask=rgba.getchannel("A"))
        return page
    if im.mode in ("I;16", "I;16B", "I;16L", "I"):
        im = im.convert("I").point(lambda v: v * (1 / 256)).convert("L")
    elif im.mode == "F":
        im = im.convert("L")
    return im if im.mode == "RGB" else im.convert("RGB")


__all__ = [
    "MULTIPART_TYPE",
    "SUPPORTED_TYPES",
    "Limits",
    "PageImage",
    "classify",
    "extract_multipart_file",
    "load_pages",
    "normalise_media_type",
    "parse_page_selection",
    "preview_data_url",
]
