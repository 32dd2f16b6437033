"""Result formats (format= and Accept on POST /v1/ocr): each read back by a reader no one here wrote
(hocr-spec's validator for hOCR, alto-tools for ALTO's text and confidences, lxml for both), against the
JSON of the same document; Accept negotiation; the errors; and the formatters on hand-built responses."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hocr_spec import HocrValidator
from lxml import etree
from PIL import Image, ImageDraw

from ocr_app.documents.upload import PDF_TYPE, RASTER_TYPES, SUPPORTED_TYPES
from ocr_app.ocr import formats
from ocr_app.ocr.formats import geometry, markdown
from ocr_app.ocr.formats.negotiate import from_accept, parse_accept
from ocr_app.schemas import Block, Cell, Line, OcrResponse, Page, Timings

from .docs import TABLE, encode, font_for, pdf, render, render_table
from .test_ocr_contract import iou, normalise

ALTO_TOOLS = shutil.which("alto-tools", path=str(Path(sys.executable).parent)) or "alto-tools"
ALTO_NS = {"a": "http://www.loc.gov/standards/alto/ns-v4#"}
SPECIAL = "Fish & Chips <b> \"Q\" 'x'"
FORMAT_NAMES = "json, text, markdown, hocr, alto, pdf"


# --- through the running app -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def document() -> bytes:
    """Two pages: a table, then special characters and Chinese."""
    second = render([SPECIAL, "北京是中华人民共和国的首都"], "zh")
    # At the service's pdf_dpi (200): the pages render at the size they were drawn, no larger.
    return pdf([render_table(TABLE[:4]).image, second.image], dpi=200)


@pytest.fixture(scope="module")
def answers(server, document) -> dict:
    """The same document in every format, and its JSON."""
    names = ("json", "text", "markdown", "hocr", "alto")
    with ThreadPoolExecutor(2) as pool:  # the server reads two at a time
        out = dict(
            zip(
                names,
                pool.map(lambda n: server.ocr(document, "application/pdf", params={"format": n}), names),
                strict=True,
            )
        )
    for r in out.values():
        assert r.status_code == 200, r.text
    return out


@pytest.fixture(scope="module")
def tiny() -> bytes:
    return encode(render(["Harbour Road"], size=32, width=400).image, "PNG")


def test_json_is_the_default_and_unchanged(server, tiny):
    rid = {"X-Request-ID": "formats-json"}
    plain = server.ocr(tiny, "image/png", headers=rid)
    asked = server.ocr(tiny, "image/png", headers=rid, params={"format": "json"})
    for r in (plain, asked):
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/json"
        assert "accept" in r.headers["vary"].lower()
    a, b = plain.json(), asked.json()
    assert set(a) == {"request_id", "engine", "model", "pages", "timings_ms"}
    a.pop("timings_ms"), b.pop("timings_ms")
    assert a == b


def test_text_is_the_jsons_text_pages_apart_by_form_feeds(answers):
    body = answers["json"].json()
    r = answers["text"]
    assert r.headers["content-type"] == "text/plain; charset=utf-8"
    assert len(body["pages"]) == 2
    assert r.content.decode("utf-8") == "\f".join(page["text"] for page in body["pages"])
    # The special characters and the Chinese came through the engine (else this test would test little).
    assert any(c in body["pages"][1]["text"] for c in "<&>\"'")
    assert "北京" in body["pages"][1]["text"]


def test_markdown_holds_every_line_and_the_table(answers):
    body = answers["json"].json()
    r = answers["markdown"]
    assert r.headers["content-type"] == "text/markdown; charset=utf-8"
    md = r.content.decode("utf-8")
    assert md.count("\n\n---\n\n") == 1  # two pages
    unescaped = re.sub(r"\\(.)", r"\1", md)
    for page in body["pages"]:
        for block in page["blocks"]:
            if block["type"] in ("header", "footer"):
                continue
            for i in block["lines"]:
                assert page["lines"][i]["text"].strip() in unescaped
    table = [b for b in body["pages"][0]["blocks"] if b["type"] == "table"]
    assert table, body["pages"][0]["blocks"]
    rows = [line for line in md.split("---\n\n")[0].splitlines() if line.startswith("|")]
    assert len(rows) == 4 + 1  # the table's four rows and the header's rule
    assert rows[1].replace(" ", "") == "|---|---|---|"
    assert [c.strip() for c in rows[0].strip("|").split("|")] == ["Item", "Quantity", "Price"]


def test_a_tables_cells_in_json_are_the_text_it_was_drawn_with(answers):
    body = answers["json"].json()
    [table] = [b for b in body["pages"][0]["blocks"] if b["type"] == "table"]
    assert (table["rows"], table["columns"]) == (4, 3)
    got = [["" for _ in range(3)] for _ in range(4)]
    lines = body["pages"][0]["lines"]
    for cell in table["cells"]:
        assert (cell["row_span"], cell["column_span"]) == (1, 1)
        got[cell["row"]][cell["column"]] = cell["text"]
        assert cell["text"] == " ".join(lines[i]["text"] for i in cell["lines"])
        x0, y0, x1, y1 = cell["bbox"]
        assert 0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1
    assert got == TABLE[:4]
    # Other blocks carry none of a table's fields.
    others = [b for p in body["pages"] for b in p["blocks"] if b["type"] != "table"]
    assert others and not any({"rows", "columns", "cells"} & b.keys() for b in others)


def test_hocr_validates_and_reads_back_as_the_json(answers, tmp_path):
    check_hocr(answers["json"].json(), answers["hocr"], tmp_path)


def check_hocr(body: dict, r, tmp_path: Path) -> None:
    """hOCR valid by hocr-spec's validator, and its pages, lines and words (boxes, confidences) the JSON's."""
    assert r.headers["content-type"] == "application/xhtml+xml; charset=utf-8"
    path = tmp_path / "out.hocr"
    path.write_bytes(r.content)
    report = HocrValidator("standard").validate(str(path))
    assert report.is_valid(), report.format("text")
    root = etree.fromstring(r.content)
    ns = {"h": "http://www.w3.org/1999/xhtml"}
    assert root.xpath("//h:meta[@name='ocr-system']/@content", namespaces=ns)
    pages = root.xpath("//h:div[@class='ocr_page']", namespaces=ns)
    assert len(pages) == len(body["pages"])
    for page_el, page in zip(pages, body["pages"], strict=True):
        assert props(page_el)["bbox"] == [0, 0, page["width"], page["height"]]
        lines = page_el.xpath(".//h:span[@class='ocr_line']", namespaces=ns)
        expected = [ln for ln in page["lines"] if ln["text"].strip()]
        assert len(lines) == len(expected)
        for line_el, line in zip(lines, expected, strict=True):
            word_els = line_el.xpath("h:span[@class='ocrx_word']", namespaces=ns)
            # The engine's own words (rapidocr locates them): their text, box and confidence.
            assert [w.text for w in word_els] == [wd["text"] for wd in line["words"]]
            lx0, ly0, lx1, ly1 = props(line_el)["bbox"]
            x0, y0, x1, y1 = line["bbox"]
            w, h = page["width"], page["height"]
            assert [lx0, ly0, lx1, ly1] == pytest.approx([x0 * w, y0 * h, x1 * w, y1 * h], abs=1.01)
            for word_el, word in zip(word_els, line["words"], strict=True):
                p = props(word_el)
                wx0, wy0, wx1, wy1 = p["bbox"]
                assert 0 <= wx0 < wx1 <= w and 0 <= wy0 < wy1 <= h
                bx0, by0, bx1, by1 = word["bbox"]
                assert [wx0, wy0, wx1, wy1] == pytest.approx([bx0 * w, by0 * h, bx1 * w, by1 * h], abs=1.01)
                assert lx0 - 1 <= wx0 and wx1 <= lx1 + 1 and ly0 - 1 <= wy0 and wy1 <= ly1 + 1
                assert p["x_wconf"] == [round(word["confidence"] * 100)]


def test_words_are_located_where_they_were_drawn(server):
    # A line drawn word by word, each word's box measured by Pillow as it drew it: the JSON's words are
    # those words, each box over the drawn one (IoU), their texts the line's once spaces are set aside.
    words = ["Invoice", "2024-0193", "issued", "by", "Northwind"]
    font = font_for("en", 40)
    image = Image.new("RGB", (1200, 160), "white")
    draw = ImageDraw.Draw(image)
    drawn, x = [], 60
    for word in words:
        draw.text((x, 50), word, fill="black", font=font)
        drawn.append(draw.textbbox((x, 50), word, font=font))
        x = drawn[-1][2] + draw.textlength(" ", font=font)
    r = server.ocr(encode(image, "PNG"), "image/png")
    assert r.status_code == 200, r.text
    [line] = r.json()["pages"][0]["lines"]
    assert [w["text"] for w in line["words"]] == words
    assert "".join(w["text"] for w in line["words"]) == line["text"].replace(" ", "")
    for w, box in zip(line["words"], drawn, strict=True):
        assert 0 <= w["confidence"] <= 1
        assert iou(w["bbox"], normalise(box, image.size)) > 0.5, (w, box)


def props(el) -> dict[str, list[int]]:
    out = {}
    for part in el.get("title").split(";"):
        key, *values = part.split()
        out[key] = [int(v) for v in values]
    return out


def test_alto_reads_back_with_the_same_words_and_confidences(answers, tmp_path):
    check_alto(answers["json"].json(), answers["alto"], tmp_path)


def check_alto(body: dict, r, tmp_path: Path) -> None:
    """ALTO read back by alto-tools (words, mean confidence) as the JSON's, its strings inside their pages."""
    assert r.headers["content-type"] == "application/alto+xml; charset=utf-8"
    path = tmp_path / "out.xml"
    path.write_bytes(r.content)
    text = subprocess.run([ALTO_TOOLS, str(path), "-t"], capture_output=True, text=True, check=True).stdout
    lines = [ln for page in body["pages"] for ln in page["lines"] if ln["text"].strip()]
    assert [ln.split() for ln in text.split("\n")[1:]] == [[w["text"] for w in ln["words"]] for ln in lines]
    conf = subprocess.run([ALTO_TOOLS, str(path), "-c"], capture_output=True, text=True, check=True).stdout
    word_conf = [w["confidence"] for ln in lines for w in ln["words"]]
    mean = sum(word_conf) / len(word_conf)
    assert float(conf.rsplit("Confidence:", 1)[1]) == pytest.approx(100 * mean, abs=0.02)
    root = etree.fromstring(r.content)
    assert root.findtext("a:Description/a:MeasurementUnit", namespaces=ALTO_NS) == "pixel"
    pages = root.findall("a:Layout/a:Page", ALTO_NS)
    assert len(pages) == len(body["pages"])
    for page_el, page in zip(pages, body["pages"], strict=True):
        w, h = int(page_el.get("WIDTH")), int(page_el.get("HEIGHT"))
        assert (w, h, int(page_el.get("PHYSICAL_IMG_NR"))) == (page["width"], page["height"], page["page"])
        for s in page_el.iterfind(".//a:String", ALTO_NS):
            x, y, sw, sh = (int(s.get(k)) for k in ("HPOS", "VPOS", "WIDTH", "HEIGHT"))
            assert x >= 0 and x + sw <= w and y >= 0 and y + sh <= h and sw > 0 and sh > 0
            assert 0 <= float(s.get("WC")) <= 1


@pytest.mark.parametrize(
    ("accept", "content_type"),
    [
        ("text/plain", "text/plain"),
        ("text/markdown", "text/markdown"),
        ("application/xhtml+xml", "application/xhtml+xml"),
        ("text/vnd.hocr+html", "text/vnd.hocr+html"),
        ("application/alto+xml", "application/alto+xml"),
        ("*/*", "application/json"),
        ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", "application/json"),
        ("text/plain;q=0.5, application/alto+xml;q=0.9", "application/alto+xml"),
        ("application/json;q=0, text/*;q=0.3", "text/plain"),
    ],
)
def test_accept_chooses_the_format(server, tiny, accept, content_type):
    r = server.ocr(tiny, "image/png", headers={"Accept": accept})
    assert r.status_code == 200, r.text
    want = content_type if content_type == "application/json" else f"{content_type}; charset=utf-8"
    assert r.headers["content-type"] == want
    if content_type == "application/json":
        assert r.json()["pages"][0]["lines"]
    elif content_type == "text/plain":
        assert "Harbour" in r.text


def test_a_format_is_rendered_in_a_render_slot_and_json_is_not(server, tiny):
    def count(name: str) -> float:
        return server.metrics().get(f'ocr_render_seconds_count{{format="{name}"}}', 0.0)

    before = {n: count(n) for n in ("hocr", "pdf", "json")}
    for name in ("hocr", "pdf", "json"):
        assert server.ocr(tiny, "image/png", params={"format": name}).status_code == 200
    assert {n: count(n) - before[n] for n in before} == {"hocr": 1.0, "pdf": 1.0, "json": 0.0}


def test_format_wins_over_accept(server, tiny):
    r = server.ocr(tiny, "image/png", headers={"Accept": "application/json"}, params={"format": "text"})
    assert r.headers["content-type"] == "text/plain; charset=utf-8"


@pytest.mark.parametrize(
    ("params", "headers", "status", "code"),
    [
        ({"format": "docx"}, {}, 422, "invalid_parameter"),
        ({}, {"Accept": "image/png"}, 406, "not_acceptable"),
        ({}, {"Accept": "application/json;q=0, text/plain;q=0"}, 406, "not_acceptable"),
    ],
)
def test_format_errors_are_json(server, tiny, params, headers, status, code):
    r = server.ocr(tiny, "image/png", params=params, headers=headers)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert error["code"] == code and error["request_id"] == r.headers["x-request-id"]
    if status == 422:
        assert FORMAT_NAMES in error["message"]


@pytest.mark.parametrize("name", ["text", "hocr", "alto"])
def test_document_errors_stay_json_whatever_the_format(server, name):
    r = server.ocr(b"not an image", "image/png", params={"format": name})
    assert r.status_code == 400
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"]["code"] == "invalid_image"


# --- Accept, parsed ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept", "name"),
    [
        (None, "json"),
        ("", "json"),
        ("garbage", "json"),
        ("application/*", "json"),
        ("text/*", "text"),
        ("TEXT/Markdown; charset=utf-8", "markdown"),
        ("text/plain;q=0.2, text/markdown;q=0.4", "markdown"),
        ("*/*;q=0.1, text/plain;q=0", "json"),
        ("application/json;q=0, */*", "text"),
        ("application/xhtml+xml", "hocr"),
        ("text/html, application/xhtml+xml, */*;q=0.8", "json"),
        ("text/html;q=0, application/xhtml+xml", "hocr"),
        ("application/alto+xml;q=1.5, text/plain;q=0.1", "text"),
        ("application/alto+xml;q=x, text/plain;q=0.1", "text"),
        ("application/alto+xml;q=0.5;level=1, text/plain;q=0.1", "alto"),
        ("application/pdf", "pdf"),
        ("text/plain;q=0.5, application/pdf", "pdf"),
    ],
)
def test_accept_parsing(accept, name):
    assert from_accept(accept)[0].name == name


def test_accept_ranges():
    [r] = parse_accept("Text/Plain ; q=0.5 ; ext=1")
    assert (r.type, r.subtype, r.q) == ("text", "plain", 0.5)
    assert parse_accept("*/plain, nonsense, a/b/c") == []


# --- the formatters, on hand-built responses ------------------------------------------------------------


def response(*pages: Page, engine: str = "rapidocr") -> OcrResponse:
    t = Timings(queue=0, preprocess=0, inference=0, total=0)
    return OcrResponse(request_id="r", engine=engine, model="m", pages=list(pages), timings_ms=t)


def page(lines: list[Line], blocks: list[Block], n: int = 1, w: int = 1000, h: int = 800) -> Page:
    texts = [ln.text for ln in lines]
    text = "\n\n".join("\n".join(texts[i] for i in b.lines) for b in blocks)
    return Page(page=n, width=w, height=h, text=text, lines=lines, blocks=blocks)


LINES = [
    Line(text="A <Title> & more", bbox=(0.1, 0.05, 0.6, 0.1), confidence=0.95),
    Line(text="Déjà vu: 北京 \"quoted\" 'x'", bbox=(0.1, 0.2, 0.9, 0.25), confidence=0.8),
    Line(text="no box here", bbox=None, confidence=0.5),
    Line(text="Page 7", bbox=(0.45, 0.95, 0.55, 0.98), confidence=0.99),
]
BLOCKS = [
    Block(type="title", bbox=None, lines=[0]),
    Block(type="text", bbox=None, lines=[1, 2]),
    Block(type="footer", bbox=None, lines=[3]),
]
DOC = response(page(LINES, BLOCKS), page([], [], n=2, w=500, h=500))


def render_str(name: str, doc: OcrResponse = DOC) -> str:
    return formats.render(formats.FORMATS[name], doc).decode("utf-8")


def test_text_formatter():
    assert render_str("text") == DOC.pages[0].text + "\f"


def test_markdown_formatter():
    md = render_str("markdown")
    first, second = md.split("\n\n---\n\n")
    assert second == ""
    assert first.splitlines()[0] == r"# A \<Title\> \& more"
    assert "Déjà vu: 北京 \"quoted\" 'x'\nno box here" in first
    assert "Page 7" not in first  # the footer is left out
    again = response(page([LINES[0]], [Block(type="title", bbox=None, lines=[0])]))
    assert markdown.render(response(*again.pages, *again.pages)).count("\n## A") == 1


def test_markdown_escapes_what_would_be_markup():
    assert markdown.escape("# not a heading") == r"\# not a heading"
    assert markdown.escape("1. not a list") == r"1\. not a list"
    assert markdown.escape("- nor this") == r"\- nor this"
    assert markdown.escape("a | b *c* _d_") == r"a \| b \*c\* \_d\_"


def test_markdown_tables_from_their_cells_or_one_cell_a_row():
    texts = ["Item", "Price", "Tea", "3.50", "Cake", "Total 9.00"]
    lines = [Line(text=t, bbox=None, confidence=0.9) for t in texts]

    def cell(row: int, column: int, line: int, span: int = 1) -> Cell:
        return Cell(row=row, column=column, column_span=span, text=texts[line], bbox=None, lines=[line])

    cells = [cell(0, 0, 0), cell(0, 1, 1), cell(1, 0, 2), cell(1, 1, 3), cell(2, 0, 4), cell(3, 0, 5, span=2)]
    table = Block(type="table", bbox=None, lines=list(range(6)), rows=4, columns=2, cells=cells)
    md = markdown.render(response(page(lines, [table])))
    # Cake's price is empty; a spanning cell is written in its first column.
    expected = ["| Item | Price |", "| --- | --- |", "| Tea | 3.50 |", "| Cake |  |", "| Total 9.00 |  |"]
    assert md.splitlines() == expected
    bare = Block(type="table", bbox=None, lines=list(range(6)))  # stored before tables had cells
    md = markdown.render(response(page(lines, [bare])))
    assert md.splitlines() == ["| Item |", "| --- |", *(f"| {t} |" for t in texts[1:])]


def test_markdown_passes_the_vllm_engines_text_through():
    p = Page(page=1, width=10, height=10, text="# Heading\n\n| a | b |", lines=[], blocks=[])
    assert markdown.render(response(p, engine="vllm")) == "# Heading\n\n| a | b |"


def test_hocr_formatter_escapes_and_leaves_unlocalised_lines_out_of_the_geometry(tmp_path):
    out = formats.render(formats.FORMATS["hocr"], DOC)
    path = tmp_path / "doc.hocr"
    path.write_bytes(out)
    report = HocrValidator("standard").validate(str(path))
    assert report.is_valid(), report.format("text")
    root = etree.fromstring(out)
    ns = {"h": "http://www.w3.org/1999/xhtml"}
    words = root.xpath("//h:span[@class='ocrx_word']/text()", namespaces=ns)
    assert words == ["A", "<Title>", "&", "more", "Déjà", "vu:", "北京", '"quoted"', "'x'", "Page", "7"]
    lines = root.xpath("//h:span[@class='ocr_line']", namespaces=ns)
    assert len(lines) == 3  # "no box here" has no ocr_line: hOCR requires its bbox
    assert root.xpath("//h:p[@class='ocr_par']/h:span[not(@class)]/text()", namespaces=ns) == ["no box here"]
    assert len(root.xpath("//h:div[@class='ocr_page']", namespaces=ns)) == 2


def test_alto_formatter_escapes_and_positions_only_localised_words():
    out = formats.render(formats.FORMATS["alto"], DOC)
    root = etree.fromstring(out)
    strings = root.findall(".//a:String", ALTO_NS)
    assert [s.get("CONTENT") for s in strings] == [
        *("A", "<Title>", "&", "more", "Déjà", "vu:", "北京", '"quoted"', "'x'"),
        *("no", "box", "here", "Page", "7"),
    ]
    unplaced = [s for s in strings if s.get("HPOS") is None]
    assert [s.get("CONTENT") for s in unplaced] == ["no", "box", "here"]
    assert all(s.get("WC") == "0.5000" for s in unplaced)
    for line in root.iterfind(".//a:TextLine", ALTO_NS):
        kinds = [etree.QName(c).localname for c in line]
        assert kinds == ["String", *["SP", "String"] * ((len(kinds) - 1) // 2)]
    empty = root.findall("a:Layout/a:Page", ALTO_NS)[1]
    assert empty.get("PHYSICAL_IMG_NR") == "2" and not empty.findall(".//a:TextBlock", ALTO_NS)


def test_estimated_word_boxes_share_the_line_by_characters():
    p = Page(page=1, width=1000, height=100, text="", lines=[])
    line = Line(text="ab  cdef", bbox=(0.1, 0.1, 0.9, 0.5), confidence=0.7)
    ws = geometry.words(line, p)
    assert [w.text for w in ws] == ["ab", "cdef"]
    # 8 characters over 800 px: "ab" the first 2, "cdef" the last 4.
    assert [w.box for w in ws] == [(100, 10, 300, 50), (500, 10, 900, 50)]
    # Blanks around the text are not on the page: the share runs from the first character to the last.
    ws = geometry.words(Line(text=" xy z ", bbox=(0.0, 0.0, 0.4, 1.0), confidence=0.7), p)
    assert [w.box for w in ws] == [(0, 0, 200, 100), (300, 0, 400, 100)]
    assert geometry.words(Line(text="x y", bbox=None, confidence=0.1), p)[0].box is None
    # A box at the page's edge stays inside it, at least a pixel wide.
    edge = geometry.pixel_box((0.9999, 0.0, 1.0, 1.0), p)
    assert edge == (999, 0, 1000, 100)


# --- every accepted type through every format ------------------------------------------------------------

WORDS = ["Harbour", "Road"]  # what tiny_page shows


@pytest.fixture(scope="module")
def tiny_page() -> Image.Image:
    return render([" ".join(WORDS)], size=32, width=400).image


@pytest.mark.skipif(not shutil.which("pdftotext") or not shutil.which("qpdf"), reason="poppler-utils, qpdf")
@pytest.mark.parametrize("content_type", list(SUPPORTED_TYPES))
def test_every_accepted_type_goes_through_every_format(server, tiny_page, content_type, tmp_path):
    """The drawn words back from each format, each read by its own reader: JSON, text and Markdown as text,
    hOCR's words and ALTO's strings with lxml (boxes inside the page), the PDF with qpdf and pdftotext."""
    if content_type == PDF_TYPE:
        data = pdf([tiny_page], dpi=200)
    else:
        data = encode(tiny_page.convert("RGB"), RASTER_TYPES[content_type])
    got = {}
    for fmt in FORMAT_NAMES.split(", "):
        r = server.ocr(data, content_type, params={"format": fmt})
        assert r.status_code == 200, (fmt, r.text[:300])
        got[fmt] = r
    [page] = got["json"].json()["pages"]
    w, h = page["width"], page["height"]
    assert page["text"].split() == WORDS
    assert got["text"].text.split() == WORDS
    assert got["markdown"].text.split() == WORDS
    # Each word's box in pixels, as the JSON gives it (0-1 of the page), give or take rounding.
    json_boxes = [[b * (w, h)[i % 2] for i, b in enumerate(x["bbox"])] for x in page["lines"][0]["words"]]
    hocr = etree.fromstring(got["hocr"].content)
    words = hocr.xpath("//*[@class='ocrx_word']")
    assert [x.text for x in words] == WORDS
    for x, want in zip(words, json_boxes, strict=True):
        box = [int(v) for v in x.get("title").split(";")[0].split()[1:]]
        assert 0 <= box[0] < box[2] <= w and 0 <= box[1] < box[3] <= h, box
        assert all(abs(a - b) <= 1 for a, b in zip(box, want, strict=True)), (box, want)
    strings = etree.fromstring(got["alto"].content).xpath("//a:String", namespaces=ALTO_NS)
    assert [s.get("CONTENT") for s in strings] == WORDS
    for s, want in zip(strings, json_boxes, strict=True):
        x, y, sw, sh = (int(s.get(k)) for k in ("HPOS", "VPOS", "WIDTH", "HEIGHT"))
        assert x >= 0 and x + sw <= w and y >= 0 and y + sh <= h, s.attrib
        assert all(abs(a - b) <= 1 for a, b in zip((x, y, x + sw, y + sh), want, strict=True)), (
            s.attrib,
            want,
        )
    out = tmp_path / "out.pdf"
    out.write_bytes(got["pdf"].content)
    check = subprocess.run(["qpdf", "--check", str(out)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    pages = subprocess.run(["qpdf", "--show-npages", str(out)], capture_output=True, text=True, check=True)
    assert int(pages.stdout) == 1
    text = subprocess.run(["pdftotext", str(out), "-"], capture_output=True, text=True, check=True).stdout
    assert text.split() == WORDS


def test_a_real_scan_goes_through_every_format(server, tmp_path):
    """OCRmyPDF's real scan (its test resource linn.png, from its pinned sdist as the development set takes
    it), its top fifth: the formats with boxes read back as the JSON by their own readers, the searchable
    PDF's pdftotext within half a point of character error rate of the JSON's text. (Text and Markdown of
    every accepted type: above.)"""
    import jiwer

    from bench.devset import source_file

    scan = Image.open(source_file("ocrmypdf", "tests/resources/linn.png"))
    crop = scan.crop((0, 0, scan.width, 636))  # the title, a paragraph and two bullets: no line cut
    data = encode(crop.convert("RGB"), "PNG")
    got = {}
    for fmt in ("json", "hocr", "alto", "pdf"):
        r = server.ocr(data, "image/png", params={"format": fmt})
        assert r.status_code == 200, (fmt, r.text[:300])
        got[fmt] = r
    body = got["json"].json()
    [page] = body["pages"]
    assert len(page["text"].split()) > 20, page["text"]  # a real paragraph's worth of words
    check_hocr(body, got["hocr"], tmp_path)
    check_alto(body, got["alto"], tmp_path)
    out = tmp_path / "out.pdf"
    out.write_bytes(got["pdf"].content)
    assert subprocess.run(["qpdf", "--check", str(out)], capture_output=True).returncode == 0
    text = subprocess.run(["pdftotext", str(out), "-"], capture_output=True, text=True, check=True).stdout
    flat = " ".join(page["text"].split())
    assert jiwer.cer(flat, " ".join(text.split())) <= 0.005, text
    assert len(got["pdf"].content) <= 1.1 * len(data) + 64 * 1024


def test_a_real_receipt_reads_as_printed(server):
    """A real hotel's payment receipt (invoice2data's test document, the development set's `oyo-receipt`,
    built as `make bench` builds it: rendered at 200 dpi and degraded like a scan, from the pinned sdist):
    the service's text within 3 % character error rate of poppler's `pdftotext -layout` of the PDF's own text
    layer, row by row (1.5 % on 2026-12-08, Tesseract 5 2.3 % on the same image), and every figure on it read
    whole: amounts, dates, the booking, account and tax numbers."""
    import jiwer

    from bench.devset import build_page, manifest

    m = manifest()
    [spec] = [p for p in m["pages"] if p["name"] == "oyo-receipt"]
    page = build_page(spec, m["sources"])
    r = server.ocr(encode(page.image, "PNG"), "image/png", params={"format": "text"})
    assert r.status_code == 200, r.text[:300]
    got = " ".join(r.text.split())
    assert jiwer.cer(page.text, got) <= 0.03, got
    figures = ["31/12/2017", "01/01/2018", "IBZY2087", "Rs 1939", "Rs 0", "00030340067212", "HDFC0000003"]
    figures += ["06AABCO6063D1ZQ", "U63090DL2012PTC231770"]
    assert [f for f in figures if f not in got] == []
    for f in figures:
        assert f in page.text  # the truth says so too: pdftotext reads them off the text layer
