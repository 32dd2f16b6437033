"""/healthz names a driver/library version mismatch: NVML refusing the GPU (its libraries upgraded under the
loaded kernel module) takes the instance out, 503 with the reason and what fixes it, and it comes back by
itself once NVML answers again (after the reboot). The real app over real HTTP; the engine is the vllm
engine's own NVML reader on tests/nvml_engine.py's stand-in NVML."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .server import Server
from .test_health import poll_health, ready

HERE = Path(__file__).parent


class NvmlServer(Server):
    command = (sys.executable, str(HERE / "nvml_engine.py"))


@pytest.fixture(scope="module")
def control(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("nvml-control")


@pytest.fixture(scope="module")
def srv(tmp_path_factory, control):
    s = NvmlServer(tmp_path_factory.mktemp("nvml"), engine="rapidocr")
    s.start(env={"NVML_CONTROL": str(control)})
    yield s
    assert s.stop() == 0


def test_driver_library_mismatch_takes_the_instance_out_with_the_reason(srv, control):
    r = poll_health(srv, ready)
    assert r.json()["device"] == "cuda:0"
    assert r.json()["available_memory_mb"] == 70 * 1024  # NVML's answer, read through the same handle
    (control / "mismatch").touch()
    r = poll_health(srv, lambda r: r.status_code == 503, timeout=10)
    body = r.json()
    assert body["status"] == "degraded"
    assert "NVIDIA driver/library version mismatch (NVML: Driver/library version mismatch)" in body["reason"]
    assert "rebooted" in body["reason"]
    (control / "mismatch").unlink()
    poll_health(srv, ready, timeout=10)
