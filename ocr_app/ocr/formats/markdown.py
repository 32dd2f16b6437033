"""format=markdown: the page's layout blocks as Markdown.

- `title` blocks are headings: the document's first `#`, every later one `##`.
- `text`, `list`, `formula` and `figure` blocks are paragraphs: their lines, one per line.
- `table` blocks are pipe tables from their cells, the first row the header row; a cell spanning several
  columns is written in its first, the others left empty (pipe tables have no spans). A table block
  without cells (a result stored before tables had them) is a table of one column, a line a row.
- `header` and `footer` blocks (running heads, page numbers) are left out: they are not the page's content.
- A page without blocks (an engine that cannot group its lines) is one paragraph of its lines.
- Engine `vllm`: the page's text is already the model's Markdown and is passed through as it is.

Text from the page is escaped (a line that starts with `#`, `-` or `1.` is not a heading or a list; `*`,
`_`, `|` and the like are literal); pages are apart by a thematic break (`---`).
"""

from __future__ import annotations

import re

from ...schemas import Block, OcrResponse, Page
from . import parts

MEDIA_TYPE = "text/markdown"

PAGE_BREAK = "\n\n---\n\n"
_INLINE = re.compile(r"([\\`*_{}\[\]<>()#+!|~&])")  # & too: "&amp;" on the page is not an entity
_LINE_START = re.compile(r"^(\s*)(\d+)([.)])")  # "1." would start an ordered list
_LEADING = re.compile(r"^(\s*)([-=>])")  # a bullet, a setext underline, a quote


def escape(text: str, line_start: bool = True) -> str:
    """One line of the page's text, literal in Markdown (a table's cell: not at a line's start)."""
    out = _INLINE.sub(r"\\\1", text)
    if not line_start:
        return out
    out = _LINE_START.sub(r"\1\2\\\3", out)
    return _LEADING.sub(r"\1\\\2", out)


class Writer(parts.Writer):
    """The title count runs across pages: the document's first title is `#`, on whichever page."""

    separator = PAGE_BREAK.encode("utf-8")

    def __init__(self, engine: str, model: str, count: int) -> None:
        super().__init__(engine, model, count)
        self.state = _State()

    def body(self, page: Page) -> bytes:
        return (page.text if self.engine == "vllm" else _page(page, self.state)).encode("utf-8")


def render(response: OcrResponse) -> str:
    return parts.render(Writer, response).decode("utf-8")


class _State:
    def __init__(self) -> None:
        self.titles = 0


def _page(page: Page, state: _State) -> str:
    if not page.blocks:
        return "\n".join(escape(line.text) for line in page.lines if line.text.strip())
    parts = []
    for block in page.blocks:
        lines = [page.lines[i] for i in block.lines if 0 <= i < len(page.lines)]
        lines = [line for line in lines if line.text.strip()]
        if not lines or block.type in ("header", "footer"):
            continue
        if block.type == "title":
            state.titles += 1
            hashes = "#" if state.titles == 1 else "##"
            parts.append(f"{hashes} " + " ".join(escape(line.text.strip()) for line in lines))
        elif block.type == "table":
            parts.append(_table(block, page) or "\n".join(escape(line.text) for line in lines))
        else:
            parts.append("\n".join(escape(line.text) for line in lines))
    return "\n\n".join(parts)


def _table(block: Block, page: Page) -> str:
    if block.cells is None or not block.rows or not block.columns:
        grid = [[page.lines[i].text.strip()] for i in block.lines if 0 <= i < len(page.lines)]
    else:
        grid = [[""] * block.columns for _ in range(block.rows)]
        for cell in block.cells:
            if cell.row < block.rows and cell.column < block.columns:
                grid[cell.row][cell.column] = cell.text.strip()
    grid = [[escape(text, line_start=False) for text in row] for row in grid if any(row)]
    if not grid:
        return ""
    columns = max(len(row) for row in grid)
    out = ["| " + " | ".join(grid[0]) + " |", "|" + " --- |" * columns]
    out += ["| " + " | ".join(row) + " |" for row in grid[1:]]
    return "\n".join(out)
