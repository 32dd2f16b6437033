"""RapidOCR engine: PP-OCRv6 (det + rec) ONNX models shipped inside the rapidocr wheel, on the CPU.

A fixed pool of engine instances, each used by one worker thread at a time, bounds CPU and memory
whatever the request concurrency. ONNX Runtime releases the GIL, so the event loop stays free.
"""

from __future__ import annotations

import asyncio
import logging
import queue
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version

import numpy as np

from ..documents import PageImage
from .base import Engine, EngineError, EngineLine, EnginePage

log = logging.getLogger("ocr_app.engines.rapidocr")


def reading_order(boxes: list[tuple[float, float, float, float]]) -> list[int]:
    """Indices of boxes in reading order: rows top to bottom, left to right within a row.

    A box joins the current row when its vertical centre lies within the row's first box, so
    slightly skewed lines of one row stay together.
    """
    order = sorted(range(len(boxes)), key=lambda i: (boxes[i][1], boxes[i][0]))
    rows: list[list[int]] = []
    for i in order:
        centre = (boxes[i][1] + boxes[i][3]) / 2
        if rows:
            anchor = boxes[rows[-1][0]]
            if anchor[1] <= centre <= anchor[3]:
                rows[-1].append(i)
                continue
        rows.append([i])
    return [i for row in rows for i in sorted(row, key=lambda j: boxes[j][0])]


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
    ):
        self.workers = workers
        self.threads = threads
        self.use_cls = use_cls
        self.det_limit = (det_limit_type, det_limit_side)
        self.model = f"PP-OCRv6-small (rapidocr {version('rapidocr')})"
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rapidocr")

    def _new_instance(self):
        try:
            from rapidocr import RapidOCR
        except ImportError as err:
            raise EngineError("rapidocr is not installed: install ocr-app[cpu]") from err
        _quiet_rapidocr_logger()
        return RapidOCR(
            params={
                "Global.use_cls": self.use_cls,
                "Global.log_level": "error",
                "EngineConfig.onnxruntime.intra_op_num_threads": self.threads,
                "EngineConfig.onnxruntime.inter_op_num_threads": 1,
                "Det.limit_type": self.det_limit[0],
                "Det.limit_side_len": self.det_limit[1],
            }
        )

    async def load(self) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(self.workers):
            inst = await loop.run_in_executor(self._pool, self._new_instance)
            # RapidOCR loads its ONNX sessions lazily: warm each instance so the first request
            # does not pay for it (and a broken model fails here, not under traffic).
            await loop.run_in_executor(self._pool, inst, np.full((64, 256, 3), 255, np.uint8))
            self._idle.put(inst)
        log.info(
            "rapidocr engine loaded",
            extra={"workers": self.workers, "threads": self.threads, "use_cls": self.use_cls},
        )

    def _run(self, image) -> EnginePage:
        inst = self._idle.get()
        try:
            out = inst(image)
        finally:
            self._idle.put(inst)
            self._page_done()
        return _to_page(out, image.width, image.height)

    async def recognize(self, pages: list[PageImage], max_tokens: int | None = None) -> list[EnginePage]:
        loop = asyncio.get_running_loop()
        results = []
        # One page at a time per request: the pool is shared, so concurrency comes from requests.
        for page in pages:
            results.append(await loop.run_in_executor(self._pool, self._run, page.image))
        return results

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _to_page(out, width: int, height: int) -> EnginePage:
    if out is None or getattr(out, "boxes", None) is None or not getattr(out, "txts", None):
        return EnginePage(lines=[])
    boxes = []
    for poly in np.asarray(out.boxes, dtype=np.float64):
        xs, ys = poly[:, 0], poly[:, 1]
        x0, x1 = max(0.0, xs.min() / width), min(1.0, xs.max() / width)
        y0, y1 = max(0.0, ys.min() / height), min(1.0, ys.max() / height)
        boxes.append((x0, y0, max(x1, x0 + 1e-6), max(y1, y0 + 1e-6)))
    lines = [
        EngineLine(
            text=out.txts[i],
            bbox=tuple(round(v, 5) for v in boxes[i]),
            confidence=round(min(1.0, max(0.0, float(out.scores[i]))), 4),
        )
        for i in reading_order(boxes)
    ]
    return EnginePage(lines=lines)


def _quiet_rapidocr_logger() -> None:
    # RapidOCR installs its own coloured stderr handler; route its records through ours instead.
    lg = logging.getLogger("RapidOCR")
    for h in list(lg.handlers):
        lg.removeHandler(h)
    lg.propagate = True
    lg.setLevel(logging.ERROR)  # it warns on every blank page
