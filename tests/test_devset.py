"""The development set's manifest and measures (bench/devset.py, #41), offline: the pages themselves are built
from registry packages fetched at run time (`python -m bench.devset`), which the tests do not download."""

from __future__ import annotations

import re

from PIL import Image, ImageDraw

from bench.devset import bag_of_words_error, degrade, flat, manifest, page_text, ruled_tables, table_score

KINDS = {
    "multi-column", "three-column", "newsletter", "single", "rotated", "table-ruled", "table-unruled", "form",
    "receipt", "invoice",
}  # fmt: skip
ORDERED = {"multi-column", "three-column", "newsletter"}  # pages with columns: their truth in reading order


def test_manifest_pins_every_source_and_describes_every_page() -> None:
    m = manifest()
    for name, src in m["sources"].items():
        spec = src.get("pypi") or src.get("deb")
        assert spec, name
        assert re.fullmatch(r"[A-Za-z0-9_.-]+(==|=)[A-Za-z0-9_.:~+-]+", spec), spec  # an exact version
    names = [p["name"] for p in m["pages"]]
    assert len(names) == len(set(names)) >= 10
    for p in m["pages"]:
        assert p["source"] in m["sources"], p["name"]
        assert p["kind"] in KINDS, p["name"]
        assert p["licence"], p["name"]
        assert ("file" in p and p["page"] >= 1) or ("image" in p and "truth" in p), p["name"]
        assert p.get("truth_mode", "raw") in {"raw", "layout"}, p["name"]
        for box in p.get("order", []):  # regions in points on a page no larger than A3
            assert len(box) == 4 and 0 <= box[0] < box[2] <= 842 and 0 <= box[1] < box[3] <= 1191, p["name"]
    assert sum(p["kind"] == "multi-column" for p in m["pages"]) >= 3
    assert all("order" in p for p in m["pages"] if p["kind"] in ORDERED)
    assert {p["kind"] for p in m["pages"]} >= {"three-column", "newsletter", "invoice", "receipt"}


def test_a_page_s_truth_follows_the_reader_s_order(tmp_path) -> None:
    """Two columns cut out by region, in the order given, each line as printed (a hyphen at a line's end
    kept); without an order, poppler's own. The PDF is written by fpdf2, the text read back by pdftotext."""
    from fpdf import FPDF

    pdf = FPDF(unit="pt", format="letter")
    pdf.add_page()
    pdf.set_font("helvetica", size=11)
    lines = [(60, 100, "left one"), (60, 300, "left two con-"), (60, 314, "tinued"), (340, 100, "right one")]
    for x, y, text in lines:
        pdf.text(x, y, text)
    path = tmp_path / "two.pdf"
    pdf.output(str(path))
    left, right = [40, 60, 306, 700], [306, 60, 580, 700]
    assert flat(page_text(path, 1, {"order": [left, right]})) == "left one left two con- tinued right one"
    assert flat(page_text(path, 1, {"order": [right, left]})) == "right one left one left two con- tinued"
    assert "right one" in flat(page_text(path, 1, {}))


def test_bag_of_words_error_ignores_order_case_and_punctuation() -> None:
    ref = "The left column. The right column, read after it."
    assert bag_of_words_error(ref, "read after it. the right column, The left column") == 0.0
    assert bag_of_words_error(ref, "The left column.") == 1 - 3 / 9
    assert bag_of_words_error(ref, "") == 1.0
    assert bag_of_words_error("", "anything") == 0.0
    assert flat(" a\n\n b\tc ") == "a b c"


def test_degrade_is_seeded_and_looks_scanned() -> None:
    page = Image.new("RGB", (400, 300), "white")
    ImageDraw.Draw(page).rectangle((50, 50, 350, 60), fill="black")
    a, b, c = degrade(page, "p1"), degrade(page, "p1"), degrade(page, "p2")
    assert a.tobytes() == b.tobytes()
    assert a.tobytes() != c.tobytes()
    assert a.size != page.size  # skewed with the canvas grown to hold the turned page
    assert a.getextrema()[0][0] < 40  # the rule is still dark


def test_ruled_tables_are_read_on_the_grid_their_rules_give(tmp_path) -> None:
    """Two tables drawn with fpdf2 as the census page's were drawn (pdfplumber reads the PDF): a vertical
    rule a segment per row, a horizontal rule a segment per column, over the table, under its head and
    under it only: each table on its own grid, top to bottom, a label on two lines within one cell one row."""
    from fpdf import FPDF

    pdf = FPDF(unit="pt", format="letter")
    pdf.add_page()
    pdf.set_font("helvetica", size=8)

    def table(top: float, widths: list[float], rows: list[tuple[float, list[str]]]) -> None:
        y = top
        for r, (height, cells) in enumerate(rows):
            x = 50.0
            for w, text in zip(widths, cells, strict=True):
                pdf.line(x, y, x, y + height)
                pdf.line(x + w, y, x + w, y + height)
                if r < 2:  # over the table, under its head
                    pdf.line(x, y, x + w, y)
                if r == len(rows) - 1:
                    pdf.line(x, y + height, x + w, y + height)
                for k, part in enumerate(text.split("/")):
                    pdf.text(x + 3, y + 9 + 9 * k, part)
                x += w
            y += height

    first = [(12.0, ["Offense", "Total", "Male"]), (21.0, ["Murder and/manslaughter", "10.0", "9.0"]),
             (12.0, ["Robbery", "102.1", "90.0"])]  # fmt: skip
    table(100, [120, 50, 50], first)
    table(200, [80, 80], [(12.0, ["White", "Black"]), (12.0, ["4,741", "4,801"])])
    path = tmp_path / "tables.pdf"
    pdf.output(str(path))
    got = [[[flat(c or "") for c in row] for row in t] for t in ruled_tables(path, 1)]
    assert got == [
        [
            ["Offense", "Total", "Male"],
            ["Murder and manslaughter", "10.0", "9.0"],
            ["Robbery", "102.1", "90.0"],
        ],
        [["White", "Black"], ["4,741", "4,801"]],
    ]


def test_table_score_by_position_and_with_rows_aligned() -> None:
    # A head read as two rows: by position every row after it is off; aligned, only its own cells are.
    truth = [["Offense", "Under 18 years"], ["Robbery", "25.5"], ["Arson", "4.3"], ["Fraud", "5.1"]]
    grid = [["Offense", "Under 18"], ["", "years"], ["Robbery ......", "25.5"], ["ARSON.", "4.3"],
            ["Fraud", "5.1"]]  # fmt: skip
    score = table_score(truth, grid)
    assert score["rows"] == [5, 4] and score["columns"] == [2, 2]
    assert score["cells_exact"] == 1 / 8  # "Offense" alone
    assert score["cells_exact_aligned"] == 7 / 8  # all but "Under 18 years"; leaders and case aside
    assert table_score(truth, None)["cells_exact_aligned"] == 0.0
