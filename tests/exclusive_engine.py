"""`ocr-app` with a stand-in for the vllm engine that claims its device exclusively; for tests only.

Run as `python tests/exclusive_engine.py <ocr-app arguments>` with `engine: vllm` in the config and env
EXCLUSIVE_DEVICE naming a file: the "device". load() takes a non-blocking exclusive flock on it and fails,
naming it, while another process holds it, as vLLM fails to reserve GPU memory a running instance holds;
the lock lasts until close() (or the process ends). Everything else (settings, engine selection, the CLI,
the HTTP app, the engine's `claims_device`) is the app's own: only the class behind `engine: vllm` is
replaced, in this process, so nothing of it can reach a release.
"""

from __future__ import annotations

import fcntl
import os
import sys

import ocr_app.engines.vllm.engine
from ocr_app.cli import main
from ocr_app.engines.base import SELF_TEST_TEXT, Engine, EngineError, EngineLine, EnginePage


class ExclusiveEngine(ocr_app.engines.vllm.engine.VllmEngine):
    """VllmEngine's identity and `claims_device`; a lock file instead of vLLM."""

    def __init__(self, settings, grounding_detector=None):
        super().__init__(settings, grounding_detector)
        self.device_file = os.environ["EXCLUSIVE_DEVICE"]
        self.device = f"exclusive:{self.device_file}"
        self._fd: int | None = None

    async def preflight(self) -> list[str]:
        try:
            os.stat(self.device_file)
        except FileNotFoundError:
            raise EngineError(f"device {self.device_file} does not exist") from None
        return [f"device: {self.device_file} present (not claimed)"]

    async def load(self) -> None:
        fd = os.open(self.device_file, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise EngineError(f"device {self.device_file} is busy: another process holds it") from None
        self._fd = fd

    async def self_test(self) -> None:
        await Engine.self_test(self)

    async def recognize(self, pages, max_tokens=None, background=False, stream=None):
        if self._fd is None:
            raise EngineError("not loaded")
        return [EnginePage(lines=[EngineLine(SELF_TEST_TEXT, None, 1.0)]) for _ in pages]

    def healthy(self) -> bool:
        return True

    def available_memory_mb(self) -> int | None:
        return None

    def metrics_collector(self):
        return None

    async def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None


# create_engine imports VllmEngine from this module when it is called: it gets the stand-in.
ocr_app.engines.vllm.engine.VllmEngine = ExclusiveEngine

if __name__ == "__main__":
    sys.exit(main())
