"""Every result format on the vllm engine (#42), read back by readers no one here wrote: lxml for hOCR
and ALTO, poppler's pdftotext and qpdf for the searchable PDF. The tiny checkpoint reads a page drawn by
tiny_model.page(v) as VARIANTS[v].markdown and grounds each line on the page, so every format's text and
boxes can be checked against what was drawn: a two-page PDF, pages swapped (variants 2 then 0). And a
table: tiny_model.table_page() reads as TABLE_MARKDOWN, an HTML table with spans, which the JSON gives as
rows and cells (#41), checked against its grid written by hand and the markup read by lxml.html."""

from __future__ import annotations

import shutil
import subprocess

import lxml.html
import pytest
from lxml import etree

from ..docs import encode, pdf
from .tiny_model import TABLE_CELLS, TABLE_COLUMNS, TABLE_MARKDOWN, TABLE_ROWS, VARIANTS, page, table_page

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


def html_cells(markup: str) -> list[tuple[str, int, int]]:
    """(text, rowspan, colspan) of each cell of the one table in `markup`, as lxml.html reads it."""
    [table] = lxml.html.fromstring(markup).xpath("//table")
    return [
        (" ".join(c.text_content().split()), int(c.get("rowspan", 1)), int(c.get("colspan", 1)))
        for c in table.iter("td", "th")
    ]


def inside(box, frame, slack: float = 0.0) -> bool:
    return (
        frame[0] - slack <= box[0] < box[2] <= frame[2] + slack
        and frame[1] - slack <= box[1] < box[3] <= frame[3] + slack
    )


@pytest.fixture(scope="module")
def table() -> tuple:
    drawn = table_page()
    return drawn, encode(drawn.image, "PNG")


def test_an_html_table_with_spans_comes_back_as_rows_and_cells(server, table):
    drawn, png = table
    # The grid written by hand is the markup's: lxml.html reads the same cells, texts and spans.
    assert html_cells(TABLE_MARKDOWN) == [(c.text, c.row_span, c.column_span) for c in TABLE_CELLS]
    r = server.ocr(png, "image/png", params={"max_tokens": 256})  # the answer is ~120 tokens
    assert r.status_code == 200, r.text
    [p] = r.json()["pages"]
    assert p["text"] == TABLE_MARKDOWN and p["warnings"] == []
    written = [line for line in TABLE_MARKDOWN.split("\n") if line]
    assert [line["text"] for line in p["lines"]] == written
    title, block = p["blocks"]
    assert (title["type"], title["lines"]) == ("title", [0])
    assert (block["type"], block["lines"]) == ("table", list(range(1, len(written))))
    assert (block["rows"], block["columns"]) == (TABLE_ROWS, TABLE_COLUMNS)
    w, h = drawn.image.size
    got = block["cells"]
    assert [(c["row"], c["column"], c["row_span"], c["column_span"], c["text"]) for c in got] == [
        (c.row, c.column, c.row_span, c.column_span, c.text) for c in TABLE_CELLS
    ]
    for cell, want, text_box, frame in zip(got, TABLE_CELLS, drawn.cell_boxes, drawn.cell_rules, strict=True):
        # its line: the one line of the markup that holds it
        assert cell["lines"] == [k for k, line in enumerate(written) if f">{want.text}</" in line], cell
        # its box: the detector's box of its text (which pads short words), within its ruled frame on the page
        assert cell["bbox"] is not None, cell
        box = (cell["bbox"][0] * w, cell["bbox"][1] * h, cell["bbox"][2] * w, cell["bbox"][3] * h)
        assert inside(box, frame, slack=2) and inside(box, (0, 0, w, h)), (cell, frame)
        assert inside(text_box, box, slack=2), (cell, text_box)
        assert inside(cell["bbox"], block["bbox"]), (cell, block["bbox"])
    title_box = [b * (w, h)[i % 2] for i, b in enumerate(p["lines"][0]["bbox"])]
    assert inside(drawn.title_box, title_box, slack=2) and title_box[3] < drawn.cell_rules[0][1], title_box


def test_an_html_tables_text_and_markdown_are_the_models_markup(server, table):
    # On this engine text and markdown are the model's answer as written: the table stays HTML, spans and all
    # (hOCR and ALTO hold the page's lines, markup as written, and no cells).
    _, png = table
    for fmt in ("text", "markdown"):
        r = server.ocr(png, "image/png", params={"format": fmt, "max_tokens": 256})
        assert r.status_code == 200, (fmt, r.text[:500])
        assert r.text.rstrip("\n") == TABLE_MARKDOWN, fmt
        assert html_cells(r.text) == [(c.text, c.row_span, c.column_span) for c in TABLE_CELLS], fmt
