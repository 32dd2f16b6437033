"""Test documents, rendered at test time from Debian's fonts (installed by `make test`)."""

from __future__ import annotations

import io
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

LATIN_FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
CJK_FONT = Path("/usr/share/fonts/truetype/wqy/wqy-microhei.ttc")

TEXTS = {
    "en": [
        "Invoice 2024-0193 issued by Northwind Traders",
        "Ship to: 42 Harbour Road, Portsmouth",
        "Subtotal 1,250.00 GBP and VAT 250.00 GBP",
        "Payment due within thirty days of receipt",
    ],
    "latin": [
        "Café crème brûlée à la française",
        "Straße über Größe und Äpfel in München",
        "El niño comió piñas en Añorbe",
        "Łódź, Kraków i Gdańsk są w Polsce",
    ],
    "zh": [
        "北京是中华人民共和国的首都",
        "今天天气很好我们去公园散步",
        "请在三十天内支付全部款项",
        "这份文件包含重要的合同条款",
    ],
    "ja": [
        "東京は日本の首都です",
        "今日はとても良い天気ですね",
        "この書類には重要な情報があります",
        "お支払いは三十日以内にお願いします",
    ],
}


@dataclass
class Rendered:
    image: Image.Image
    lines: list[str]
    boxes: list[tuple[int, int, int, int]]  # pixel boxes of each drawn line

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def font_for(lang: str, size: int = 40) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(CJK_FONT if lang in ("zh", "ja") else LATIN_FONT), size)


def render(
    lines: list[str], lang: str = "en", size: int = 40, width: int = 1400, margin: int = 60
) -> Rendered:
    font = font_for(lang, size)
    gap = int(size * 1.1)
    height = margin * 2 + len(lines) * (size + gap)
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    boxes = []
    y = margin
    for line in lines:
        draw.text((margin, y), line, fill="black", font=font)
        boxes.append(draw.textbbox((margin, y), line, font=font))
        y += size + gap
    return Rendered(image, lines, boxes)


ARTICLE = {
    "title": "Harbour council approves the new ferry timetable",
    "columns": [
        [
            "The harbour council voted on Tuesday",
            "to approve a new ferry timetable that",
            "adds two early crossings on weekdays",
            "and a late return on Friday nights.",
            "Commuters had asked for the change",
            "since the old service was cut back",
            "three years ago to save on fuel.",
            "The first boats will sail in May.",
        ],
        [
            "Local traders welcomed the decision",
            "but warned that parking near the pier",
            "is already scarce in the summer months",
            "and asked the council to open the old",
            "market car park before the new boats",
            "begin. The council said it would look",
            "at the request at its next meeting in",
            "April, together with the bus links.",
        ],
    ],
}


def render_columns(
    title: str,
    columns: list[list[str]],
    size: int = 30,
    width: int = 1400,
    margin: int = 60,
    gutter: int = 60,
) -> Rendered:
    """A page with a full-width title above text columns whose lines share baselines (the case a row
    sort interleaves): `lines` and `boxes` in reading order, the title then each column top to bottom."""
    font, title_font = font_for("en", size), font_for("en", size * 3 // 2)
    pitch = size * 3 // 2
    top = margin + size * 3
    height = top + max(len(c) for c in columns) * pitch + margin
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    lines, boxes = [title], [draw.textbbox((margin, margin), title, font=title_font)]
    draw.text((margin, margin), title, fill="black", font=title_font)
    column_width = (width - 2 * margin - gutter * (len(columns) - 1)) // len(columns)
    for c, column in enumerate(columns):
        x = margin + c * (column_width + gutter)
        for k, line in enumerate(column):
            draw.text((x, top + k * pitch), line, fill="black", font=font)
            box = draw.textbbox((x, top + k * pitch), line, font=font)
            assert box[2] <= x + column_width, f"{line!r} is wider than its column"
            lines.append(line)
            boxes.append(box)
    return Rendered(image, lines, boxes)


def encode(image: Image.Image, fmt: str, **params) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **params)
    return buf.getvalue()


def pdf(pages: list[Image.Image], dpi: int = 150) -> bytes:
    # Copies: Pillow leaves a saver's encoder settings on the images (PDF's JPEG ones break a TIFF).
    pages = [p.copy() for p in pages]
    buf = io.BytesIO()
    pages[0].save(buf, format="PDF", save_all=True, append_images=pages[1:], resolution=dpi)
    return buf.getvalue()


def multipage_tiff(pages: list[Image.Image]) -> bytes:
    pages = [p.copy() for p in pages]  # as in pdf()
    buf = io.BytesIO()
    pages[0].save(buf, format="TIFF", save_all=True, append_images=pages[1:], compression="tiff_deflate")
    return buf.getvalue()


def png_bomb(width: int = 40_000, height: int = 40_000) -> bytes:
    """A valid 1-bit PNG whose pixels would need ~1.6 GB decoded, in ~200 KB."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\x00" * (1 + (width + 7) // 8)
    comp = zlib.compressobj(9)
    idat = b"".join(comp.compress(row) for _ in range(height)) + comp.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def jpeg_with_orientation(image: Image.Image, orientation: int, quality: int = 90) -> bytes:
    """Store `image` rotated so that a viewer applying EXIF `orientation` shows it upright."""
    stored = {
        6: image.transpose(Image.Transpose.ROTATE_90),  # viewer rotates 90 CW to show upright
        8: image.transpose(Image.Transpose.ROTATE_270),
        3: image.transpose(Image.Transpose.ROTATE_180),
    }[orientation]
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(stored, "JPEG", quality=quality, exif=exif.tobytes())
