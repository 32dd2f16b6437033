"""The GPU an instance uses and what its driver says of it, through NVML (no CUDA context): its name and
memory, and the driver/library mismatch that only a reboot mends."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..base import EngineError


def device_from_env() -> str:
    """What /healthz says while the model loads; load() confirms it from vLLM's platform."""
    if not (Path("/dev/nvidia0").exists() or Path("/proc/driver/nvidia/gpus").is_dir()):
        return "cpu"
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return f"cuda:{first or 0}"


# NVML_ERROR_LIB_RM_VERSION_MISMATCH: the user-space libraries and the loaded kernel module differ.
NVML_LIB_RM_VERSION_MISMATCH = 18


def is_nvml_mismatch(err: Exception) -> bool:
    code = getattr(err, "value", None)
    return code == NVML_LIB_RM_VERSION_MISMATCH or "version mismatch" in str(err).lower()


def nvml_problem(err: Exception) -> str:
    """What /healthz says about an NVML error; the mismatch with what fixes it (nothing but a reboot does)."""
    if is_nvml_mismatch(err):
        return (
            f"NVIDIA driver/library version mismatch (NVML: {err}): the driver's libraries were upgraded "
            "under the loaded kernel module; CUDA fails until the host is rebooted (drain it first)"
        )
    return f"NVML cannot read the GPU: {err}"


def nvml_memory(pynvml: Any, index: int) -> tuple[str, int, int]:
    """(name, free bytes, total bytes) of GPU `index` (physical) through NVML: no CUDA context."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        if is_nvml_mismatch(err):
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
