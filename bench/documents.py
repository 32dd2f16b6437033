"""The documents the bench sends: the throughput set, rendered at start with the contract tests' renderer
(tests/docs.py): four one-paragraph pages, a US-letter page and a 12 MP camera-like photo of a page."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFilter

from tests.docs import TEXTS, encode, pdf, render


@dataclass
class Doc:
    name: str
    data: bytes
    ctype: str
    size: tuple[int, int]

    @property
    def filename(self) -> str:
        return f"{self.name}.{self.ctype.split('/')[1]}"

    def describe(self) -> str:
        fmt = self.ctype.split("/")[1].upper()
        return f"{self.name} {self.size[0]}x{self.size[1]} {fmt} {len(self.data) / 1024:.0f} KiB"


def _doc(name: str, image: Image.Image, fmt: str, **params) -> Doc:
    ctype = {"PNG": "image/png", "JPEG": "image/jpeg"}[fmt]
    return Doc(name, encode(image, fmt, **params), ctype, image.size)


def letter_page() -> Image.Image:
    """A 1700x2200 page (US letter at 200 dpi) with 25 lines of mixed English and Latin text."""
    pool = TEXTS["en"] + TEXTS["latin"]
    lines = [pool[i % len(pool)] for i in range(25)]
    body = render(lines, "en", size=36, width=1700, margin=90).image
    page = Image.new("RGB", (1700, 2200), "white")
    page.paste(body, (0, 0))
    return page


def photo_of_page() -> Image.Image:
    """A 4000x3000 (12 MP) camera-like shot of a page: a desk, uneven light, blur and sensor noise."""
    pool = TEXTS["en"] + TEXTS["latin"]
    lines = [pool[i % len(pool)] for i in range(15)]
    paper = render(lines, "en", size=80, width=3300, margin=120).image
    canvas = Image.new("RGB", (4000, 3000), (92, 78, 64))
    canvas.paste(paper, (350, (3000 - paper.height) // 2))
    canvas = canvas.filter(ImageFilter.GaussianBlur(1.2))
    px = np.asarray(canvas, dtype=np.float32)
    yy, xx = np.mgrid[0:3000, 0:4000].astype(np.float32)
    light = 0.78 + 0.22 * (1 - ((xx - 2600) ** 2 + (yy - 1200) ** 2) / (4000**2 + 3000**2))
    px *= light[..., None]
    px += np.random.default_rng(7).normal(0, 5, px.shape).astype(np.float32)
    return Image.fromarray(np.clip(px, 0, 255).astype(np.uint8))


def make_documents() -> tuple[list[Doc], Doc, bytes]:
    """(the throughput set, the letter page as a PDF, the 12 MP photo JPEG bytes)."""
    docs = []
    photo = photo_of_page()
    docs.append(_doc("photo-12mp", photo, "JPEG", quality=90))
    letter = letter_page()
    docs.append(_doc("letter", letter, "PNG"))
    for lang, fmt in (("en", "PNG"), ("latin", "JPEG"), ("zh", "PNG"), ("ja", "JPEG")):
        params = {"quality": 90} if fmt == "JPEG" else {}
        docs.append(_doc(lang, render(TEXTS[lang], lang).image, fmt, **params))
    letter_pdf = Doc("letter-pdf", pdf([letter], dpi=200), "application/pdf", letter.size)
    return docs, letter_pdf, docs[0].data
