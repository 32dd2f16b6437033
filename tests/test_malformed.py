"""Malformed documents are 400 `invalid_image` naming the problem, never a 500; a TIFF's frames are walked
only as far as the request needs. Every document is generated here (nothing binary is committed)."""

from __future__ import annotations

import io
import struct
import time

import pytest
from PIL import Image

from .docs import TEXTS, encode, render
from .test_errors import assert_error


def tiff(frames: int, side: int = 8) -> bytes:
    buf = io.BytesIO()
    ims = [Image.new("L", (side, side), 255) for _ in range(frames)]
    ims[0].save(buf, "TIFF", save_all=True, append_images=ims[1:])
    return buf.getvalue()


def tiff_1px_frames(frames: int) -> bytes:
    """A little-endian TIFF of `frames` 1x1 grey frames sharing one pixel, written directly (Pillow's writer
    takes minutes for 20 000 frames)."""
    pixel, first = 8, 10
    ifd_size = 2 + 8 * 12 + 4
    out = bytearray(b"II*\x00" + struct.pack("<I", first) + b"\xff\x00")
    for i in range(frames):
        tags = [(256, 3, 1), (257, 3, 1), (258, 3, 8), (259, 3, 1), (262, 3, 1), (273, 4, pixel),
                (278, 3, 1), (279, 4, 1)]  # fmt: skip
        nxt = first + (i + 1) * ifd_size if i + 1 < frames else 0
        out += struct.pack("<H", len(tags))
        out += b"".join(struct.pack("<HHII", tag, typ, 1, val) for tag, typ, val in tags)
        out += struct.pack("<I", nxt)
    return bytes(out)


def pdf(*objects: bytes) -> bytes:
    """A PDF whose objects are numbered from 1 (1 is the catalog), with a correct xref table."""
    out, offsets = b"%PDF-1.4\n", []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (i, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    return out + b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)


CATALOG = b"<< /Type /Catalog /Pages 2 0 R >>"
MALFORMED = {
    # The page tree claims 5 pages and holds none: PDFium opens it, then fails on the page.
    "pdf_count_lies": (pdf(CATALOG, b"<< /Type /Pages /Kids [] /Count 5 >>"), "PDF page 1"),
    "pdf_no_pages": (pdf(CATALOG, b"<< /Type /Pages /Kids [] /Count 0 >>"), "cannot open PDF"),
    "pdf_garbage": (b"%PDF-1.7\n" + b"\x00garbage" * 100, "cannot open PDF"),
    "tiff_truncated": (tiff(3)[:200], "cannot decode image"),
    "png_truncated": (encode(render(TEXTS["en"][:1]).image, "PNG")[:300], "image"),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_document_is_400_naming_the_problem(server, name):
    body, what = MALFORMED[name]
    declared = {"pdf": "application/pdf", "tiff": "image/tiff", "png": "image/png"}[name.split("_")[0]]
    r = server.ocr(body, declared)
    err = assert_error(r, 400, "invalid_image")
    assert what in err["message"], err


def test_many_frame_tiff_is_refused_without_walking_every_frame(server):
    # 20 000 frames: counting them all took seconds of CPU; the request needs at most max_pages + 1.
    body = tiff_1px_frames(20000)
    t0 = time.monotonic()
    r = server.ocr(body, "image/tiff")
    refused_in = time.monotonic() - t0
    err = assert_error(r, 413, "too_many_pages")
    assert "more than" in err["message"]
    # A selection inside the document is served: only the frames up to it are read.
    ok = server.ocr(body, "image/tiff", params={"pages": "2"})
    assert ok.status_code == 200, ok.text
    assert [p["page"] for p in ok.json()["pages"]] == [2]
    print(f"20000-frame TIFF refused in {refused_in * 1000:.0f} ms")
