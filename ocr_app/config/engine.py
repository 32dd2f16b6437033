"""The engine's settings: which engine reads the pages, its models, and how it runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from .base import default_doc


class EngineSettings(BaseModel):
    """The OCR engine and its models: rapidocr on CPUs, vllm (LightOnOCR) on GPUs."""

    # Engine
    engine: Literal["auto", "rapidocr", "vllm"] = Field(
        "auto",
        description="The OCR engine: auto (vllm where a CUDA GPU, vLLM and model_path exist, else "
        "rapidocr), rapidocr or vllm.",
    )
    # The engine's model directory: the VLM for vllm; for rapidocr a revision of det.onnx, rec.onnx,
    # rec_keys.txt, cls.onnx (none: the rapidocr wheel's own models).
    model_path: Path | None = Field(
        None,
        description="The engine's model directory: the VLM's for vllm; for rapidocr a revision holding "
        "det.onnx, rec.onnx, rec_keys.txt and cls.onnx, as `ocr-app rapidocr-models DIR` writes it (none: "
        "the wheel's own models). Behind a `current` symlink the answers' and /healthz's model is "
        "<name>@<revision>.",
    )
    rapidocr_use_cls: bool = Field(
        False,
        description="RapidOCR's text-angle classifier on every line (upside-down lines; about 2x slower).",
    )
    # Turn a page fed sideways or upside down upright before recognition (its text boxes' shape, then the
    # cls model's vote on a few lines); bbox stays on the page as sent.
    rapidocr_orientation: bool = Field(
        True,
        description="Turn a page sent sideways or upside down upright before recognition (the page's "
        "rotation; an upright page costs the angle classifier on its 6 longest lines, a turned one a "
        "second detection).",
    )
    # workers x threads = cores: two threads per instance halve a lone request's latency, and
    # more instances than that only make their threads fight over the cores.
    rapidocr_threads: int = Field(
        default_factory=lambda: min(2, os.cpu_count() or 1),
        ge=1,
        le=64,
        description="ONNX Runtime threads per RapidOCR instance (workers x threads = cores).",
        json_schema_extra=default_doc("2, or 1 on a 1-CPU host"),
    )
    rapidocr_workers: int = Field(
        default_factory=lambda: max(1, (os.cpu_count() or 1) // 2),
        ge=1,
        le=64,
        description="RapidOCR engine instances, each reading one page at a time.",
        json_schema_extra=default_doc("CPUs / 2, at least 1"),
    )
    # Engine instances of their own for bulk-job pages, whose threads run at nice 19: the kernel gives them
    # next to no CPU time an interactive page wants, so a request that arrives while a job page runs is not
    # slowed by it (a CPU page cannot be stopped, only out-prioritised). Each costs an instance's memory
    # (~250 MB). 0: job pages take turns on the interactive workers (an interactive page then waits for the
    # job page running). None: rapidocr_workers where a job database is configured and job_idle_priority is
    # on (job pages alone fill the CPU), else 0.
    rapidocr_job_workers: int | None = Field(
        None,
        ge=0,
        le=64,
        description="RapidOCR instances for bulk-job pages, their threads at nice 19 (~250 MB each); 0: job "
        "pages take turns on the workers, an interactive page then waits for the job page running.",
        json_schema_extra=default_doc("rapidocr_workers with a job database and job_idle_priority, else 0"),
    )
    # RapidOCR's default ("min", 736) upscales a 1400x200 strip to 5000x736 before detection:
    # 25x slower at equal accuracy on our documents. "max" detects pages at their own size.
    rapidocr_det_limit_type: Literal["max", "min"] = Field(
        "max",
        description="The text detector's size limit applies to the page's longer side (max: pages at their "
        "own size) or its shorter one (min, RapidOCR's own default, upscales strips many times over).",
    )
    rapidocr_det_limit_side: int = Field(
        1536,
        ge=32,
        le=4096,
        description="The text detector's size limit in pixels (rapidocr_det_limit_type).",
    )

    # The vllm engine: LightOnOCR-2-1B in-process (vLLM AsyncLLM). Defaults are the model card's.
    vllm_dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="The dtype vLLM runs the model in."
    )
    # Context: a 1540x1540 page is ~3k image tokens, plus the answer (vllm_max_tokens_cap).
    vllm_max_model_len: int = Field(
        8192,
        ge=1024,
        le=65536,
        description="Context per page in tokens: it must hold a 1540x1540 page (3100 tokens) plus "
        "vllm_max_tokens_cap.",
    )
    vllm_max_num_seqs: int = Field(
        64,
        ge=1,
        le=4096,
        description="Pages decoded together (the batch); also max_concurrency's default on vllm.",
    )
    vllm_gpu_memory_utilization: float = Field(
        0.85, gt=0.0, le=1.0, description="Share of the GPU's memory vLLM takes (weights and KV cache)."
    )
    vllm_enforce_eager: bool = Field(
        False, description="No CUDA graphs or torch.compile: starts faster, runs slower."
    )
    vllm_max_tokens: int = Field(
        4096, ge=1, description="Tokens per page unless a request asks for fewer or more."
    )
    vllm_max_tokens_cap: int = Field(
        4096, ge=1, description="The most tokens a request's max_tokens may ask for."
    )
    vllm_temperature: float = Field(
        0.2, ge=0.0, le=2.0, description="Sampling temperature (the model card's)."
    )
    vllm_top_p: float = Field(0.9, gt=0.0, le=1.0, description="Sampling's top_p (the model card's).")
    # A degenerate page (max_tokens reached, or a repetition loop) is retried once per entry.
    vllm_retry_temperatures: list[float] = Field(
        default_factory=lambda: [0.5, 0.8],
        max_length=8,
        description="A degenerate page (max_tokens reached, or a repetition loop) is retried once per "
        "entry, at that temperature (0 to 2); empty: no retry.",
    )
    # A repetition loop: an n-gram of at most loop_max_ngram tokens repeated at least loop_min_repeats
    # times in a row, covering at least loop_min_tokens tokens.
    vllm_loop_max_ngram: int = Field(
        64, ge=1, le=1024, description="A repetition loop is an n-gram of at most this many tokens..."
    )
    vllm_loop_min_repeats: int = Field(
        8, ge=2, description="...repeated at least this many times in a row..."
    )
    vllm_loop_min_tokens: int = Field(256, ge=2, description="...over at least this many tokens.")
    # Line boxes from the cpu extra's detector (rapidocr_* settings) aligned to the model's lines.
    vllm_grounding: bool = Field(
        True,
        description="Boxes for the model's lines from the CPU engine's detector (the rapidocr_* settings "
        "size its pool); off where ocr-app[cpu] is not installed.",
    )
    # The warm-up must read the built-in sample back (false for models that cannot, e.g. test ones).
    vllm_warmup_check_text: bool = Field(
        True,
        description="The warm-up generation must read the built-in sample's text back (false for models "
        "that cannot, e.g. test ones).",
    )
