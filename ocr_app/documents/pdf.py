"""A PDF's pages, rendered by PDFium at pdf_dpi (never beyond max_image_side), each page's size and drawing
work bounded before any page renders."""

from __future__ import annotations

import threading

import pypdfium2 as pdfium

from ..errors import InvalidDocument
from .image import Limits, PageImage, select_pages

# PDFium is not thread-safe: one document operation at a time in this process.
_PDFIUM_LOCK = threading.Lock()

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
        # PDFium never reports a side of 0 or less (a page of no area is US Letter: tests/test_documents.py):
        # mutation: NumberReplacer to `-1 < w_pt` equivalent because of that;
        # mutation: NumberReplacer to `-1 < h_pt` equivalent because of that;
        # mutation: ReplaceComparisonOperator_Lt_LtE to `0 <=` equivalent because of that.
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
    # mutation: NumberReplacer equivalent because a form popped below sets it to at least 1, and with no form
    # the count is the page's own (at most the bound here): no error names the nesting.
    deepest = 0
    while forms:
        form, level = forms.pop()  # depth first: the deepest nesting shows before the count runs out
        deepest = max(deepest, level)
        n = raw.FPDFFormObj_CountObjects(form)
        # mutation: NumberReplacer to `max(n, -1)` equivalent because PDFium answers -1 only for an object
        # that is not a form, and every object here is one.
        count += max(n, 0)
        if count > MAX_PDF_PAGE_OBJECTS:
            # mutation: ReplaceBreakWithContinue equivalent because the count is past the bound already, and
            # the forms left on the stack are no deeper than the deepest seen: more work, the same answer.
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
        # mutation: ExceptionReplacer equivalent because _check_pdf_page_sizes has looked each page up in
        # the same page tree first, where a missing one failed.
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


def pdf_pages(data: bytes, selection: list[int] | None, limits: Limits) -> list[PageImage]:
    out = []
    with _PDFIUM_LOCK:
        try:
            pdf = pdfium.PdfDocument(data)
            # PDFium's form layer draws the filled-in fields: one saved without an appearance of its own
            # (NeedAppearances, as many form fillers leave it) is otherwise blank. Before the page count
            # and the pages, as PDFium needs; nothing for a document without fields.
            pdf.init_forms()
        except pdfium.PdfiumError as err:
            raise InvalidDocument(f"cannot open PDF: {err}") from None
        try:
            numbers = select_pages(selection, len(pdf), limits)
            _check_pdf_page_sizes(pdf, numbers)
            pages = _load_pdf_pages(pdf, numbers)
            # mutation: ReplaceTrueWithFalse equivalent because _load_pdf_pages loads one page per number.
            for number, page in zip(numbers, pages, strict=True):
                try:
                    w_pt, h_pt = page.get_size()
                    # Render at pdf_dpi, but never beyond max_image_side: a poster-sized page must
                    # not allocate a poster-sized bitmap.
                    full = limits.pdf_dpi / 72.0
                    # mutation: NumberReplacer equivalent because a side is positive (PDFium), and below
                    # max_image_side / scale points the page renders at pdf_dpi whatever the floor.
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


def count_pdf_pages(data: bytes, bound: int) -> int:
    """The PDF's page count, or `bound` if it has at least that many (read from the page tree)."""
    with _PDFIUM_LOCK:
        try:
            pdf = pdfium.PdfDocument(data)
        except pdfium.PdfiumError as err:
            raise InvalidDocument(f"cannot open PDF: {err}") from None
        try:
            return min(len(pdf), bound)
        finally:
            pdf.close()
