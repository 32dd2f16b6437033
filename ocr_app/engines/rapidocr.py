"""RapidOCR engine: PP-OCRv6 (det + rec) ONNX models on the CPU, from a model revision directory
(`model_path`, what the ocr_model role installs) or, without one, those shipped inside the rapidocr wheel.

A revision holds det.onnx, rec.onnx, rec_keys.txt (the recogniser's dictionary: one character per line)
and cls.onnx (needed with rapidocr_use_cls; rapidocr_orientation uses the wheel's where a revision has
none); `ocr-app rapidocr-models DIR` writes one from the installed wheel. The wheel's rec model carries
its dictionary inside; a revision's rec.onnx must not (the copy drops it), so that the dictionary loaded
is always the revision's own rec_keys.txt.

Lines come in reading order and grouped into blocks by ocr_app.layout: a recursive XY-cut over the detected
line boxes, geometry alone (no layout model: a few ms a page, where a detection model would cost about as
much as the page's own text detection).

A fixed pool of engine instances, each used by one worker thread at a time, bounds CPU and memory
whatever the request concurrency. ONNX Runtime releases the GIL, so the event loop stays free. Bulk-job
pages run on instances of their own (`job_workers`) whose threads, ONNX Runtime's included, are at
nice 19: an interactive page never waits for a job page, and takes the CPU from it while both run.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import shutil
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from importlib.metadata import version
from pathlib import Path

import numpy as np
from PIL import Image

from ..documents.image import PageImage
from ..layout import page_layout
from ..sched import JOB_PRIORITY, to_job_priority
from .base import Engine, EngineBlock, EngineError, EngineLine, EnginePage, PriorityGate, model_label

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
JOB_THREAD_NAME = "ocr-job"  # the job threads' name in /proc (ONNX Runtime's among them)


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
        self.rotations = dict.fromkeys(ROTATIONS, 0)  # pages by the rotation applied (see _oriented)
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
        self._idle: queue.SimpleQueue = queue.SimpleQueue()
        self._gate = PriorityGate(workers)  # a page holds it while in the pool: the pool never queues
        # Job pages: instances and threads of their own, or (job_workers 0) the gate's turn after interactive.
        # JOB_PRIORITY, or why the job threads are not at it.
        self.job_priority: str | None = None if job_idle else "normal (job_idle_priority is off)"
        self._job_idle_priority = job_idle
        self._job_pool = self._job_idle = self._job_gate = None
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
        pools = [(self._pool, self._idle, self.workers)]
        if self._job_pool is not None:
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

    async def _load_instance(self, pool: ThreadPoolExecutor):
        loop = asyncio.get_running_loop()
        inst = await loop.run_in_executor(pool, self._new_instance)
        # RapidOCR loads its ONNX sessions lazily: warm each instance so the first request
        # does not pay for it (and a broken model fails here, not under traffic).
        try:
            await loop.run_in_executor(pool, inst, np.full((64, 256, 3), 255, np.uint8))
            if self.orientation:  # a blank page never reaches the classifier: load it now
                await loop.run_in_executor(pool, inst._load_cls_model)
        except Exception as err:
            where = self.model_dir or "the rapidocr wheel"
            raise EngineError(f"the models of {where} do not load: {type(err).__name__}: {err}") from err
        return inst

    def _run(self, image, idle: queue.SimpleQueue | None = None) -> EnginePage:
        """One page (an RGB image, or OpenCV's BGR array, RapidOCR's own input: no conversion) on an
        instance from `idle` (the interactive ones by default), on the calling thread."""
        idle = self._idle if idle is None else idle
        size = image.size if isinstance(image, Image.Image) else (image.shape[1], image.shape[0])
        inst = idle.get()
        try:
            out, rotation = _oriented(inst, image) if self.orientation else (inst(image), 0)
        finally:
            idle.put(inst)
            self._page_done()
        if rotation:
            with self._count_lock:
                self.rotations[rotation] += 1
            width, height = size[::-1] if rotation in (90, 270) else size
            page = _to_page(out, width, height)
            for item in (*page.lines, *page.blocks):
                item.bbox = _unrotate(item.bbox, rotation)
            page.rotation = rotation
            return page
        with self._count_lock:
            self.rotations[0] += 1
        return _to_page(out, *size)

    async def recognize(
        self, pages: list[PageImage], max_tokens: int | None = None, background: bool = False
    ) -> list[EnginePage]:
        loop = asyncio.get_running_loop()
        gate, pool, idle = self._gate, self._pool, self._idle
        if background and self._job_pool is not None:
            gate, pool, idle = self._job_gate, self._job_pool, self._job_idle
        results = []
        # One page at a time per request: the workers are shared, so concurrency comes from requests. The
        # gate hands a free worker to an interactive page before a job page (a FIFO pool would not).
        for page in pages:
            await gate.acquire(background)
            done = pool.submit(self._run, page.pixels, idle)
            # Released when the worker is free again: a cancelled request's page still runs to its end.
            done.add_done_callback(lambda _, gate=gate: _call_soon(loop, gate.release))
            results.append(await asyncio.wrap_future(done))
        return results

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._job_pool is not None:
            self._job_pool.shutdown(wait=False, cancel_futures=True)


def _call_soon(loop: asyncio.AbstractEventLoop, fn) -> None:
    with suppress(RuntimeError):  # the loop closed meanwhile (shutdown): nothing waits any more
        loop.call_soon_threadsafe(fn)


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
    boxes = []  # in pixels, clipped to the page
    for poly in np.asarray(out.boxes, dtype=np.float64):
        xs, ys = poly[:, 0], poly[:, 1]
        x0, x1 = max(0.0, xs.min()), min(float(width), xs.max())
        y0, y1 = max(0.0, ys.min()), min(float(height), ys.max())
        boxes.append((x0, y0, max(x1, x0 + 1e-3), max(y1, y0 + 1e-3)))

    def normalised(box) -> tuple[float, float, float, float]:
        x0, y0, x1, y1 = box
        return (round(x0 / width, 5), round(y0 / height, 5), round(x1 / width, 5), round(y1 / height, 5))

    # In pixels: the layout's thresholds are in line heights on both axes, which a page normalised to
    # 0-1 would stretch by its aspect ratio (a wide page's columns would look too narrow to be columns).
    layout = page_layout(boxes, float(height))
    lines, blocks = [], []
    for block in layout:  # the lines of one block after another: the reading order
        first = len(lines)
        for i in block.lines:
            score = round(min(1.0, max(0.0, float(out.scores[i]))), 4)
            lines.append(EngineLine(text=out.txts[i], bbox=normalised(boxes[i]), confidence=score))
        blocks.append(EngineBlock(block.type, normalised(block.bbox), list(range(first, len(lines)))))
    return EnginePage(lines=lines, blocks=blocks)


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
