"""Malformed documents are 400 `invalid_image` naming the problem, never a 500; a TIFF's frames are walked
only as far as the request needs. Every document is generated here (nothing binary is committed)."""

from __future__ import annotations

import time

import pytest

from .docs import TEXTS, encode, render
from .hostile import CATALOG, pdf, tiff, tiff_1px_frames
from .test_errors import assert_error

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
