"""The engine interface every OCR backend implements, and the sample page engines test themselves on."""

from __future__ import annotations

import abc
import asyncio
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont
from prometheus_client.registry import Collector

from ..documents.image import PageImage

SELF_TEST_TEXT = "OCR self-test 2048"

# stream(i, text): the next piece of page i's text as the engine writes it (Engine.recognize).
TextSink = Callable[[int, str], None]


class PriorityGate:
    """At most `n` holders at once; when one leaves, a waiting interactive page goes before any waiting
    background (bulk-job) page, each class in arrival order. For engines that run a page at a time per
    worker: a job page never keeps an interactive one waiting longer than the page already running."""

    def __init__(self, n: int):
        self._free = n
        self._waiting: tuple[deque[asyncio.Future[None]], deque[asyncio.Future[None]]] = (deque(), deque())

    async def acquire(self, background: bool = False) -> None:
        if self._free > 0 and not any(self._waiting):
            self._free -= 1
            return
        turn = asyncio.get_running_loop().create_future()
        queue = self._waiting[1 if background else 0]
        queue.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.release()  # handed the turn just as it was cancelled: the next one takes it
            else:
                queue.remove(turn)
            raise

    def release(self) -> None:
        for queue in self._waiting:
            while queue:
                turn = queue.popleft()
                if not turn.done():
                    turn.set_result(None)
                    return
        self._free += 1


@dataclass
class EngineWord:
    text: str
    bbox: tuple[float, float, float, float] | None  # normalised 0-1 to the page image
    confidence: float


@dataclass
class EngineLine:
    text: str
    bbox: tuple[float, float, float, float] | None  # normalised 0-1 to the page image
    confidence: float
    words: list[EngineWord] | None = None  # where the engine locates them (rapidocr), in the line's order


@dataclass
class EngineCell:
    row: int
    column: int
    row_span: int
    column_span: int
    lines: list[int]  # indices into the page's lines, left to right
    bbox: tuple[float, float, float, float] | None  # normalised
    text: str | None = None  # where one line holds several cells (a model's table row): the cell's own


@dataclass
class EngineTable:
    rows: int
    columns: int
    cells: list[EngineCell]  # row by row, left to right


@dataclass
class EngineBlock:
    type: str  # text, title, table, figure, header, footer, ...
    bbox: tuple[float, float, float, float] | None  # the union of its lines' boxes, normalised
    lines: list[int]  # indices into the page's lines
    table: EngineTable | None = None  # a table block's rows and cells, where the engine finds them


@dataclass
class EnginePage:
    lines: list[EngineLine]
    # Without its own text: the blocks' lines, one per line, blocks apart by a blank line (lines alone
    # without blocks). A VLM returns its own Markdown.
    text: str | None = None
    warnings: list[str] = field(default_factory=list)
    rotation: int = 0  # degrees the engine turned the page clockwise to read it (0, 90, 180, 270)
    blocks: list[EngineBlock] = field(default_factory=list)
    usage: tuple[int, int] | None = None  # (prompt, completion) tokens, where the engine counts them (vllm)

    def joined_text(self) -> str:
        if self.text is not None:
            return self.text
        if not self.blocks:
            return "\n".join(ln.text for ln in self.lines)
        return "\n\n".join(self.block_text(b) for b in self.blocks)

    def block_text(self, block: EngineBlock) -> str:
        """A block's lines one per line; a table's row by row, its cells apart by a tab."""
        if block.table is None:
            return "\n".join(self.lines[i].text for i in block.lines)
        rows: list[list[str]] = [[] for _ in range(block.table.rows)]
        for cell in block.table.cells:
            rows[cell.row].append(self.cell_text(cell))
        return "\n".join("\t".join(row) for row in rows if row)

    def cell_text(self, cell: EngineCell) -> str:
        return cell.text if cell.text is not None else " ".join(self.lines[i].text for i in cell.lines)


class EngineError(Exception):
    """The engine cannot serve (failed load, failed self-test, died)."""


def model_label(path: Path) -> tuple[Path, str]:
    """The directory a model setting names, resolved, and how the engine reports it: a revision behind a
    `current` symlink (the ocr_model role's layout) is `<name>@<revision>`, so that a switch of `current`
    cannot go unnoticed."""
    resolved = path.resolve()
    if path.is_symlink():
        return resolved, f"{resolved.parent.name}@{resolved.name}"
    return resolved, resolved.name or str(resolved)


class Engine(abc.ABC):
    name: str
    model: str = "unknown"
    device: str = "cpu"
    pages_done: int = 0  # pages the engine actually ran, including those of abandoned requests
    retries: int = 0  # pages run again after a degenerate answer (the vllm engine)
    # Pages by the rotation (degrees clockwise) the engine applied to read them; None: it turns none.
    rotations: dict[int, int] | None = None
    # Set by the app: an engine whose backend dies between requests reports it here (-> unhealthy, exit).
    on_fatal: Callable[[str], None] | None = None
    # True: load() takes a device that a running instance on this host already holds (vLLM reserves a
    # share of the GPU's memory), so `ocr-app check` must not load beside it and runs preflight() only.
    claims_device: bool = False
    _count_lock = threading.Lock()

    def _page_done(self) -> None:
        with self._count_lock:
            self.pages_done += 1

    @abc.abstractmethod
    async def load(self) -> None:
        """Load models; called once, off the request path, before the service reports ready."""

    async def preflight(self) -> list[str]:
        """What load() needs, checked without claiming a device; raise EngineError on a problem.

        Returns one line per thing checked, for `ocr-app check` to print.
        """
        return []

    async def self_test(self) -> None:
        """Recognise the built-in sample; raise EngineError unless its text comes back."""
        [page] = await self.recognize([sample_page()])
        got = " ".join(line.text for line in page.lines) if page.lines else (page.text or "")
        if "2048" not in got:
            raise EngineError(f"self-test failed: expected {SELF_TEST_TEXT!r}, got {got[:80]!r}")

    @abc.abstractmethod
    async def recognize(
        self,
        pages: list[PageImage],
        max_tokens: int | None = None,
        background: bool = False,
        stream: TextSink | None = None,
    ) -> list[EnginePage]:
        """OCR preprocessed pages. Cancelling the awaiting task abandons pages not yet started.

        `max_tokens`: the most tokens a generative engine may write per page (others ignore it).
        `background`: a bulk job's pages: waiting interactive pages go first.
        `stream`: an engine that writes a page token by token (vllm) calls stream(i, piece) with each new
        piece of page i's text as its first attempt writes it; the pieces join into a prefix of the page's
        final text unless the page is run again (a degenerate answer). Other engines ignore it.
        """

    def healthy(self) -> bool:
        return True

    def available_memory_mb(self) -> int | None:
        """Free memory on the engine's device; None: the host's memory is what counts."""
        return None

    def device_problem(self) -> str | None:
        """Why the engine's device cannot take work (its driver refuses it), read per /healthz; or None."""
        return None

    def metrics_collector(self) -> Collector | None:
        """A prometheus_client collector of the backend's own metrics, exported beside ours; or None."""
        return None

    async def close(self) -> None:  # noqa: B027 - engines without resources need nothing here
        pass


def sample_page() -> PageImage:
    """A rendered line of text; Pillow bundles the font, so this needs nothing from the host."""
    font = ImageFont.load_default(size=40)
    image = Image.new("RGB", (640, 120), "white")
    ImageDraw.Draw(image).text((30, 35), SELF_TEST_TEXT, fill="black", font=font)
    return PageImage(1, image, image.width, image.height)
