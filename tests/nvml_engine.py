"""`ocr-app` whose engine is the vllm engine on a GPU that a test can make NVML refuse; for tests only.

Run as `python tests/nvml_engine.py <ocr-app arguments>` with `engine: rapidocr` in the config and env
NVML_CONTROL naming a directory. The class behind `engine: rapidocr` is replaced, in this process, by the
vllm engine (ocr_app.engines.vllm.engine.VllmEngine) without vLLM: its device lookup (_find_device) and its
NVML reader (device_problem, available_memory_mb) are the app's own; vLLM's platform and the pynvml module
it hands out are stand-ins. While NVML_CONTROL/mismatch exists, NVML answers as it does once the driver's
libraries were upgraded under the loaded kernel module: "Driver/library version mismatch" (error 18).
Every page reads back the self-test text.
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import ocr_app.engines.rapidocr.engine
from ocr_app.cli import main
from ocr_app.engines.base import SELF_TEST_TEXT, Engine, EngineLine, EnginePage
from ocr_app.engines.vllm.device import NVML_LIB_RM_VERSION_MISMATCH
from ocr_app.engines.vllm.engine import VllmEngine


class NVMLError(Exception):
    def __init__(self, value: int):
        self.value = value

    def __str__(self) -> str:  # pynvml's: nvmlErrorString(value)
        mismatch = self.value == NVML_LIB_RM_VERSION_MISMATCH
        return "Driver/library version mismatch" if mismatch else "Unknown Error"


def _memory(handle):
    if (Path(os.environ["NVML_CONTROL"]) / "mismatch").exists():
        raise NVMLError(NVML_LIB_RM_VERSION_MISMATCH)
    return types.SimpleNamespace(free=70 * 2**30, total=80 * 2**30)


pynvml = types.SimpleNamespace(
    NVMLError=NVMLError,
    nvmlInit=lambda: None,
    nvmlShutdown=lambda: None,
    nvmlDeviceGetHandleByIndex=lambda index: index,
    nvmlDeviceGetMemoryInfo=_memory,
)
cuda = types.SimpleNamespace(
    device_type="cuda",
    is_cuda_alike=lambda: True,
    is_cuda=lambda: True,
    device_id_to_physical_device_id=lambda index: index,
)


class NvmlEngine(VllmEngine):
    name = "rapidocr"
    model = "nvml-test"

    def __init__(self, **_settings):  # no model: nothing of vLLM's own loads
        self.device = "cuda:0"
        self.grounder = None
        self._llm = None
        self._watch = None
        self._dead = False
        self._nvml = None
        self._nvml_error = None

    async def load(self) -> None:
        self._vllm = types.SimpleNamespace(current_platform=cuda, import_pynvml=lambda: pynvml)
        self._find_device()

    self_test = Engine.self_test

    async def recognize(self, pages, max_tokens=None, background=False, stream=None):
        out = []
        for _ in pages:
            out.append(EnginePage(lines=[EngineLine(SELF_TEST_TEXT, None, 1.0)]))
            self._page_done()
        return out

    def metrics_collector(self):
        return None


# create_engine imports RapidOcrEngine from this module when it is called: it gets the stand-in.
ocr_app.engines.rapidocr.engine.RapidOcrEngine = NvmlEngine  # type: ignore[misc]

if __name__ == "__main__":
    sys.exit(main())
