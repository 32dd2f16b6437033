"""The vLLM engine's tests: the real app with `engine: vllm` on vLLM's CPU build and a tiny checkpoint.

Run by `make test-vllm` in the venv tests/vllm/venv.py builds, with the checkout and this directory
on PYTHONPATH (this directory for sitecustomize.py, the test-only workarounds). They fail, never
skip, where vLLM is missing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

import pytest

from ..server import Server
from . import tiny_model

HERE = Path(__file__).resolve().parent


class VllmServer(Server):
    # The test venv holds the app's dependencies, not the app: run it from the checkout.
    command = (sys.executable, "-m", "ocr_app.cli")

    def __init__(self, workdir: Path, env: dict[str, str], **settings):
        super().__init__(workdir, **settings)
        self.env = env

    def start(self, wait_ready: bool = True, timeout: float = 900, env: dict | None = None) -> VllmServer:
        try:
            return super().start(wait_ready, timeout, {**self.env, **(env or {})})
        except BaseException:
            self.stop(signal.SIGKILL)
            raise

    def _descendants(self) -> list:
        import psutil

        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def engine_core_pids(self) -> list[int]:
        """vLLM's engine core process(es) under this server (it names itself VLLM::EngineCore)."""
        return [p.pid for p in self._descendants() if "EngineCore" in " ".join(p.cmdline())]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Stop the app; then kill whatever of vLLM's processes outlived it."""
        import psutil

        rest = self._descendants() if self.proc is not None else []
        code = super().stop(sig, timeout)
        for p in rest:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        return code


@pytest.fixture(scope="session")
def vllm_env(tmp_path_factory) -> dict[str, str]:
    """What vLLM on CPU needs from the environment, every cache in a directory the tests own."""
    import vllm  # noqa: F401 - fails here, loudly, in a venv without it

    root = tmp_path_factory.mktemp("vllm-home")
    checkout = str(HERE.parents[1])
    path = [str(HERE), checkout, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(path)),
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the default takes a large share of the host's memory
        "VLLM_CACHE_ROOT": str(root / "cache"),
        "VLLM_RPC_BASE_PATH": str(root),
        "TMPDIR": str(root),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """The tiny checkpoint, fitted once per recipe (tiny_model.cached), a copy for each session."""
    return tiny_model.cached(tmp_path_factory.mktemp("model") / "tiny-lightonocr")


def vllm_settings(model: Path, **overrides) -> dict:
    """The test servers' settings: the tiny model, eager mode (torch.compile takes minutes on CPU)."""
    return {
        "engine": "vllm",
        "model_path": str(model),
        "vllm_max_model_len": 4096,
        "vllm_max_num_seqs": 8,
        "vllm_max_tokens": 64,
        "vllm_max_tokens_cap": 512,
        "vllm_enforce_eager": True,
        "vllm_warmup_check_text": False,  # it reads every page as one of tiny_model.VARIANTS
        "rapidocr_workers": 1,
        "rapidocr_threads": 1,
        "max_concurrency": 4,
        "max_queue": 8,
        "request_timeout_s": 300,
        **overrides,
    }


@pytest.fixture(scope="session")
def server(tmp_path_factory, tiny_checkpoint, vllm_env) -> VllmServer:
    """The app with engine vllm and grounding on, shared by the tests that need no special settings."""
    srv = VllmServer(tmp_path_factory.mktemp("server"), vllm_env, **vllm_settings(tiny_checkpoint)).start()
    yield srv
    assert srv.stop() == 0, srv.logs()[-3000:]
