"""Test documents, rendered at test time from Debian's fonts (installed by `make test`)."""

from __future__ import annotations

import io
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

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


ARTICLE3 = {
    "title": "Three towns plan a shared cycle path",
    "columns": [
        [
            "The three towns on the",
            "estuary agreed to build",
            "a cycle path along the",
            "old railway line, with",
            "work to start in spring.",
        ],
        [
            "Each town pays a third",
            "of the cost, and the",
            "county adds a grant for",
            "the two new bridges over",
            "the river and the canal.",
        ],
        [
            "Shops along the route",
            "hope for more visitors,",
            "while farmers asked for",
            "gates at every field so",
            "that sheep stay inside.",
        ],
    ],
}

LETTER = {
    "header": "Northwind Traders annual report",
    "paragraphs": [
        ["Sales rose in every region this year,", "led by the new harbour branch that", "opened in spring."],
        ["Costs fell as the fleet moved to", "electric vans and the warehouse", "roof got solar panels."],
    ],
    "footer": "Page 7 of 12",
}

TABLE = [
    ["Item", "Quantity", "Price"],
    ["Blue paint", "4 tins", "36.00"],
    ["Brushes", "12", "18.50"],
    ["Ladder", "1", "89.90"],
    ["Dust sheets", "6", "24.00"],
    ["Masking tape", "10 rolls", "15.20"],
]


def render_letter(letter: dict = LETTER, size: int = 32, width: int = 1200, height: int = 1500) -> Rendered:
    """A page with a small running head at the top, paragraphs apart by an empty line, and a page number
    at the foot: `lines` in reading order (head, body, foot)."""
    font, small = font_for("en", size), font_for("en", size * 3 // 4)
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    lines, boxes = [], []

    def put(x: int, y: int, text: str, f) -> None:
        draw.text((x, y), text, fill="black", font=f)
        lines.append(text)
        boxes.append(draw.textbbox((x, y), text, font=f))

    put(80, 40, letter["header"], small)
    y = 260
    for para in letter["paragraphs"]:
        for text in para:
            put(80, y, text, font)
            y += size * 3 // 2
        y += size * 3 // 2  # an empty line between paragraphs
    put(width // 2 - 100, height - 90, letter["footer"], small)
    return Rendered(image, lines, boxes)


def render_table(rows: list[list[str]] = TABLE, size: int = 30, width: int = 1200) -> Rendered:
    """A ruled-less table: left-aligned first column, the others at fixed tab stops; read row by row."""
    font = font_for("en", size)
    stops = [80, 560, 900]
    pitch = size * 2
    image = Image.new("RGB", (width, 120 + len(rows) * pitch), "white")
    draw = ImageDraw.Draw(image)
    lines, boxes = [], []
    for r, row in enumerate(rows):
        for x, cell in zip(stops, row, strict=True):
            draw.text((x, 60 + r * pitch), cell, fill="black", font=font)
            lines.append(cell)
            boxes.append(draw.textbbox((x, 60 + r * pitch), cell, font=font))
    return Rendered(image, lines, boxes)


def photo_like(image: Image.Image, seed: int = 0) -> Image.Image:
    """The page as a phone photo of it might come: grey paper, uneven light, a slight blur and sensor noise,
    saved as a lossy JPEG."""
    rng = np.random.default_rng(seed)
    a = np.asarray(image.convert("L"), dtype=np.float32)
    h, w = a.shape
    light = np.linspace(0.82, 1.0, w)[None, :] * np.linspace(0.9, 1.0, h)[:, None]
    a = (a * 0.85 + 20) * light + rng.normal(0, 8, a.shape)
    out = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).filter(ImageFilter.GaussianBlur(0.8))
    return Image.open(io.BytesIO(encode(out.convert("RGB"), "JPEG", quality=60))).convert("RGB")


def layout_pages() -> dict[str, Rendered]:
    """The layout test pages, each with its text in reading order: two and three columns under a title, a
    page with a running head and a page number, a table."""
    return {
        "two-column": render_columns(ARTICLE["title"], ARTICLE["columns"]),
        "three-column": render_columns(ARTICLE3["title"], ARTICLE3["columns"], width=1500),
        "head-and-foot": render_letter(),
        "table": render_table(),
    }


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
        # The mirrored ones (EXIF 2.32, Orientation): each its own inverse.
        2: image.transpose(Image.Transpose.FLIP_LEFT_RIGHT),
        4: image.transpose(Image.Transpose.FLIP_TOP_BOTTOM),
        5: image.transpose(Image.Transpose.TRANSPOSE),
        7: image.transpose(Image.Transpose.TRANSVERSE),
    }[orientation]
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(stored, "JPEG", quality=quality, exif=exif.tobytes())
