"""RapidOCR engine: PP-OCRv6 (det + rec) ONNX models on the CPU, from a model revision directory
(`model_path`, what the ocr_model role installs; revision.py) or, without one, those shipped inside the
rapidocr wheel.

Lines come in reading order and grouped into blocks by ocr_app.engines.layout: a recursive XY-cut over the
detected line boxes, geometry alone (no layout model: a few ms a page, where a detection model would cost
about as much as the page's own text detection). A page turned sideways or upside down is read upright
(orientation.py). Before recognition, a detected box that runs across a narrow gutter between columns is
split there (gutters.py).

A fixed pool of engine instances, each used by one worker thread at a time, bounds CPU and memory
whatever the request concurrency. ONNX Runtime releases the GIL, so the event loop stays free. Bulk-job
pages run on instances of their own (`job_workers`) whose threads, ONNX Runtime's included, are at
nice 19: an interactive page never waits for a job page, and takes the CPU from it while both run.
"""

from __future__ import annotations

import asyncio
import logging
import queue
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from ...documents.image import PageImage
from ...sched import JOB_PRIORITY, to_job_priority
from ..base import (
    Engine,
    EngineBlock,
    EngineCell,
    EngineError,
    EngineLine,
    EnginePage,
    EngineTable,
    EngineWord,
    PriorityGate,
    TextSink,
    model_label,
)
from ..layout import Box, deskewed, page_layout, page_skew
from .orientation import ROTATIONS, oriented, unrotate
from .revision import check_revision

log = logging.getLogger("ocr_app.engines.rapidocr")

MODEL_NAME = "PP-OCRv6-small"
JOB_THREAD_NAME = "ocr-job"  # the job threads' name in /proc (ONNX Runtime's among them)

# ONNX Runtime's thread pools spin after each operator, waiting for more work (its default). Beside the other
# instances, the job threads and the host's own services, that burns the cores they need: a two-line page
# like the fleet's load cost 0.36 CPU-s and 179 ms with spinning, 0.25 CPU-s and 136 ms without (2 threads,
# 2 cores; `make bench`, measurement 7). rapidocr builds each session's options itself, with no setting for
# this, so its options factory is wrapped, once per process; tests/test_rapidocr_sessions.py reads them back.
ORT_SESSION_CONFIG = {"session.intra_op.allow_spinning": "0", "session.inter_op.allow_spinning": "0"}


def _sessions_without_spinning() -> None:
    from rapidocr.inference_engine.onnxruntime.main import OrtInferSession

    build = OrtInferSession._init_sess_opts
    if getattr(build, "ocr_app", False):
        return

    def options(cfg: Any) -> Any:
        opts = build(cfg)
        for key, value in ORT_SESSION_CONFIG.items():
            opts.add_session_config_entry(key, value)
        return opts

    options.ocr_app = True  # type: ignore[attr-defined]
    OrtInferSession._init_sess_opts = staticmethod(options)  # type: ignore[method-assign]


class RapidOcrEngine(Engine):
    name = "rapidocr"
    device = "cpu"

    def __init__(
        self,
        workers: int = 1,
        threads: int = 1,
        use_cls: bool = False,
        det_limit_type: str = "max",
        det_limit_side: int = 1536,
        model_dir: Path | None = None,
        orientation: bool = True,
        job_workers: int = 0,
        job_idle: bool = True,
    ):
        self.workers = workers
        self.job_workers = job_workers
        self.orientation = orientation
        self.rotations: dict[int, int] = dict.fromkeys(ROTATIONS, 0)  # pages by the rotation applied
        self.threads = threads
        self.use_cls = use_cls
        self.det_limit = (det_limit_type, det_limit_side)
        self.model_dir: Path | None = None
        label = MODEL_NAME
        if model_dir is not None:
            self.model_dir, label = model_label(model_dir)
        self.model = f"{label} (rapidocr {version('rapidocr')})"
        self._files: dict[str, Path] | None = None  # model_files(), once checked
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rapidocr")
        self._idle: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._gate = PriorityGate(workers)  # a page holds it while in the pool: the pool never queues
        # Job pages: instances and threads of their own, or (job_workers 0) the gate's turn after interactive.
        # JOB_PRIORITY, or why the job threads are not at it.
        self.job_priority: str | None = None if job_idle else "normal (job_idle_priority is off)"
        self._job_idle_priority = job_idle
        self._job_pool: ThreadPoolExecutor | None = None
        self._job_idle: queue.SimpleQueue[Any] | None = None
        self._job_gate: PriorityGate | None = None
        if job_workers:
            self._job_pool = ThreadPoolExecutor(
                max_workers=job_workers, thread_name_prefix="rapidocr-job", initializer=self._job_thread
            )
            self._job_idle = queue.SimpleQueue()
            self._job_gate = PriorityGate(job_workers)

    def _job_thread(self) -> None:
        """Each job thread, first: named (`top -H`, `ps -L` show it) and moved to nice 19. The instance is
        created and loaded on these threads, so the threads ONNX Runtime starts for it inherit both."""
        with suppress(OSError):
            Path("/proc/thread-self/comm").write_text(JOB_THREAD_NAME)
        if not self._job_idle_priority:
            return
        why = to_job_priority()
        self.job_priority = f"normal ({why})" if why else self.job_priority or JOB_PRIORITY

    def _new_instance(self) -> Any:
        try:
            from rapidocr import RapidOCR
        except ImportError as err:
            raise EngineError("rapidocr is not installed: install ocr-app[cpu]") from err
        _quiet_rapidocr_logger()
        _sessions_without_spinning()
        params = {
            "Global.use_cls": self.use_cls,
            # Each line's words located (from the recogniser's own alignment of characters to the crop):
            # the words' boxes in JSON, hOCR, ALTO and the PDF's text layer.
            "Global.return_word_box": True,
            "Global.log_level": "error",
            "EngineConfig.onnxruntime.intra_op_num_threads": self.threads,
            "EngineConfig.onnxruntime.inter_op_num_threads": 1,
            "Det.limit_type": self.det_limit[0],
            "Det.limit_side_len": self.det_limit[1],
        }
        if self.model_dir is not None:
            files = self.model_files()
            params |= {"Det.model_path": str(files["det"]), "Rec.model_path": str(files["rec"])}
            params["Rec.rec_keys_path"] = str(files["rec_keys"])
            if "cls" in files:
                params["Cls.model_path"] = str(files["cls"])
        return RapidOCR(params=params)

    def model_files(self) -> dict[str, Path]:
        """The revision's files by role, as far as they can be checked without loading them (EngineError).
        Checked once (it reads rec.onnx whole): preflight and every worker's instance share the answer."""
        if self._files is None:
            assert self.model_dir is not None
            self._files = check_revision(self.model_dir, self.use_cls)
        return self._files

    async def preflight(self) -> list[str]:
        if self.model_dir is None:
            return [f"model: {MODEL_NAME}, the rapidocr wheel's own"]
        files = await asyncio.to_thread(self.model_files)
        keys = len(files["rec_keys"].read_text(encoding="utf-8").splitlines())
        names = ", ".join(sorted(p.name for p in files.values()))
        return [f"model: {self.model} from {self.model_dir}: {names} ({keys} dictionary entries)"]

    async def load(self) -> None:
        pools = [(self._pool, self._idle, self.workers)]
        if self._job_pool is not None:
            assert self._job_idle is not None
            pools.append((self._job_pool, self._job_idle, self.job_workers))
        for pool, idle, n in pools:
            for _ in range(n):
                idle.put(await self._load_instance(pool))
        if self.job_workers and self._job_idle_priority and self.job_priority != JOB_PRIORITY:
            log.warning("job pages run at normal CPU priority: %s", self.job_priority)
        log.info(
            "rapidocr engine loaded",
            extra={
                "workers": self.workers,
                "threads": self.threads,
                "job_workers": self.job_workers,
                "job_priority": self.job_priority,
                "use_cls": self.use_cls,
                "orientation": self.orientation,
                "model": self.model,
            },
        )

    async def _load_instance(self, pool: ThreadPoolExecutor) -> Any:
        loop = asyncio.get_running_loop()
        inst = await loop.run_in_executor(pool, self._new_instance)
        # RapidOCR loads its ONNX sessions lazily: warm each instance so the first request
        # does not pay for it (and a broken model fails here, not under traffic).
        try:
            await loop.run_in_executor(pool, inst, np.full((64, 256, 3), 255, np.uint8))
            # A blank page never reaches the recognizer, nor the classifier: load them now.
            await loop.run_in_executor(pool, inst._load_rec_model)
            if self.orientation:
                await loop.run_in_executor(pool, inst._load_cls_model)
        except Exception as err:
            where = self.model_dir or "the rapidocr wheel"
            raise EngineError(f"the models of {where} do not load: {type(err).__name__}: {err}") from err
        return inst

    def _run(self, image: Image.Image | np.ndarray, idle: queue.SimpleQueue[Any] | None = None) -> EnginePage:
        """One page (an RGB image, or OpenCV's BGR array, RapidOCR's own input: no conversion) on an
        instance from `idle` (the interactive ones by default), on the calling thread."""
        idle = self._idle if idle is None else idle
        size = image.size if isinstance(image, Image.Image) else (image.shape[1], image.shape[0])
        inst = idle.get()
        try:
            out, rotation = oriented(inst, image, turn=self.orientation)
        finally:
            idle.put(inst)
            self._page_done()
        if rotation:
            with self._count_lock:
                self.rotations[rotation] += 1
            width, height = size[::-1] if rotation in (90, 270) else size
            page = _to_page(out, width, height, deskew=False)  # turned: as before
            items: list[EngineLine | EngineBlock | EngineWord | EngineCell] = [*page.lines, *page.blocks]
            items += [w for line in page.lines for w in line.words or ()]
            items += [c for b in page.blocks if b.table is not None for c in b.table.cells]
            for item in items:
                item.bbox = unrotate(item.bbox, rotation)
            page.rotation = rotation
            return page
        with self._count_lock:
            self.rotations[0] += 1
        return _to_page(out, *size)

    async def recognize(
        self,
        pages: list[PageImage],
        max_tokens: int | None = None,
        background: bool = False,
        stream: TextSink | None = None,
    ) -> list[EnginePage]:
        loop = asyncio.get_running_loop()
        gate, pool, idle = self._gate, self._pool, self._idle
        if background and self._job_pool is not None:
            assert self._job_gate is not None
            assert self._job_idle is not None
            gate, pool, idle = self._job_gate, self._job_pool, self._job_idle
        release = gate.release
        results: list[EnginePage] = []
        # One page at a time per request: the workers are shared, so concurrency comes from requests. The
        # gate hands a free worker to an interactive page before a job page (a FIFO pool would not).
        for page in pages:
            await gate.acquire(background)
            done = pool.submit(self._run, page.pixels, idle)
            # Released when the worker is free again: a cancelled request's page still runs to its end.
            done.add_done_callback(lambda _: _call_soon(loop, release))
            results.append(await asyncio.wrap_future(done))
        return results

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._job_pool is not None:
            self._job_pool.shutdown(wait=False, cancel_futures=True)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[[], object]) -> None:
    with suppress(RuntimeError):  # the loop closed meanwhile (shutdown): nothing waits any more
        loop.call_soon_threadsafe(fn)


def _to_page(out: Any, width: int, height: int, deskew: bool = True) -> EnginePage:
    """The page from RapidOCR's output: its lines in reading order, grouped in blocks (page_layout), on a
    page `width` by `height` pixels. A page tilted by a small angle (page_skew, up to SKEW_MAX degrees) is
    laid out upright with `deskew` (not on a page the orientation step turned), its boxes given as sent."""
    if out is None or getattr(out, "boxes", None) is None or not getattr(out, "txts", None):
        return EnginePage(lines=[])
    polygons = np.asarray(out.boxes, dtype=np.float64)
    boxes: list[Box] = []  # in pixels, clipped to the page
    for poly in polygons:
        xs, ys = poly[:, 0], poly[:, 1]
        x0, x1 = max(0.0, xs.min()), min(float(width), xs.max())
        y0, y1 = max(0.0, ys.min()), min(float(height), ys.max())
        boxes.append((x0, y0, max(x1, x0 + 1e-3), max(y1, y0 + 1e-3)))

    def normalised(box: Box) -> Box:
        x0, y0, x1, y1 = box
        return (round(x0 / width, 5), round(y0 / height, 5), round(x1 / width, 5), round(y1 / height, 5))

    # In pixels: the layout's thresholds are in line heights on both axes, which a page normalised to
    # 0-1 would stretch by its aspect ratio (a wide page's columns would look too narrow to be columns).
    angle = page_skew(polygons) if deskew else 0.0
    upright = deskewed(polygons, angle, (width / 2, height / 2)) if angle else None
    layout = page_layout(boxes, float(height), upright)
    lines: list[EngineLine] = []
    blocks: list[EngineBlock] = []
    located = _words(out, width, height)
    at: dict[int, int] = {}  # a detected line's index -> its place in the reading order
    for block in layout:  # the lines of one block after another: the reading order
        first = len(lines)
        for i in block.lines:
            at[i] = len(lines)
            score = round(min(1.0, max(0.0, float(out.scores[i]))), 4)
            line = EngineLine(text=out.txts[i], bbox=normalised(boxes[i]), confidence=score, words=located[i])
            lines.append(line)
        table = None
        if block.table is not None:
            cells = [
                EngineCell(
                    c.row, c.column, c.row_span, c.column_span, [at[i] for i in c.lines], normalised(c.bbox)
                )
                for c in block.table.cells
            ]
            table = EngineTable(block.table.rows, block.table.columns, cells)
        blocks.append(EngineBlock(block.type, normalised(block.bbox), list(range(first, len(lines))), table))
    return EnginePage(lines=lines, blocks=blocks)


def _words(out: Any, width: int, height: int) -> list[list[EngineWord] | None]:
    """Each line's words as RapidOCR located them (word_results: per line, (text, score, quadrilateral)),
    normalised to the page; None for a line whose words do not spell it (_spells). RapidOCR leaves a
    line without located words out of word_results, so a list not one-to-one with the lines is not used."""
    n = len(out.txts)
    results = getattr(out, "word_results", None) or ()
    if len(results) != n:
        return [None] * n
    found: list[list[EngineWord] | None] = []
    for txt, words in zip(out.txts, results, strict=True):
        try:
            items = [
                (str(t), float(score), np.asarray(quad, dtype=np.float64).reshape(-1, 2))
                for t, score, quad in words
            ]
        except (TypeError, ValueError):
            found.append(None)
            continue
        if not items or not _spells([t for t, _, _ in items], str(txt)):
            found.append(None)
            continue
        line = []
        for t, score, quad in items:
            x0, y0 = max(0.0, quad[:, 0].min()) / width, max(0.0, quad[:, 1].min()) / height
            x1, y1 = (
                min(float(width), quad[:, 0].max()) / width,
                min(float(height), quad[:, 1].max()) / height,
            )
            bbox = (
                round(float(x0), 5),
                round(float(y0), 5),
                round(float(max(x1, x0)), 5),
                round(float(max(y1, y0)), 5),
            )
            line.append(EngineWord(t, bbox, round(min(1.0, max(0.0, score)), 4)))
        found.append(line)
    return found


def _spells(words: list[str], text: str) -> bool:
    """Whether the words, in order, are the text's: joined by a space where the text has one between them
    (runs of whitespace as one), directly elsewhere (Chinese, Japanese). A word that runs over one of the
    text's spaces (RapidOCR groups some accented Latin words together) does not."""
    want = " ".join(text.split())
    got = ""
    for word in words:
        if got and want[len(got) : len(got) + 1] == " ":
            got += " "
        got += word
        if not want.startswith(got):
            return False
    return got == want


def _quiet_rapidocr_logger() -> None:
    # RapidOCR installs its own coloured stderr handler; route its records through ours instead.
    lg = logging.getLogger("RapidOCR")
    for h in list(lg.handlers):
        lg.removeHandler(h)
    lg.propagate = True
    lg.setLevel(logging.ERROR)  # it warns on every blank page
