"""The vllm engine's tables as cells (ocr_app/engines/vllm/tables.py): the HTML tables LightOnOCR writes,
with rowspan and colspan, whatever their line breaks, and Markdown pipe tables. Each grid expected is
written out by hand, as HTML lays the table out."""

from __future__ import annotations

import pytest

from ocr_app.engines.vllm import tables
from ocr_app.engines.vllm.tables import markup_table


def grid(lines: list[str], index: list[int] | None = None):
    t = markup_table(lines, list(range(10, 10 + len(lines))) if index is None else index)
    assert t is not None
    return t.rows, t.columns, [(c.row, c.column, c.row_span, c.column_span, c.text, c.lines) for c in t.cells]


def test_an_html_table_with_spans_a_row_a_line():
    lines = [
        "<table>",
        "<thead><tr><th rowspan=2>Offense</th><th colspan=2>Male</th></tr>",
        "<tr><th>Total</th><th>Under 18</th></tr></thead>",
        "<tbody><tr><td>Robbery</td><td>264.0</td><td>30.2</td></tr>",
        "<tr><td>Fish &amp; Chips<br>fried</td><td></td><td>1</td></tr></tbody>",
        "</table>",
    ]
    rows, columns, cells = grid(lines)
    assert (rows, columns) == (4, 3)
    assert cells == [
        (0, 0, 2, 1, "Offense", [11]),
        (0, 1, 1, 2, "Male", [11]),
        (1, 1, 1, 1, "Total", [12]),  # column 0 is Offense's, spanning down
        (1, 2, 1, 1, "Under 18", [12]),
        (2, 0, 1, 1, "Robbery", [13]),
        (2, 1, 1, 1, "264.0", [13]),
        (2, 2, 1, 1, "30.2", [13]),
        (3, 0, 1, 1, "Fish & Chips fried", [14]),  # the empty cell is left out
        (3, 2, 1, 1, "1", [14]),
    ]


def test_an_html_table_on_one_line_or_a_cell_a_line():
    one = ["<table><tr><td>a</td><td>b</td></tr><tr><td>c</td><td>d</td></tr></table>"]
    assert grid(one, [5]) == (2, 2, [(0, 0, 1, 1, "a", [5]), (0, 1, 1, 1, "b", [5]),
                                     (1, 0, 1, 1, "c", [5]), (1, 1, 1, 1, "d", [5])])  # fmt: skip
    spread = ["<table><tr>", "<td>", "a", "</td><td>b</td>", "</tr></table>"]
    assert grid(spread, [0, 1, 2, 3, 4])[2] == [(0, 0, 1, 1, "a", [2]), (0, 1, 1, 1, "b", [3])]


def test_a_table_in_a_cell_is_the_cells_text():
    lines = ["<table><tr><td>x <table><tr><td>in</td></tr></table></td><td>y</td></tr></table>"]
    assert grid(lines, [0])[2] == [(0, 0, 1, 1, "x in", [0]), (0, 1, 1, 1, "y", [0])]


def test_a_pipe_table_its_rule_and_an_escaped_pipe():
    lines = ["| Item | Price |", "| --- | :---: |", r"| a \| b | 3.50 |", "| Cake | |"]
    rows, columns, cells = grid(lines, [0, 1, 2, 3])
    assert (rows, columns) == (3, 2)
    assert cells == [
        (0, 0, 1, 1, "Item", [0]),
        (0, 1, 1, 1, "Price", [0]),
        (1, 0, 1, 1, "a | b", [2]),
        (1, 1, 1, 1, "3.50", [2]),
        (2, 0, 1, 1, "Cake", [3]),
    ]


@pytest.mark.parametrize(("span", "columns"), [("100", 100), ("101", 100), ("x", 1), ("0", 1)])
def test_a_span_at_its_limit_one_past_it_and_nonsense(span, columns):
    assert tables.MAX_SPAN == 100
    t = markup_table([f'<table><tr><td colspan="{span}">a</td></tr></table>'], [0])
    assert t is not None and t.columns == columns and t.cells[0].column_span == columns


def test_no_table_or_two_tables_give_no_grid():
    assert markup_table([], []) is None
    assert markup_table(["<table></table>"], [0]) is None
    two = ["<table><tr><td>a</td></tr></table>", "<table><tr><td>b</td></tr></table>"]
    assert markup_table(two, [0, 1]) is None
