"""The model's tables as rows and cells: the same grid the rapidocr engine finds from geometry
(ocr_app/engines/tables.py), here read from the markup LightOnOCR writes, an HTML table (with rowspan and
colspan) or a Markdown pipe table. Python's own html.parser reads the HTML, whatever its line breaks; a cell
belongs to the model's line its text starts on."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

from ..base import EngineCell, EngineTable

# A rowspan or colspan beyond MAX_SPAN is taken as MAX_SPAN: a runaway answer must not build a huge grid.
MAX_SPAN = 100
_PIPE = re.compile(r"(?<!\\)\|")
_RULE = re.compile(r"^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?$")  # | --- | :---: |


@dataclass
class _Cell:
    text: list[str] = field(default_factory=list)
    line: int | None = None  # the block's line (0-based) its text starts on
    row_span: int = 1
    column_span: int = 1


class _Tables(HTMLParser):
    """The rows of cells of each <table> fed to it."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: list[list[list[_Cell]]] = []
        self._depth = 0
        self._cell: _Cell | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._depth += 1
            if self._depth == 1:
                self.tables.append([])
        elif self._depth != 1:
            return  # a table within a cell: its text is the outer cell's
        elif tag == "tr":
            self.tables[-1].append([])
            self._cell = None
        elif tag in ("td", "th"):
            if not self.tables[-1]:
                self.tables[-1].append([])  # a cell before any <tr>
            a = dict(attrs)
            self._cell = _Cell(row_span=_span(a.get("rowspan")), column_span=_span(a.get("colspan")))
            self.tables[-1][-1].append(self._cell)
        elif tag == "br" and self._cell is not None:
            self._cell.text.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._depth = max(0, self._depth - 1)
            if self._depth == 0:
                self._cell = None
        elif self._depth == 1 and tag in ("td", "th", "tr"):
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is None:
            return
        if self._cell.line is None and data.strip():
            self._cell.line = self.getpos()[0] - 1 + _leading_newlines(data)
        self._cell.text.append(data)


def _leading_newlines(data: str) -> int:
    """Lines the data runs over before its first non-blank character (getpos is where the data starts)."""
    return data[: len(data) - len(data.lstrip())].count("\n")


def _span(value: str | None) -> int:
    try:
        return min(MAX_SPAN, max(1, int(value or 1)))
    except ValueError:
        return 1


def markup_table(lines: list[str], index: list[int]) -> EngineTable | None:
    """The grid of the one table that a table block's lines hold (`lines`: the block's lines as written,
    `index`: each one's index among the page's lines), or None when they hold no table, or several."""
    if not lines:
        return None
    if lines[0].lstrip().startswith("|"):
        rows = [_pipe_row(line, k) for k, line in enumerate(lines) if not _RULE.match(line.strip())]
    else:
        parser = _Tables()
        parser.feed("\n".join(lines))
        parser.close()
        if len(parser.tables) != 1:
            return None
        rows = parser.tables[0]
    return _grid([row for row in rows if row], index)


def _pipe_row(line: str, k: int) -> list[_Cell]:
    parts = _PIPE.split(line.strip())
    if parts and not parts[0].strip():
        parts = parts[1:]
    if parts and not parts[-1].strip():
        parts = parts[:-1]
    return [_Cell([p.replace("\\|", "|")], line=k) for p in parts]


def _grid(rows: list[list[_Cell]], index: list[int]) -> EngineTable | None:
    """Cells placed as HTML places them: each in the first column of its row that no cell above spans."""
    if not rows:
        return None
    taken: set[tuple[int, int]] = set()
    cells: list[EngineCell] = []
    n_rows = n_columns = 0
    for r, row in enumerate(rows):
        c = 0
        for cell in row:
            while (r, c) in taken:
                c += 1
            for dr in range(cell.row_span):
                for dc in range(cell.column_span):
                    taken.add((r + dr, c + dc))
            text = " ".join("".join(cell.text).split())
            line = [index[cell.line]] if cell.line is not None and 0 <= cell.line < len(index) else []
            if text:
                cells.append(EngineCell(r, c, cell.row_span, cell.column_span, line, None, text))
            n_rows = max(n_rows, r + cell.row_span)
            n_columns = max(n_columns, c + cell.column_span)
            c += cell.column_span
    n_rows = max(n_rows, len(rows))
    return EngineTable(n_rows, n_columns, cells) if n_columns else None
