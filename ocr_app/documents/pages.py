"""A document's pages, PDF or raster: rendered or decoded, bounded, resized (what the decode workers run), or
only counted (what a bulk job splits into page ranges)."""

from __future__ import annotations

from .image import Limits, PageImage, preview_data_url
from .pdf import count_pdf_pages, pdf_pages
from .raster import count_raster_frames, raster_pages
from .upload import PDF_TYPE


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
        pages = pdf_pages(data, selection, limits)
    else:
        pages = raster_pages(data, selection, limits)
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
        return count_pdf_pages(data, bound)
    return count_raster_frames(data, bound)
