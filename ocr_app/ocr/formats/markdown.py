"""format=markdown: the page's layout blocks as Markdown.

- `title` blocks are headings: the document's first `#`, every later one `##`.
- `text`, `list`, `formula` and `figure` blocks are paragraphs: their lines, one per line.
- `table` blocks are pipe tables: the block's lines grouped into rows by their boxes (a line whose vertical
  middle lies within the row's extent joins it), cells left to right, the first row the header row. Where a
  line of the block has no box, each line is a row of one cell.
- `header` and `footer` blocks (running heads, page numbers) are left out: they are not the page's content.
- A page without blocks (an engine that cannot group its lines) is one paragraph of its lines.
- Engine `vllm`: the page's text is already the model's Markdown and is passed through as it is.

Text from the page is escaped (a line that starts with `#`, `-` or `1.` is not a heading or a list; `*`,
`_`, `|` and the like are literal); pages are apart by a thematic break (`---`).
"""

from __future__ import annotations

import re

from ...schemas import Line, OcrResponse, Page

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


def render(response: OcrResponse) -> str:
    state = _State()
    pages = [page.text if response.engine == "vllm" else _page(page, state) for page in response.pages]
    return PAGE_BREAK.join(pages)


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
            parts.append(_table(lines))
        else:
            parts.append("\n".join(escape(line.text) for line in lines))
    return "\n\n".join(parts)


def rows(lines: list[Line]) -> list[list[Line]]:
    """A table block's lines as rows of cells, from their boxes; one cell per row where a box is missing."""
    if any(line.bbox is None for line in lines):
        return [[line] for line in lines]
    out: list[list[Line]] = []
    extent: list[tuple[float, float]] = []
    for line in sorted(lines, key=lambda ln: (_box(ln)[1] + _box(ln)[3]) / 2):
        _, y0, _, y1 = _box(line)
        middle = (y0 + y1) / 2
        if out and extent[-1][0] <= middle <= extent[-1][1]:
            out[-1].append(line)
            top, bottom = extent[-1]
            extent[-1] = (min(top, y0), max(bottom, y1))
        else:
            out.append([line])
            extent.append((y0, y1))
    return [sorted(row, key=lambda ln: _box(ln)[0]) for row in out]


def _box(line: Line) -> tuple[float, float, float, float]:
    assert line.bbox is not None
    return line.bbox


def _table(lines: list[Line]) -> str:
    grid = [[escape(cell.text.strip(), line_start=False) for cell in row] for row in rows(lines)]
    columns = max(len(row) for row in grid)
    grid = [row + [""] * (columns - len(row)) for row in grid]
    out = ["| " + " | ".join(grid[0]) + " |", "|" + " --- |" * columns]
    out += ["| " + " | ".join(row) + " |" for row in grid[1:]]
    return "\n".join(out)
