"""`ocr-app check` beside a running instance: an engine that claims a device is checked, never loaded twice.

The engine is tests/exclusive_engine.py's stand-in for vllm, which holds its "device" (a file) under an
exclusive lock from load to close, as vLLM holds its share of the GPU: a check that loaded it beside the
running service would fail, as it would on a GPU host.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .server import OCR_APP, Server

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


class ExclusiveServer(Server):
    command = (sys.executable, str(HERE / "exclusive_engine.py"))


@pytest.fixture
def device(tmp_path) -> Path:
    dev = tmp_path / "device0"
    dev.touch()
    return dev


@pytest.fixture
def service(tmp_path, device):
    (tmp_path / "model").mkdir()
    srv = ExclusiveServer(
        tmp_path / "srv", engine="vllm", model_path=str(tmp_path / "model"), vllm_grounding=False
    )
    yield srv
    assert srv.stop() == 0, srv.logs()[-2000:]


def check(srv: Server, device: Path, *flags: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OCR_APP_")}
    return subprocess.run(
        [*srv.command, "check", "--config", str(srv.config_file), *flags],
        capture_output=True,
        text=True,
        timeout=120,
        env=env | {"EXCLUSIVE_DEVICE": str(device)},
    )


def held(device: Path) -> bool:
    """Whether some process holds the device's lock (taken and released at once when free)."""
    with device.open("rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def test_check_beside_a_running_instance_does_not_claim_its_device(service, device):
    assert not held(device)
    service.start(env={"EXCLUSIVE_DEVICE": str(device)})
    assert held(device)

    r = check(service, device)
    assert r.returncode == 0, r.stderr
    assert f"device: {device} present (not claimed)" in r.stdout
    assert "passed its preflight; not loaded" in r.stdout
    assert held(device) and service.health().json()["status"] == "ready"

    r = check(service, device, "--load")  # forcing the full load beside it fails, naming the device
    assert r.returncode == 1
    assert f"device {device} is busy" in r.stderr
    assert held(device) and service.health().json()["status"] == "ready"

    assert service.stop() == 0
    assert not held(device)
    r = check(service, device, "--load")  # a host that serves nothing: load and sample OCR
    assert r.returncode == 0, r.stderr
    assert "passed its self-test" in r.stdout


def test_check_verifies_the_model_against_its_manifest(service, device):
    model = Path(service.config["model_path"])
    (model / "weights.bin").write_bytes(b"\x01" * 1024)
    made = subprocess.run(
        [OCR_APP, "manifest", str(model), "-o", str(model / ".manifest.json")], capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    r = check(service, device)
    assert r.returncode == 0, r.stderr
    assert f"model: {model} matches {model / '.manifest.json'}" in r.stdout

    (model / "weights.bin").write_bytes(b"\x02" * 1024)
    r = check(service, device)
    assert r.returncode == 1
    assert "weights.bin: sha256 mismatch" in r.stderr


def test_gpu_check_fails_loudly_without_a_gpu():
    if Path("/dev/nvidia0").exists():
        pytest.skip("this host has a GPU: run `make gpu-check` itself")
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu-check.py")], capture_output=True, text=True, timeout=120
    )
    assert r.returncode != 0
    assert "gpu-check: FAILED: no NVIDIA GPU on this host" in r.stdout + r.stderr
