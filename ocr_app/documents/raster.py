"""A raster document's pages (PNG, JPEG, WebP, TIFF frames, BMP): pixel limits read from each frame's
header before any decode, EXIF orientation, a large JPEG decoded at a reduced scale straight from its DCT."""

from __future__ import annotations

from io import BytesIO

import cv2
import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from ..errors import ImageTooLarge, InvalidDocument, TooManyPages
from .image import Limits, PageImage, fit, select_pages, shrink, shrink_array
from .upload import RASTER_TYPES

# Our max_pixels check runs on every frame's header before any decode; Pillow's own global bomb
# limit would refuse with a less precise message and ignore a max_pixels set above it.
Image.MAX_IMAGE_PIXELS = None

_EXIF_ORIENTATION = 0x0112


def raster_pages(data: bytes, selection: list[int] | None, limits: Limits) -> list[PageImage]:
    try:
        im = Image.open(BytesIO(data), formats=list(RASTER_TYPES.values()))
        # Only TIFF is a multi-page document format; an animated WebP/PNG counts as its first frame.
        # Frames are walked only as far as the request needs: a 20 000-frame TIFF costs 51 IFD reads.
        count = count_frames(im, selection[-1] if selection else limits.max_pages + 1)
    except Image.DecompressionBombError as err:
        raise ImageTooLarge(str(err)) from None
    # Pillow raises TypeError/KeyError/IndexError too for corrupt TIFF directories.
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, TypeError, KeyError, IndexError) as err:
        raise InvalidDocument(f"cannot decode image: {err}") from None
    if selection is None and count > limits.max_pages:
        raise TooManyPages(f"the document has more than {limits.max_pages} pages")
    out = []
    for number in select_pages(selection, count, limits):
        try:
            im.seek(number - 1)
        # mutation: ExceptionReplacer equivalent because count_frames has sought each selected frame
        # before, where a frame that raises did so first (its errors answered by the except above).
        except (EOFError, OSError, SyntaxError, ValueError, TypeError, KeyError, IndexError) as err:
            raise InvalidDocument(f"cannot read image page {number}: {err}") from None
        page = _prepare_frame(im, data, number, limits)
        # mutation: ReplaceComparisonOperator_Gt_GtE equivalent because a lone frame, copied, has the same
        # pixels.
        # mutation: NumberReplacer to `count > 0` equivalent likewise.
        if page.image is im and count > 1:  # the frame itself: the next seek would turn it into another
            page.image = im.copy()
        out.append(page)
    return out


def count_raster_frames(data: bytes, bound: int) -> int:
    """The document's frame count (TIFF only has more than one), or `bound` if it has at least that many."""
    try:
        im = Image.open(BytesIO(data), formats=list(RASTER_TYPES.values()))
        return count_frames(im, bound)
    except Image.DecompressionBombError as err:
        raise ImageTooLarge(str(err)) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, TypeError, KeyError, IndexError) as err:
        raise InvalidDocument(f"cannot decode image: {err}") from None


def count_frames(im: Image.Image, bound: int) -> int:
    """The document's frame count, or `bound` if it has at least that many (TIFF only has more than one)."""
    if im.format != "TIFF":
        return 1
    # mutation: NumberReplacer to `count = 0` equivalent because it seeks the open frame first: the same
    # count.
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
        # mutation: ReplaceAndWithOr equivalent because Pillow's draft does nothing to other formats, and a
        # JPEG within the side keeps scale 1 (the pixels are the whole decode's either way).
        # mutation: ReplaceComparisonOperator_Gt_GtE equivalent because a JPEG of exactly the side keeps
        # scale 1 too.
        if im.format == "JPEG" and longest > limits.max_image_side:
            # Decode at 1/2, 1/4 or 1/8 scale straight from the DCT: a 12 MP photo costs a 3 MP decode.
            im.draft("RGB", fit(im.size, limits.max_image_side))
        bgr = _decode_jpeg_bgr(im, data, orientation)
        if bgr is None:
            im.load()
            # mutation: NumberReplacer to `!= 0` equivalent because exif_transpose of orientation 1 (or of
            # none) is a copy of the same pixels.
            if orientation != 1:
                im = ImageOps.exif_transpose(im)
            rgb = _to_rgb(im)
    except Image.DecompressionBombError as err:
        raise ImageTooLarge(str(err)) from None
    except (OSError, SyntaxError, ValueError, EOFError, TypeError, KeyError, IndexError) as err:
        raise InvalidDocument(f"cannot decode image page {number}: {err}") from None
    width, height = (raw_h, raw_w) if orientation in (5, 6, 7, 8) else (raw_w, raw_h)
    if bgr is not None:
        bgr = shrink_array(bgr, limits.max_image_side)
        return PageImage(number, None, width, height, bgr=bgr)  # type: ignore[arg-type]
    # mutation: ReplaceComparisonOperator_Gt_GtE equivalent because shrink() to an image's own size returns
    # it as it is.
    if max(rgb.size) > limits.max_image_side:
        rgb = shrink(rgb, fit(rgb.size, limits.max_image_side))
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


def _to_rgb(im: Image.Image) -> Image.Image:
    # mutation: ReplaceAndWithOr equivalent because a P, RGB, L or 1 image without transparency put on
    # white paper is itself (checked on random pixels), by the longer way.
    if im.mode in ("RGBA", "LA", "PA") or (im.mode in ("P", "RGB", "L", "1") and "transparency" in im.info):
        # Transparent pixels are often black: put the page on white paper, as a viewer would. A palette
        # marks them by index, an RGB or grey PNG by a colour key (its tRNS chunk): Pillow's RGBA honours
        # both.
        rgba = im.convert("RGBA")
        page = Image.new("RGB", rgba.size, "white")
        page.paste(rgba, mask=rgba.getchannel("A"))
        return page
    if im.mode in ("I;16", "I;16B", "I;16L", "I"):
        im = im.convert("I").point(lambda v: v * (1 / 256)).convert("L")
    elif im.mode == "F":
        im = im.convert("L")
    return im if im.mode == "RGB" else im.convert("RGB")
