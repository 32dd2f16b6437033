"""Every result format on the vllm engine (#42), read back by readers no one here wrote: lxml for hOCR
and ALTO, poppler's pdftotext and qpdf for the searchable PDF. The tiny checkpoint reads a page drawn by
tiny_model.page(v) as VARIANTS[v].markdown and grounds each line on the page, so every format's text and
boxes can be checked against what was drawn: a two-page PDF, pages swapped (variants 2 then 0)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from lxml import etree

from ..docs import pdf
from .tiny_model import VARIANTS, page

pytestmark = pytest.mark.timeout(1200)  # the session's server may be started by this module

ORDER = (2, 0)
XHTML = "{http://www.w3.org/1999/xhtml}"
ALTO = "{http://www.loc.gov/standards/alto/ns-v4#}"


def lines_of(variant: int) -> list[str]:
    return [line for line in VARIANTS[variant].markdown.split("\n") if line]


@pytest.fixture(scope="module")
def document() -> bytes:
    return pdf([page(v).image for v in ORDER])


@pytest.fixture(scope="module")
def answers(server, document) -> dict:
    """The same document in every format, JSON first."""
    out = {}
    for fmt in ("json", "text", "markdown", "hocr", "alto", "pdf"):
        r = server.ocr(document, "application/pdf", params={"format": fmt})
        assert r.status_code == 200, (fmt, r.text[:500])
        out[fmt] = r
    return out


def test_json_text_and_markdown_are_the_models_answer(answers):
    pages = answers["json"].json()["pages"]
    assert [p["text"] for p in pages] == [VARIANTS[v].markdown for v in ORDER]
    # text: each page's text (on this engine the model's answer), pages apart by a form feed; markdown: the
    # model's own, as it is, pages apart by a thematic break.
    assert answers["text"].text.split("\f") == [VARIANTS[v].markdown for v in ORDER]
    assert answers["markdown"].text.rstrip("\n").split("\n\n---\n\n") == [VARIANTS[v].markdown for v in ORDER]


def test_hocr_and_alto_hold_each_line_with_its_box_on_its_page(answers):
    pages = answers["json"].json()["pages"]
    html = etree.fromstring(answers["hocr"].content)
    hocr_pages = [d for d in html.iter(f"{XHTML}div") if d.get("class") == "ocr_page"]
    alto = etree.fromstring(answers["alto"].content)
    alto_pages = list(alto.iter(f"{ALTO}Page"))
    assert len(hocr_pages) == len(alto_pages) == len(ORDER)
    for v, p, hp, ap in zip(ORDER, pages, hocr_pages, alto_pages, strict=True):
        w, h = p["width"], p["height"]
        assert hp.get("title") == f"bbox 0 0 {w} {h}; ppageno {p['page'] - 1}"
        hocr_lines = [s for s in hp.iter(f"{XHTML}span") if s.get("class") == "ocr_line"]
        got = [" ".join(x.text or "" for x in line if x.get("class") == "ocrx_word") for line in hocr_lines]
        assert got == [line["text"] for line in p["lines"]] == lines_of(v)
        for line, json_line in zip(hocr_lines, p["lines"], strict=True):
            x0, y0, x1, y1 = map(int, line.get("title").split(";")[0].split()[1:])
            # the JSON's box (0-1) in the page's pixels, give or take rounding
            want = [
                json_line["bbox"][0] * w,
                json_line["bbox"][1] * h,
                json_line["bbox"][2] * w,
                json_line["bbox"][3] * h,
            ]
            assert all(abs(a - b) <= 1 for a, b in zip((x0, y0, x1, y1), want, strict=True)), (
                line.get("title"),
                want,
            )
            assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h
        assert (int(ap.get("WIDTH")), int(ap.get("HEIGHT"))) == (w, h)
        text_lines = list(ap.iter(f"{ALTO}TextLine"))
        got = [" ".join(s.get("CONTENT") for s in tl.iter(f"{ALTO}String")) for tl in text_lines]
        assert got == lines_of(v)
        for tl, json_line in zip(text_lines, p["lines"], strict=True):
            x, y, tw, th = (int(tl.get(k)) for k in ("HPOS", "VPOS", "WIDTH", "HEIGHT"))
            want = [b * (w, h)[i % 2] for i, b in enumerate(json_line["bbox"])]
            assert all(abs(a - b) <= 1 for a, b in zip((x, y, x + tw, y + th), want, strict=True)), (
                tl.attrib,
                want,
            )
        for s in ap.iter(f"{ALTO}String"):
            x, y, sw, sh = (int(s.get(k)) for k in ("HPOS", "VPOS", "WIDTH", "HEIGHT"))
            assert x >= 0 and x + sw <= w and y >= 0 and y + sh <= h, s.attrib
            assert 0.0 <= float(s.get("WC")) <= 1.0


@pytest.mark.skipif(not shutil.which("pdftotext") or not shutil.which("qpdf"), reason="poppler-utils, qpdf")
def test_the_searchable_pdf_gives_the_pages_text(answers, document, tmp_path):
    out = tmp_path / "out.pdf"
    out.write_bytes(answers["pdf"].content)
    assert answers["pdf"].headers["content-type"] == "application/pdf"
    check = subprocess.run(["qpdf", "--check", str(out)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    for n, v in enumerate(ORDER, 1):
        text = subprocess.run(
            ["pdftotext", "-f", str(n), "-l", str(n), str(out), "-"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert text.split() == " ".join(lines_of(v)).split(), (n, text)
    pages = subprocess.run(["qpdf", "--show-npages", str(out)], capture_output=True, text=True, check=True)
    assert int(pages.stdout) == len(ORDER)
    assert len(answers["pdf"].content) <= 1.1 * len(document) + 64 * 1024
