"""RapidOCR engine: PP-OCRv6 (det + rec) ONNX models on the CPU, from a model revision directory
(`model_path`, what the ocr_model role installs) or, without one, those shipped inside the rapidocr wheel.

A revision holds det.onnx, rec.onnx, rec_keys.txt (the recogniser's dictionary: one character per line)
and cls.onnx (needed with rapidocr_use_cls; rapidocr_orientation uses the wheel's where a revision has
none); `ocr-app rapidocr-models DIR` writes one from the installed wheel. The wheel's rec model carries
its dictionary inside; a revision's rec.onnx must not (the copy drops it), so that the dictionary loaded
is always the revision's own rec_keys.txt.

A fixed pool of engine instances, each used by one worker thread at a time, bounds CPU and memory
whatever the request concurrency. ONNX Runtime releases the GIL, so the event loop stays free.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import shutil
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path

import numpy as np

from ..documents import PageImage
from .base import Engine, EngineError, EngineLine, EnginePage, model_label

log = logging.getLogger("ocr_app.engines.rapidocr")

MODEL_NAME = "PP-OCRv6-small"
# A revision's files, by role; the wheel's own file of each (rapidocr's default models) is the source of
# `ocr-app rapidocr-models`.
REVISION_FILES = {"det": "det.onnx", "rec": "rec.onnx", "rec_keys": "rec_keys.txt", "cls": "cls.onnx"}
WHEEL_FILES = {
    "det": "PP-OCRv6_det_small.onnx",
    "rec": "PP-OCRv6_rec_small.onnx",
    "cls": "ch_ppocr_mobile_v2.0_cls_mobile.onnx",
}
DICT_KEY = "character"  # the metadata entry in which a rec model carries its dictionary


Box = tuple[float, float, float, float]
Span = tuple[float, float, int]  # x0, x1, lines: an interval of the x-axis that lines cover

# Thresholds, in median line heights (h): the median height of the page's line boxes is its body text
# size whatever the resolution or scan DPI, so these hold from a receipt photo to a 300 DPI magazine page.
# A gutter is at least 0.4 h of blank running the block's full height: magazine gutters are about one em
# (~0.7 h of a detector box, padding included), while inter-word spaces (~0.2 h) do not split a line's box,
# let alone on every line of a block at the same x.
GUTTER_MIN = 0.4
# A column next to a gutter is at least 6 h wide (~14 characters: a detector box's h is ~2.3 characters)
# and holds at least 2 lines: the text columns of a page are 25-40 characters wide, while the narrow side
# of what only looks like columns (a receipt's prices, a table's figures, a form's short labels) is a few
# characters: those stay rows.
COLUMN_MIN_WIDTH = 6.0
COLUMN_MIN_LINES = 2
# Two sides of a gutter whose lines pair up row by row (80 % of them) are a table or a form (label: value)
# unless there are 3 rows or more and both sides' lines fill their column (median line at least 70 % of its
# width), as the lines of text columns set on shared baselines do; a table's cells are ragged. Two rows
# tell nothing: they are read as rows, as before. A table is read by rows.
TABLE_PAIRED = 0.8
TABLE_MIN_ROWS = 3
COLUMN_MIN_FILL = 0.7
# Noise (a speck, a bullet, a vertical rule, a stray character) neither bridges nor makes a gutter: a box
# under 0.6 h wide or 0.4 h tall is left out of the column geometry and follows the side its centre is on.
NOISE_MAX_WIDTH = 0.6
NOISE_MAX_HEIGHT = 0.4
MAX_DEPTH = 64  # cuts within cuts


def reading_order(boxes: list[Box]) -> list[int]:
    """Indices of boxes (x0, y0, x1, y1) in reading order, by layout: a recursive XY-cut over the line boxes.

    A block of lines is cut vertically at a gutter: a blank strip at least GUTTER_MIN wide running the
    block's full height, with a column (COLUMN_MIN_WIDTH wide, COLUMN_MIN_LINES lines) on each side, and
    not between the cells of a table (see table()). The widest such gutter is cut first; the columns are read
    left to right, each recursively. A block without one is cut horizontally into bands (text separated by
    blank space across the block), read top to bottom; consecutive bands that keep a gutter between them
    (a column run; its lines need not be aligned across the gutter) are read as one block, recursively, so
    a full-width title, heading or footer, which crosses the gutter, ends the run and stays where it
    stands. What is left is read as rows (row_order), as before: a single-column page, a receipt's item
    and price, a table's cells come out row by row, left to right, exactly as a plain row sort gives them.

    Each level sorts its boxes by x and by y (numpy): O(n log n) a level, a few levels deep; 2000 lines
    take 3-7 ms (one column ~3, three ~5, a title over two ~7; the row sort alone: 1-2 ms).
    """
    n = len(boxes)
    if n < 2:
        return list(range(n))
    x0s, y0s, x1s, y1s = np.asarray(boxes, dtype=np.float64).reshape(n, 4).T.copy()
    h = float(np.sort(y1s - y0s)[n // 2])
    if not h > 0:
        return row_order(boxes, range(n))
    gutter_min, col_width = GUTTER_MIN * h, COLUMN_MIN_WIDTH * h
    is_solid = (x1s - x0s >= NOISE_MAX_WIDTH * h) & (y1s - y0s >= NOISE_MAX_HEIGHT * h)
    solid = is_solid.tolist()

    def gutters(union: list[Span], lines: bool) -> list[tuple[float, float, Span, Span]]:
        """(width, x, left interval, right interval) of each gutter between the union's intervals, widest
        first; with `lines`, only those with enough lines each side (a run still growing is not counted)."""
        found = [
            (b[0] - a[1], (a[1] + b[0]) / 2, a, b)
            for a, b in itertools.pairwise(union)
            if b[0] - a[1] >= gutter_min
            and a[1] - a[0] >= col_width
            and b[1] - b[0] >= col_width
            and (not lines or (a[2] >= COLUMN_MIN_LINES and b[2] >= COLUMN_MIN_LINES))
        ]
        return sorted(found, reverse=True)

    def column_cut(block: list[int]) -> float | None:
        """The x at which to cut the block into columns, or None."""
        found = gutters(union(block), lines=True)
        if not found:
            return None
        ids = np.asarray(block)
        ids = ids[is_solid[ids]]
        for _, at, a, b in found:
            left = ids[(x0s[ids] >= a[0]) & (x1s[ids] <= a[1])]
            right = ids[(x0s[ids] >= b[0]) & (x1s[ids] <= b[1])]
            if not table(left, a, right, b):
                return at
        return None

    def table(left: np.ndarray, a: Span, right: np.ndarray, b: Span) -> bool:
        """Whether the lines each side of a gutter are a table's cells rather than two columns of text:
        they pair up row by row (TABLE_PAIRED of them) and either are few (under TABLE_MIN_ROWS rows tell
        nothing) or one side's lines are ragged (their median under COLUMN_MIN_FILL of its width).
        Columns set on shared baselines pair up too, but their lines fill them."""
        m = min(len(left), len(right))
        p = left[np.argsort(y0s[left], kind="stable")][:m]
        q = right[np.argsort(y0s[right], kind="stable")][:m]
        overlap = np.minimum(y1s[p], y1s[q]) - np.maximum(y0s[p], y0s[q])
        paired = int(np.count_nonzero(overlap >= 0.5 * np.minimum(y1s[p] - y0s[p], y1s[q] - y0s[q])))
        if paired < TABLE_PAIRED * max(len(left), len(right)):
            return False
        if paired < TABLE_MIN_ROWS:
            return True
        fill = [
            float(np.sort(x1s[side] - x0s[side])[len(side) // 2]) / (span[1] - span[0])
            for side, span in ((left, a), (right, b))
        ]
        return min(fill) < COLUMN_MIN_FILL

    spans = [(b[0], b[2], 1) if ok else None for b, ok in zip(boxes, solid, strict=True)]

    def union(idx: list[int]) -> list[Span]:
        if len(idx) == 1:  # most bands: one line
            return [spans[idx[0]]] if solid[idx[0]] else []
        if len(idx) < 32:
            return _union(sorted([spans[i] for i in idx if solid[i]]))
        # A block: the same with numpy. An interval starts where a span begins right of all before it.
        ids = np.asarray(idx)
        ids = ids[is_solid[ids]]
        if not len(ids):
            return []
        ids = ids[np.argsort(x0s[ids], kind="stable")]
        reach = np.maximum.accumulate(x1s[ids])
        starts = np.flatnonzero(np.r_[True, x0s[ids][1:] > reach[:-1]])
        ends = np.r_[starts[1:], len(ids)]
        return list(
            zip(x0s[ids][starts].tolist(), reach[ends - 1].tolist(), (ends - starts).tolist(), strict=True)
        )

    def bands_of(block: list[int]) -> tuple[list[list[int]], bool]:
        """The block's lines in bands top to bottom (a band ends where a blank strip crosses the whole
        block), and whether each band is one line lying under the one above (no gutter can be there)."""
        ids = np.asarray(block)
        ids = ids[np.argsort(y0s[ids], kind="stable")]
        bottom = np.maximum.accumulate(y1s[ids])
        starts = np.flatnonzero(np.r_[True, y0s[ids][1:] >= bottom[:-1]])
        ends = np.r_[starts[1:], len(ids)]
        first = ids[starts]
        single = (ends - starts == 1) & is_solid[first]
        lo, hi = x0s[first], x1s[first]
        stacked = bool(np.all(single[:-1] & single[1:] & (lo[:-1] <= hi[1:]) & (lo[1:] <= hi[:-1])))
        order = ids.tolist()
        return [order[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)], stacked

    def order(block: list[int], depth: int = 0) -> list[int]:
        if len(block) < 2 or depth > MAX_DEPTH:  # (no real page nests so deep: a guard, read as rows)
            return row_order(boxes, block)
        cut = column_cut(block)
        if cut is not None:
            left = [i for i in block if boxes[i][0] + boxes[i][2] < 2 * cut]
            right = [i for i in block if boxes[i][0] + boxes[i][2] >= 2 * cut]
            return order(left, depth + 1) + order(right, depth + 1)
        bands, all_stacked = bands_of(block)
        if len(bands) == 1 or all_stacked:  # one band, or a line under a line all the way: rows
            return row_order(boxes, block)
        unions = [[spans[b[0]]] if len(b) == 1 and solid[b[0]] else union(b) for b in bands]
        # Two bands each one span, overlapping (a line under a line, the bulk of a page): no gutter between.
        stacked = [
            len(a) == 1 == len(b) and a[0][0] <= b[0][1] and b[0][0] <= a[0][1]
            for a, b in itertools.pairwise(unions)
        ]
        # Runs of bands that keep a gutter (lines not counted yet: a run grows a line a side at a time).
        runs: list[tuple[list[int], int, list[Span]]] = []
        run, count, run_union = list(bands[0]), 1, unions[0]
        for k in range(1, len(bands)):
            band, band_union = bands[k], unions[k]
            if count > 1 and all(any(u[0] <= s[0] and s[1] <= u[1] for u in run_union) for s in band_union):
                run += band  # the band's lines lie within the run's columns: the gutter goes on
                count += 1
                continue
            merged = None
            if count > 1 or not stacked[k - 1]:
                merged = _union(sorted(run_union + band_union))
            if merged is not None and gutters(merged, lines=False):
                run += band
                count, run_union = count + 1, merged
            else:
                runs.append((run, count, run_union))
                run, count, run_union = list(band), 1, band_union
        runs.append((run, count, run_union))
        if len(runs) == 1:  # one run, yet no gutter with enough lines: its bands one by one
            runs = [(band, 1, u) for band, u in zip(bands, unions, strict=True)]
        out: list[int] = []
        rows: list[int] = []  # consecutive bands without a gutter: rows, sorted together
        for run, count, run_union in runs:
            if count == 1 and (len(run_union) < 2 or not gutters(run_union, lines=False)):
                rows += run
            else:
                out += row_order(boxes, rows) + order(run, depth + 1)
                rows = []
        return out + row_order(boxes, rows)

    return order(list(range(n)))


def _union(intervals: list[Span]) -> list[Span]:
    """Overlapping (x0, x1, lines) intervals (sorted by x0) merged, their lines added up."""
    out: list[Span] = []
    for span in intervals:
        if out and span[0] <= out[-1][1]:
            x0, x1, k = out[-1]
            out[-1] = (x0, max(x1, span[1]), k + span[2])
        else:
            out.append(span)
    return out


def row_order(boxes: list[Box], block) -> list[int]:
    """Indices of the block's boxes as rows top to bottom, left to right within a row.

    A box joins the current row when its vertical centre lies within the row's first box, so
    slightly skewed lines of one row stay together.
    """
    order = sorted(block, key=lambda i: (boxes[i][1], boxes[i][0]))
    rows: list[list[int]] = []
    for i in order:
        centre = (boxes[i][1] + boxes[i][3]) / 2
        if rows:
            anchor = boxes[rows[-1][0]]
            if anchor[1] <= centre <= anchor[3]:
                rows[-1].append(i)
                continue
        rows.append([i])
    return [i for row in rows for i in (row if len(row) == 1 else sorted(row, key=lambda j: boxes[j][0]))]


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
    ):
        self.workers = workers
        self.orientation = orientation
        self.rotations = dict.fromkeys(ROTATIONS, 0)  # pages by the rotation applied (see _oriented)
        self.threads = threads
        self.use_cls = use_cls
        self.det_limit = (det_limit_type, det_limit_side)
        self.model_dir: Path | None = None
        label = MODEL_NAME
        if model_dir is not None:
            self.model_dir, label = model_label(model_dir)
        self.model = f"{label} (rapidocr {version('rapidocr')})"
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        self._files: dict[str, Path] | None = None  # model_files(), once checked
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rapidocr")

    def _new_instance(self):
        try:
            from rapidocr import RapidOCR
        except ImportError as err:
            raise EngineError("rapidocr is not installed: install ocr-app[cpu]") from err
        _quiet_rapidocr_logger()
        params = {
            "Global.use_cls": self.use_cls,
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
            self._files = self._check_model_files()
        return self._files

    def _check_model_files(self) -> dict[str, Path]:
        assert self.model_dir is not None
        if not self.model_dir.is_dir():
            raise EngineError(f"model_path {self.model_dir} is not a directory")
        needed = ["det", "rec", "rec_keys"] + (["cls"] if self.use_cls else [])
        files = {k: self.model_dir / REVISION_FILES[k] for k in needed}
        missing = [p.name for p in files.values() if not p.is_file()]
        if missing:
            with_cls = " (rapidocr_use_cls is on)" if "cls.onnx" in missing else ""
            raise EngineError(
                f"model_path {self.model_dir} lacks {', '.join(missing)}{with_cls}: a rapidocr model "
                "revision holds det.onnx, rec.onnx, rec_keys.txt and cls.onnx "
                "(`ocr-app rapidocr-models DIR` writes one)"
            )
        if (self.model_dir / REVISION_FILES["cls"]).is_file():
            files["cls"] = self.model_dir / REVISION_FILES["cls"]
        try:
            if DICT_KEY in onnx_metadata(files["rec"].read_bytes()):
                raise EngineError(
                    f"{files['rec']} carries its own dictionary (ONNX metadata {DICT_KEY!r}), which rapidocr "
                    f"would use instead of {files['rec_keys'].name}: write the revision with `ocr-app "
                    "rapidocr-models`, which drops it"
                )
        except ValueError as err:
            raise EngineError(f"{files['rec']} is not an ONNX model: {err}") from None
        return files

    async def preflight(self) -> list[str]:
        if self.model_dir is None:
            return [f"model: {MODEL_NAME}, the rapidocr wheel's own"]
        files = await asyncio.to_thread(self.model_files)
        keys = len(files["rec_keys"].read_text(encoding="utf-8").splitlines())
        names = ", ".join(sorted(p.name for p in files.values()))
        return [f"model: {self.model} from {self.model_dir}: {names} ({keys} dictionary entries)"]

    async def load(self) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(self.workers):
            inst = await loop.run_in_executor(self._pool, self._new_instance)
            # RapidOCR loads its ONNX sessions lazily: warm each instance so the first request
            # does not pay for it (and a broken model fails here, not under traffic).
            try:
                await loop.run_in_executor(self._pool, inst, np.full((64, 256, 3), 255, np.uint8))
                if self.orientation:  # a blank page never reaches the classifier: load it now
                    await loop.run_in_executor(self._pool, inst._load_cls_model)
            except Exception as err:
                where = self.model_dir or "the rapidocr wheel"
                raise EngineError(f"the models of {where} do not load: {type(err).__name__}: {err}") from err
            self._idle.put(inst)
        log.info(
            "rapidocr engine loaded",
            extra={
                "workers": self.workers,
                "threads": self.threads,
                "use_cls": self.use_cls,
                "orientation": self.orientation,
                "model": self.model,
            },
        )

    def _run(self, image) -> EnginePage:
        inst = self._idle.get()
        try:
            out, rotation = _oriented(inst, image) if self.orientation else (inst(image), 0)
        finally:
            self._idle.put(inst)
            self._page_done()
        if rotation:
            with self._count_lock:
                self.rotations[rotation] += 1
            width, height = (image.height, image.width) if rotation in (90, 270) else image.size
            page = _to_page(out, width, height)
            for line in page.lines:
                line.bbox = _unrotate(line.bbox, rotation)
            page.rotation = rotation
            return page
        with self._count_lock:
            self.rotations[0] += 1
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


# Page orientation. A page turned 90 or 270 degrees has its text lines standing: the detector still finds
# them, as boxes much taller than wide (the long side at least SIDEWAYS_ELONGATION times the short one,
# the ratio at which rapidocr itself stands a crop back up for recognition). When most of the page's
# elongated boxes, weighted by their length, stand, the page is sideways. The text-line angle classifier
# (the cls model: 0 or 180 per line) then tells the way up from a few of the longest lines: on an upright
# or upside-down page, 180 for the page upside down; on a sideways page, from the crops rapidocr turned
# 90 degrees counterclockwise, 180 for a page turned counterclockwise (it needs 90 clockwise), 0 for one
# turned clockwise (270). An upright page costs only the classifier on ORIENT_SAMPLE crops (the detector
# ran anyway and its crops are recognised as they are); a turned page is rotated and run again.
ROTATIONS = (0, 90, 180, 270)
SIDEWAYS_ELONGATION = 1.5
ORIENT_SAMPLE = 6  # one classifier batch
# An upright page is turned over only when the lines sampled say 180 clearly: their scores for 180
# outweigh those for 0 by this share (the classifier misreads some short lines; a wrong flip ruins a page).
FLIP_SHARE = 0.7


def _oriented(inst, image):
    """The RapidOCR output for the page turned upright, and the rotation applied (degrees clockwise)."""
    import cv2
    from rapidocr.ch_ppocr_cls import TextClsOutput
    from rapidocr.main import RapidOCRError
    from rapidocr.utils.output import RapidOCROutput

    ori = inst.load_img(image)
    img, op_record = inst.preprocess_img(ori)
    try:
        crops, det_res = inst.detect_and_crop(img, op_record)
    except RapidOCRError:  # nothing detected: a blank page
        return RapidOCROutput(), 0
    rotation = page_rotation(np.asarray(det_res.boxes, dtype=np.float64), crops, inst._load_cls_model())
    if rotation:
        # cv2's codes turn clockwise (90), 180, counterclockwise (270 clockwise).
        code = {90: cv2.ROTATE_90_CLOCKWISE, 180: cv2.ROTATE_180, 270: cv2.ROTATE_90_COUNTERCLOCKWISE}
        return inst(cv2.rotate(ori, code[rotation])), rotation
    # Upright: the rest of RapidOCR.run_ocr_steps and its output, on the detection already made.
    cls_res, lines = TextClsOutput(), crops
    try:
        if inst.use_cls:
            lines, cls_res = inst.cls_and_rotate(list(crops))
        rec_res = inst.recognize_txt(lines)
    except RapidOCRError:
        return RapidOCROutput(), 0
    return inst.build_final_output(ori, det_res, cls_res, rec_res, crops, op_record), 0


def page_rotation(boxes: np.ndarray, crops: list, classify) -> int:
    """The clockwise rotation (0, 90, 180, 270) that turns the page upright, from its detected text boxes
    (n x 4 x 2 quadrilaterals, clockwise from the top left) and their crops as rapidocr cut them (standing
    ones turned 90 degrees counterclockwise), with `classify` the text-line angle classifier."""
    if not len(boxes):
        return 0
    widths = np.linalg.norm(boxes[:, 1] - boxes[:, 0], axis=1)
    heights = np.linalg.norm(boxes[:, 3] - boxes[:, 0], axis=1)
    standing = heights >= SIDEWAYS_ELONGATION * widths
    lying = widths >= SIDEWAYS_ELONGATION * heights
    sideways = heights[standing].sum() > widths[lying].sum()
    pool = np.flatnonzero(standing if sideways else lying)
    if not len(pool):
        return 0
    sample = pool[np.argsort(-np.maximum(widths, heights)[pool], kind="stable")[:ORIENT_SAMPLE]]
    votes = classify([crops[i] for i in sample]).cls_res
    flipped = sum(score for label, score in votes if "180" in label)
    upright = sum(score for label, score in votes if "180" not in label)
    if sideways:
        return 90 if flipped > upright else 270
    return 180 if flipped > FLIP_SHARE * (flipped + upright) else 0


def _unrotate(bbox, rotation: int):
    """A normalised box on the page turned `rotation` degrees clockwise, back on the page as sent."""
    if bbox is None:
        return None
    u0, v0, u1, v1 = bbox
    if rotation == 90:  # turning clockwise took (x, y) to (1 - y, x)
        box = (v0, 1 - u1, v1, 1 - u0)
    elif rotation == 180:
        box = (1 - u1, 1 - v1, 1 - u0, 1 - v0)
    else:  # 270: (x, y) went to (y, 1 - x)
        box = (1 - v1, u0, 1 - v0, u1)
    return tuple(round(min(1.0, max(0.0, v)), 5) for v in box)


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


# --- model revisions -----------------------------------------------------------------------------------
# An ONNX model is a protobuf ModelProto; its metadata_props (field 14) are StringStringEntryProto
# {key: 1, value: 2}. Reading and dropping one entry needs only the wire format, not the onnx package.
_METADATA_FIELD = 14


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes):
    """(field number, start, end, payload) of each top-level field; payload only for length-delimited ones."""
    pos = 0
    while pos < len(data):
        start = pos
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        payload = None
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            size, pos = _varint(data, pos)
            payload, pos = data[pos : pos + size], pos + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > len(data):
            raise ValueError("truncated field")
        yield number, start, pos, payload


def _entry(payload: bytes) -> tuple[str, str]:
    kv = {n: p.decode("utf-8") for n, _, _, p in _fields(payload) if p is not None}
    return kv.get(1, ""), kv.get(2, "")


def onnx_metadata(model: bytes) -> dict[str, str]:
    return dict(_entry(p) for n, _, _, p in _fields(model) if n == _METADATA_FIELD and p is not None)


def drop_onnx_metadata(model: bytes, key: str) -> bytes:
    out, last = [], 0
    for n, start, end, payload in _fields(model):
        if n == _METADATA_FIELD and payload is not None and _entry(payload)[0] == key:
            out.append(model[last:start])
            last = end
    out.append(model[last:])
    return b"".join(out)


def export_wheel_models(out: Path) -> list[Path]:
    """Write the rapidocr wheel's default models into `out` as a model revision; the files written."""
    import rapidocr

    src = Path(rapidocr.__file__).parent / "models"
    missing = [name for name in WHEEL_FILES.values() if not (src / name).is_file()]
    if missing:
        raise EngineError(f"rapidocr {version('rapidocr')} does not ship {', '.join(missing)} in {src}")
    out.mkdir(parents=True, exist_ok=True)
    rec = (src / WHEEL_FILES["rec"]).read_bytes()
    chars = onnx_metadata(rec).get(DICT_KEY, "").splitlines()
    if not chars:
        raise EngineError(f"{src / WHEEL_FILES['rec']} carries no dictionary (metadata {DICT_KEY!r})")
    keys = "\n".join(chars) + "\n"
    # rapidocr reads the file as bytes split at b"\n": the copy must give back exactly the model's own list.
    if [line.decode("utf-8") for line in keys.encode("utf-8").split(b"\n")[:-1]] != chars:
        raise EngineError(f"the dictionary of {src / WHEEL_FILES['rec']} does not survive one entry per line")
    written = []
    for role, data in (("rec", drop_onnx_metadata(rec, DICT_KEY)), ("rec_keys", keys.encode("utf-8"))):
        (out / REVISION_FILES[role]).write_bytes(data)
        written.append(out / REVISION_FILES[role])
    for role in ("det", "cls"):
        shutil.copyfile(src / WHEEL_FILES[role], out / REVISION_FILES[role])
        written.append(out / REVISION_FILES[role])
    return written
