"""format=pdf: the document's own pages with an invisible text layer, word by word: a searchable PDF.

The base pages:
- a PDF is opened with pikepdf (qpdf) and kept as it is (content, fonts, annotations and links, metadata,
  outlines); only the pages not selected by `pages=` are removed;
- an image becomes one page per image (per TIFF frame selected) through img2pdf, losslessly: a JPEG's bytes
  are embedded as they came (DCTDecode, never re-encoded), PNG and TIFF without loss (a PNG's alpha as a
  soft mask); WebP, BMP, a multi-frame TIFF, a mirrored EXIF orientation go through Pillow to PNG first
  (orientation applied, alpha flattened on white: the pixels the engine saw). An EXIF orientation is the
  page's /Rotate (img2pdf), as the app applies it. The page's size: the pixels at the image's resolution,
  96 dpi where it names none (or an implausible one).

The layer: the answer's words (each line's text split on spaces, boxes estimated from the line's as for
hOCR: geometry.py), in reading order (blocks, then their lines), drawn in text render mode 3 (invisible) by
OCRmyPDF's renderer (fpdf2, its glyphless font: any Unicode text, stretched to each word's box) on a page of
the upright page's size, then placed over the base page as a form XObject (pikepdf `add_overlay`, which
undoes the page's /Rotate, so the layer lies the way the page is shown).

Rotation: where the engine turned a page to read it (`rotation` 90/180/270), the page's /Rotate is turned by
as much: it is shown upright, its content untouched, and the layer follows.

A PDF page that already carries text (its content stream, or a form XObject it draws, has a text-showing
operator: Tj, TJ, ' or ") is left as it is, without a second layer: its own text (visible, or an earlier
OCR's invisible layer) is what search and copy find. Such a page's JSON text still comes from the engine.
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import img2pdf
import pikepdf
from PIL import Image, ImageOps, UnidentifiedImageError

from ...documents.upload import (
    MULTIPART_TYPE,
    PDF_TYPE,
    classify,
    extract_multipart_file,
    normalise_media_type,
)
from ...errors import InvalidDocument
from ...schemas import OcrResponse, Page
from .geometry import block_lines, union, words

MEDIA_TYPE = "application/pdf"

# The layer's page is drawn in tenths of a point (OcrElement boxes count "pixels" at this resolution): the
# word boxes are whole units, a tenth of a point is well below what a reader's selection can tell apart.
UNITS_PER_PT = 10
DPI = 72.0 * UNITS_PER_PT
# Form XObjects nested deeper than this are not searched for text (the decoder refuses deeper pages anyway).
MAX_FORM_DEPTH = 8
TEXT_OPERATORS = "Tj TJ ' \""
# EXIF orientations that mirror the image: img2pdf cannot show them with /Rotate.
MIRRORED = (2, 4, 5, 7)

# OCRmyPDF's font manager warns, per request, that a script without an installed font (CJK here) is drawn
# invisible only: that is what this layer is, every script of it.
logging.getLogger("ocrmypdf.font.multi_font_manager").setLevel(logging.ERROR)
# img2pdf notes each image with an alpha channel (kept as a soft mask), fontTools each table of each font it
# subsets for fpdf2 (dozens of INFO lines): not worth log lines per request.
logging.getLogger("img2pdf").setLevel(logging.ERROR)
logging.getLogger("fontTools").setLevel(logging.WARNING)


@dataclass(frozen=True)
class Source:
    """The document the answer was read from, as the client sent it (a multipart body's file inside)."""

    body: bytes
    content_type: str


_SAVE_OPTIONS: dict[str, Any] = {
    "compress_streams": True,
    "object_stream_mode": pikepdf.ObjectStreamMode.generate,
    "deterministic_id": True,
}


def _refused() -> tuple[type[Exception], ...]:
    """What makes a document one we cannot make a PDF of, for the except clauses below (Python evaluates
    them only when something was raised): fpdf, the text layer's renderer, is imported with the renderer
    (below) and here, never at the service's start, where it cost every process ~1.5 s of imports."""
    from fpdf.errors import FPDFException

    return (pikepdf.PdfError, img2pdf.ImageOpenError, FPDFException, OSError, ValueError, IndexError)


def render(response: OcrResponse, source: Source | None) -> bytes:
    if source is None:
        raise ValueError("format=pdf needs the document the answer was read from")
    data, media_type = _document(source)
    numbers = [p.page for p in response.pages]
    try:
        with _base_pdf(data, media_type, numbers) as pdf:
            _layer(pdf, list(enumerate(response.pages)))
            out = io.BytesIO()
            pdf.save(out, **_SAVE_OPTIONS)
            return out.getvalue()
    except _refused() as err:
        raise InvalidDocument(f"cannot make a PDF of this document: {err}") from None


class FileDocument:
    """format=pdf of a bulk job, in bounded memory: the document is read from a file (pikepdf reads a PDF's
    objects from it as they are needed), its pages are the job's (`numbers`, all of them, read or not), the
    layers are added a batch of pages at a time (add), and the result is written to a file (save). What
    stays in memory until save is what the layers add (the pages' words), not the pages' images.

    An image document (one image, a TIFF's frames) is converted to a PDF in memory first, as /v1/ocr's is;
    a multipart body's file is taken out of it in memory. Both are bounded by max_job_bytes."""

    def __init__(self, path: Path, content_type: str, numbers: list[int]) -> None:
        media_type = normalise_media_type(content_type)
        try:
            if media_type == MULTIPART_TYPE:
                body, media_type = extract_multipart_file(path.read_bytes(), content_type)
                path.write_bytes(body)
            with path.open("rb") as f:
                media_type = classify(f.read(1024), media_type)
            self.pdf = _base_pdf(path, media_type, numbers)
        except _refused() as err:
            raise InvalidDocument(f"cannot make a PDF of this document: {err}") from None
        self.index = {n: i for i, n in enumerate(numbers)}

    def add(self, pages: list[Page]) -> None:
        """The layers of these pages (each a page of the job, read), on their pages."""
        try:
            _layer(self.pdf, [(self.index[p.page], p) for p in pages])
        except _refused() as err:
            raise InvalidDocument(f"cannot make a PDF of this document: {err}") from None

    def save(self, path: Path) -> None:
        try:
            self.pdf.save(path, **_SAVE_OPTIONS)
        except _refused() as err:
            raise InvalidDocument(f"cannot make a PDF of this document: {err}") from None

    def close(self) -> None:
        self.pdf.close()


def _layer(pdf: pikepdf.Pdf, pages: list[tuple[int, Page]]) -> None:
    """Turn each (index into pdf.pages, answer's page) as the engine did, and lay its words over it unless
    the page already carries text."""
    layered = [(i, page) for i, page in pages if not _has_text(pdf.pages[i])]
    for i, page in pages:
        _turn(pdf.pages[i], page.rotation)
    if layered:
        text_pdf = _text_layer(pdf, layered)
        for k, (i, _) in enumerate(layered):
            base = pdf.pages[i]
            # Over the page's trim box, the page's /Rotate undone: the layer lies as the page shows.
            base.add_overlay(text_pdf.pages[k], pikepdf.Rectangle(base.trimbox))


def _document(source: Source) -> tuple[bytes, str]:
    body, media_type = source.body, normalise_media_type(source.content_type)
    if media_type == MULTIPART_TYPE:
        body, media_type = extract_multipart_file(body, source.content_type)
    return body, classify(body, media_type)


# --- the base pages ---------------------------------------------------------------------------------------


def _base_pdf(data: bytes | Path, media_type: str, numbers: list[int]) -> pikepdf.Pdf:
    """The document (its bytes, or a file) as a PDF holding exactly the answer's pages, in its order."""
    if media_type == PDF_TYPE:
        pdf = pikepdf.open(data if isinstance(data, Path) else io.BytesIO(data))
    else:
        image = data.read_bytes() if isinstance(data, Path) else data
        pdf = pikepdf.open(io.BytesIO(_image_pdf(image, media_type, numbers)))
        numbers = list(range(1, len(numbers) + 1))  # _image_pdf made only the answer's frames
    if numbers != list(range(1, len(pdf.pages) + 1)):
        keep = [pdf.pages[n - 1] for n in numbers]
        for _ in range(len(pdf.pages)):
            del pdf.pages[0]
        pdf.pages.extend(keep)
    return pdf


def _image_pdf(data: bytes, media_type: str, numbers: list[int]) -> bytes:
    """A page per selected frame (1-based `numbers`), each image embedded without loss."""
    with Image.open(io.BytesIO(data)) as im:
        frames = getattr(im, "n_frames", 1)
        orientation = im.getexif().get(0x0112, 1)
        dpi = _dpi(im.info.get("dpi"))
    options = {"rotation": img2pdf.Rotation.ifvalid, "layout_fun": img2pdf.get_fixed_dpi_layout_fun(dpi)}
    direct = media_type in ("image/jpeg", "image/png", "image/tiff") and orientation not in MIRRORED
    # img2pdf raises plain Exception for much of what it does not take (a colour space, a TIFF compression).
    if direct and frames == 1 and numbers == [1]:
        try:
            return bytes(img2pdf.convert(data, **options))
        except Exception:  # noqa: S110 -- Pillow's PNG below takes what img2pdf does not
            pass
    try:
        return bytes(img2pdf.convert([_png(data, n) for n in numbers], **options))
    except InvalidDocument:
        raise
    except Exception as err:
        raise InvalidDocument(f"cannot make a PDF of this image: {err}") from None


def _dpi(claimed: Any) -> tuple[float, float]:
    """The image's resolution where it names a plausible one, else 96 dpi: a TIFF or a JFIF header often
    says 1 (an aspect ratio, not a resolution), which would make a page of metres."""
    try:
        x, y = float(claimed[0]), float(claimed[1])
    except (TypeError, ValueError, IndexError):
        return (96.0, 96.0)
    return (x, y) if 50 <= x <= 4800 and 50 <= y <= 4800 else (96.0, 96.0)


def _png(data: bytes, number: int) -> bytes:
    """Frame `number` as PNG: orientation applied, alpha flattened on white (as the engine saw it)."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.seek(number - 1)
            frame: Image.Image = ImageOps.exif_transpose(im)
            if frame.mode in ("RGBA", "LA", "PA") or (frame.mode == "P" and "transparency" in frame.info):
                rgba = frame.convert("RGBA")
                frame = Image.new("RGB", rgba.size, "white")
                frame.paste(rgba, mask=rgba.getchannel("A"))
            elif frame.mode not in ("1", "L", "P", "RGB"):  # PNG has no CMYK, img2pdf no 16-bit
                frame = frame.convert("RGB")
            buf = io.BytesIO()
            frame.save(buf, format="PNG")  # the page's size: _image_pdf's layout (its dpi)
            return buf.getvalue()
    except (UnidentifiedImageError, EOFError) as err:
        raise InvalidDocument(f"cannot read image frame {number}: {err}") from None


# --- pages that already carry text --------------------------------------------------------------------------


def _has_text(page: pikepdf.Page) -> bool:
    """Whether the page shows text: a text-showing operator in its content or a form XObject it draws."""
    seen: set[tuple[int, int]] = set()

    def shows_text(obj: Any, resources: Any, depth: int) -> bool:
        try:
            if pikepdf.parse_content_stream(obj, TEXT_OPERATORS):
                return True
        except pikepdf.PdfError:
            return False  # content qpdf cannot parse: no text found in it (PDFium drew it for the engine)
        if depth >= MAX_FORM_DEPTH or not isinstance(resources, pikepdf.Dictionary):
            return False
        xobjects = resources.get("/XObject")
        if not isinstance(xobjects, pikepdf.Dictionary):
            return False
        for _, xobj in xobjects.items():
            if not isinstance(xobj, pikepdf.Stream) or xobj.get("/Subtype") != pikepdf.Name.Form:
                continue
            if xobj.is_indirect:
                if xobj.objgen in seen:
                    continue
                seen.add(xobj.objgen)
            if shows_text(xobj, xobj.get("/Resources", resources), depth + 1):
                return True
        return False

    return shows_text(page, page.obj.get("/Resources"), 0)


# --- rotation -----------------------------------------------------------------------------------------------


def _turn(page: pikepdf.Page, rotation: int) -> None:
    """Turn the page `rotation` degrees clockwise as shown (/Rotate), its content untouched."""
    if rotation % 360:
        current = int(page.obj.get("/Rotate", 0))
        page.obj.Rotate = (current + rotation) % 360


def upright(bbox: tuple[float, float, float, float] | None, rotation: int) -> Any:
    """A normalised box on the page as sent, on that page turned `rotation` degrees clockwise (the inverse
    of the rapidocr engine's orientation.unrotate)."""
    if bbox is None or not rotation % 360:
        return bbox
    x0, y0, x1, y1 = bbox
    if rotation == 90:  # (x, y) -> (1 - y, x)
        return (1 - y1, x0, 1 - y0, x1)
    if rotation == 180:
        return (1 - x1, 1 - y1, 1 - x0, 1 - y0)
    return (y0, 1 - x1, y1, 1 - x0)  # 270: (x, y) -> (y, 1 - x)


# --- the text layer ----------------------------------------------------------------------------------------


def _text_layer(pdf: pikepdf.Pdf, pages: list[tuple[int, Page]]) -> pikepdf.Pdf:
    """A text-only PDF, a page per (index into pdf.pages, answer's page), each the size the page is shown."""
    from ocrmypdf.font import MultiFontManager
    from ocrmypdf.fpdf_renderer import Fpdf2MultiPageRenderer

    trees = [(i, _ocr_tree(pdf.pages[i], page), DPI) for i, page in pages]
    fonts = MultiFontManager(_ocrmypdf_fonts())
    with TemporaryDirectory(prefix="ocr-pdf-") as tmp:
        path = Path(tmp) / "layer.pdf"
        Fpdf2MultiPageRenderer(trees, fonts, invisible_text=True).render(path)
        # Read into memory: the directory goes, and the base PDF copies the pages' objects from it.
        return pikepdf.open(io.BytesIO(path.read_bytes()))


def _ocrmypdf_fonts() -> Path:
    import ocrmypdf

    return Path(ocrmypdf.__file__).parent / "data"


def _ocr_tree(base: pikepdf.Page, page: Page) -> Any:
    """The page's blocks, lines and words as OCRmyPDF's elements, on the page as it is shown once turned
    upright, in tenths of a point."""
    from ocrmypdf.hocrtransform import BoundingBox, OcrClass, OcrElement

    box = base.trimbox
    w_pt, h_pt = float(box[2]) - float(box[0]), float(box[3]) - float(box[1])
    if int(base.obj.get("/Rotate", 0)) % 180:
        w_pt, h_pt = h_pt, w_pt
    width, height = max(round(w_pt * UNITS_PER_PT), 1), max(round(h_pt * UNITS_PER_PT), 1)
    # The answer's page turned upright and measured in the layer's units: geometry's words then estimate
    # each word's box on it.
    shown = page.model_copy(
        update={
            "width": width,
            "height": height,
            "lines": [
                # The words estimated from the line, not the engine's located ones: those hug their ink,
                # and where two words are closer than the renderer's space is wide, pdftotext reads them
                # as one ("gęśląjaźń").
                ln.model_copy(update={"bbox": upright(ln.bbox, page.rotation), "words": None})
                for ln in page.lines
            ],
        }
    )
    root = OcrElement(OcrClass.PAGE, bbox=BoundingBox(0, 0, width, height), dpi=DPI)
    for _, lines in block_lines(shown):
        par = OcrElement(OcrClass.PARAGRAPH)
        for line in lines:
            ws = [(w.text, w.box, w.confidence) for w in words(line, shown) if w.box is not None]
            line_box = union([b for _, b, _ in ws])
            if line_box is None:
                continue  # a line without a box has no place on the page
            ln = OcrElement(OcrClass.LINE, bbox=BoundingBox(*line_box))
            ln.children = [
                OcrElement(OcrClass.WORD, bbox=BoundingBox(*b), text=t, confidence=c) for t, b, c in ws
            ]
            par.children.append(ln)
        if par.children:
            root.children.append(par)
    return root
