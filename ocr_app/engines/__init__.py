"""Engine selection: `auto` takes the GPU engine where a GPU, vLLM and a model are present."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from ..config import Settings
from .base import Engine, EngineError

log = logging.getLogger("ocr_app.engines")


def _cuda_gpu_present() -> bool:
    # The driver's device nodes: cheap, and no CUDA import in the CPU build.
    return Path("/dev/nvidia0").exists() or Path("/proc/driver/nvidia/gpus").is_dir()


def resolve_engine_name(settings: Settings) -> str:
    if settings.engine != "auto":
        return settings.engine
    if (
        _cuda_gpu_present()
        and importlib.util.find_spec("vllm") is not None
        and settings.model_path is not None
        and settings.model_path.is_dir()
    ):
        return "vllm"
    return "rapidocr"


def create_engine(settings: Settings) -> Engine:
    name = resolve_engine_name(settings)
    if name == "rapidocr":
        return _rapidocr(settings, settings.model_path)
    if name == "vllm":
        from .vllm.engine import VllmEngine

        return VllmEngine(settings, grounding_detector=_grounding_detector(settings))
    raise EngineError(f"unknown engine {name!r}")


def _rapidocr(settings: Settings, model_dir: Path | None = None, job_pages: bool = True) -> Engine:
    from .rapidocr.engine import RapidOcrEngine

    job_workers = settings.rapidocr_job_workers
    if job_workers is None:
        job_workers = settings.rapidocr_workers if settings.job_pages_idle else 0
    return RapidOcrEngine(
        job_workers=job_workers if job_pages else 0,
        job_idle=settings.job_idle_priority,
        workers=settings.rapidocr_workers,
        threads=settings.rapidocr_threads,
        use_cls=settings.rapidocr_use_cls,
        orientation=settings.rapidocr_orientation,
        det_limit_type=settings.rapidocr_det_limit_type,
        det_limit_side=settings.rapidocr_det_limit_side,
        model_dir=model_dir,
    )


def _grounding_detector(settings: Settings) -> Engine | None:
    """The CPU engine that boxes the VLM's lines: on by default where ocr-app[cpu] is installed."""
    if not settings.vllm_grounding:
        return None
    missing = [m for m in ("rapidocr", "onnxruntime", "rapidfuzz") if importlib.util.find_spec(m) is None]
    if missing:
        log.warning("grounding is off (lines get bbox null): %s not installed", ", ".join(missing))
        return None
    # model_path is the VLM's there: grounding boxes with the wheel's own models, a job page's lines as any.
    return _rapidocr(settings, job_pages=False)
