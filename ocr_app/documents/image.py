"""A document's page as the engines take it (PageImage), the limits every page is held to, and resizing."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from io import BytesIO
from typing import TYPE_CHECKING

import cv2
import numpy as np
from PIL import Image

from ..errors import InvalidParameter, TooManyPages

# mutation: AddNot equivalent because the import also works at run time (the annotations are strings).
if TYPE_CHECKING:
    from ..config import Settings

# `preview=true`: the page the engine saw, small enough to send back inside the JSON.
PREVIEW_MAX_SIDE = 1024
# mutation: NumberReplacer equivalent because the preview's quality trades its size against its fidelity:
# what it shows, and its size in pixels, are the same.
PREVIEW_JPEG_QUALITY = 80


# mutation: ReplaceTrueWithFalse equivalent because nothing assigns to a Limits or hashes one.
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
        return self.image if self.bgr is None else from_bgr(self.bgr)


def select_pages(selection: list[int] | None, count: int, limits: Limits) -> list[int]:
    """The page numbers to read (`selection`, or every page), within the document's count and max_pages."""
    numbers = selection or list(range(1, count + 1))
    if numbers[-1] > count:
        raise InvalidParameter(f"page {numbers[-1]} is out of range: the document has {count} page(s)")
    if len(numbers) > limits.max_pages:
        raise TooManyPages(f"the document has {count} pages; at most {limits.max_pages}")
    return numbers


def preview_data_url(image: Image.Image) -> str:
    """`data:image/jpeg;base64,...` of the image the engine sees (EXIF applied, PDF rendered), longest
    side at most PREVIEW_MAX_SIDE: the picture that a page's normalised bboxes are drawn over."""
    # mutation: ReplaceComparisonOperator_Gt_GtE equivalent because a resize to an image's own size is a copy
    # (Pillow returns it before resampling).
    if max(image.size) > PREVIEW_MAX_SIDE:
        # mutation: NumberReplacer equivalent because reducing_gap trades the preview's speed against its
        # smoothness: its size and what it shows are the same.
        image = image.resize(fit(image.size, PREVIEW_MAX_SIDE), Image.Resampling.BILINEAR, reducing_gap=2.0)
    buf = BytesIO()
    # mutation: ReplaceTrueWithFalse equivalent because optimize only shrinks the JPEG's Huffman tables:
    # the same pixels.
    image.save(buf, format="JPEG", quality=PREVIEW_JPEG_QUALITY, optimize=True)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def from_bgr(bgr: np.ndarray) -> Image.Image:
    """An RGB image of OpenCV's pixels (one copy: Pillow unpacks BGR as it reads)."""
    # mutation: NumberReplacer to `"BGR", 0, 0)` equivalent because Pillow's raw decoder reads a ystep of 0
    # top down as it reads 1 (checked: the same pixels; -1 flips them).
    # mutation: NumberReplacer to `"BGR", 0, 2)` equivalent because it reads a ystep of 2 the same way too
    # (checked on random pixels).
    return Image.frombuffer("RGB", (bgr.shape[1], bgr.shape[0]), bgr, "raw", "BGR", 0, 1)


def fit(size: tuple[int, int], side: int) -> tuple[int, int]:
    """`size` scaled so that its longest side is `side`."""
    f = side / max(size)
    return max(1, round(size[0] * f)), max(1, round(size[1] * f))


def shrink(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """`image` (RGB) resized down to `size`: whole factors by a box filter (each output pixel the mean of
    k x k), the rest (under 2x, as after JPEG draft mode) by OpenCV's bilinear, which at under 2x still
    samples every source pixel and keeps text sharp: 3.4 ms for 2000x1500 -> 1540x1155 where Pillow's
    antialiased bilinear takes 24-32 (measured)."""
    k = min(image.width // size[0], image.height // size[1])
    # mutation: NumberReplacer to `k >= 3` equivalent because at exactly 2x OpenCV's bilinear is the 2 x 2
    # mean too (checked: 0 difference on noise).
    # mutation: ReplaceComparisonOperator_GtE_Gt equivalent likewise (`k > 2` is `k >= 3`).
    # mutation: NumberReplacer to `k >= 1` equivalent because reduce(1) is a copy.
    if k >= 2:
        image = image.reduce(k)
    if image.size == size:
        return image
    return Image.fromarray(cv2.resize(np.asarray(image), size, interpolation=cv2.INTER_LINEAR))


def shrink_array(bgr: np.ndarray, side: int) -> np.ndarray:
    """OpenCV's pixels with the longest side at most `side`, filtered as shrink() filters an image."""
    h, w = bgr.shape[:2]
    # mutation: ReplaceComparisonOperator_LtE_Lt equivalent because a resize to the array's own size is a
    # copy (checked: the same pixels).
    if max(w, h) <= side:
        return bgr
    size = fit((w, h), side)
    # mutation: ReplaceBinaryOperator_FloorDiv_Mul equivalent because fit() keeps the aspect: the two factors
    # differ only by the rounding of a side a few pixels long, where it picks the filter of a few rows.
    k = min(w // size[0], h // size[1])
    # INTER_AREA at a whole factor is the box filter (Pillow's reduce); OpenCV takes the rest of it too.
    # mutation: NumberReplacer to `k >= 3` equivalent because at exactly 2x bilinear is the 2 x 2 mean too.
    # mutation: ReplaceComparisonOperator_GtE_Gt equivalent likewise (`k > 2` is `k >= 3`).
    return cv2.resize(bgr, size, interpolation=cv2.INTER_AREA if k >= 2 else cv2.INTER_LINEAR)
