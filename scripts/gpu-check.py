#!/usr/bin/env python3
"""The checks that need a real NVIDIA GPU (`make gpu-check`; never part of `make test`).

Run it on a GPU host with a Python that has the app and its vllm extra, e.g. a release's
(`make gpu-check GPU_PYTHON=/opt/ocr-app/current/bin/python`). It checks:
1. the gpu_metrics collector against the real nvidia-smi: exit 0, one set of metrics per GPU, the count
   and each GPU's total memory as nvidia-smi reports them;
2. the app's GPU probe (the driver's device nodes) and its free-memory reading (NVML, as /healthz
   reports it), against nvidia-smi's;
3. per instance (CUDA_VISIBLE_DEVICES=<index>, as ocr-app@<index>.service sets it), in a child process:
   the device the app reports (cuda:<index>) is the GPU CUDA itself uses (by UUID), and `ocr-app check`'s
   device probe reads it without claiming it.
Without a GPU it says so and exits 2: never a silent pass. Item 3 creates a CUDA context on each GPU in
turn (a few hundred MiB, released on exit): run it on a host whose instances may be busy, not full.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLLECTOR = ROOT / "roles/gpu_metrics/files/usr/local/lib/ocrfleet/gpu-metrics"
MiB = 1024 * 1024
# Memory moves between two readings while instances serve: readings agree within this.
FREE_TOLERANCE_MIB = 512


def smi_gpus(smi: str) -> list[dict]:
    fields = ["index", "uuid", "memory.total", "memory.free"]
    out = subprocess.run(
        [smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [
        dict(zip(fields, (p.strip() for p in line.split(",")), strict=True))
        for line in out.stdout.splitlines()
    ]


def engine_for_probe():
    from ocr_app.config import load_settings
    from ocr_app.engines.vllm.engine import VllmEngine
    from ocr_app.engines.vllm.runtime import import_vllm

    # The probe needs no model: settings that validate, an engine that is never loaded.
    settings = load_settings(
        None, engine="vllm", model_path=tempfile.gettempdir(), auth_disabled=True, vllm_grounding=False
    )
    engine = VllmEngine(settings)
    engine._vllm = import_vllm()
    return engine


def probe() -> int:
    """The child of check 3: what the app reports under this process's CUDA_VISIBLE_DEVICES."""
    import torch

    from ocr_app.engines import _cuda_gpu_present
    from ocr_app.engines.vllm.device import device_from_env

    engine = engine_for_probe()
    before_load = device_from_env()  # what /healthz says while the model loads
    preflight = engine._probe_device()  # ocr-app check's line
    engine._find_device()  # what load() settles on, with its NVML handle
    pynvml, handle = engine._nvml
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    report = {
        "gpu_present": _cuda_gpu_present(),
        "before_load": before_load,
        "device": engine.device,
        "preflight": preflight,
        "free_mib": engine.available_memory_mb(),
        "nvml_uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
        "cuda_uuid": str(torch.cuda.get_device_properties(0).uuid),  # the device CUDA really uses
    }
    print(json.dumps(report))
    return 0


def main() -> int:
    smi = shutil.which("nvidia-smi")
    if smi is None or not Path("/dev/nvidia0").exists():
        print(
            "gpu-check: FAILED: no NVIDIA GPU on this host (nvidia-smi and /dev/nvidia0 needed): nothing was "
            "checked; run it on a GPU host",
            file=sys.stderr,
        )
        return 2
    failures: list[str] = []

    def verdict(ok: bool, what: str) -> None:
        print(f"{'ok' if ok else 'FAILED'}: {what}")
        if not ok:
            failures.append(what)

    gpus = smi_gpus(smi)
    verdict(len(gpus) > 0, f"nvidia-smi lists {len(gpus)} GPU(s)")

    # 1. The collector, as its timer runs it.
    from prometheus_client.parser import text_string_to_metric_families

    with tempfile.TemporaryDirectory() as tmp:
        prom = Path(tmp) / "ocr_gpu.prom"
        r = subprocess.run(
            [sys.executable, str(COLLECTOR), "--output", str(prom)], capture_output=True, text=True
        )
        verdict(r.returncode == 0, f"gpu-metrics exits 0: {(r.stdout + r.stderr).strip()}")
        samples = {}
        if prom.exists():
            for fam in text_string_to_metric_families(prom.read_text()):
                for s in fam.samples:
                    samples[(s.name, s.labels.get("gpu"))] = s.value
    verdict(samples.get(("ocr_gpu_count", None)) == len(gpus), f"ocr_gpu_count is {len(gpus)}")
    verdict(samples.get(("ocr_gpu_metrics_scrape_error", None)) == 0, "ocr_gpu_metrics_scrape_error is 0")
    for g in gpus:
        got = samples.get(("ocr_gpu_memory_total_bytes", g["index"]))
        verdict(got == float(g["memory.total"]) * MiB, f"GPU {g['index']}: ocr_gpu_memory_total_bytes {got}")

    # 2 and 3. The app, one child per GPU as each instance runs.
    try:
        import vllm  # noqa: F401

        import ocr_app  # noqa: F401
    except ImportError as err:
        verdict(False, f"{sys.executable} lacks the app with its vllm extra ({err}): set GPU_PYTHON")
        return 1
    for g in gpus:
        index = g["index"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("OCR_APP_")} | {
            "CUDA_VISIBLE_DEVICES": index
        }
        r = subprocess.run(
            [sys.executable, __file__, "--probe"], capture_output=True, text=True, env=env, timeout=600
        )
        if r.returncode != 0:
            verdict(False, f"GPU {index}: the app's probe failed: {r.stderr.strip()[-2000:]}")
            continue
        rep = json.loads(r.stdout.strip().splitlines()[-1])
        want = f"cuda:{index}"
        verdict(rep["gpu_present"], f"GPU {index}: the app's probe sees a GPU")
        verdict(
            rep["before_load"] == rep["device"] == want,
            f"GPU {index}: the app reports {rep['device']} ({rep['before_load']} before load), want {want}",
        )
        verdict(
            rep["cuda_uuid"] in rep["nvml_uuid"],
            f"GPU {index}: CUDA's device 0 is {rep['cuda_uuid']}, NVML's {index} is {rep['nvml_uuid']}",
        )
        verdict(rep["nvml_uuid"] == g["uuid"], f"GPU {index}: nvidia-smi's UUID is {g['uuid']}")
        free = rep["free_mib"]
        verdict(
            free is not None and abs(free - int(g["memory.free"])) <= FREE_TOLERANCE_MIB,
            f"GPU {index}: the app reads {free} MiB free, nvidia-smi {g['memory.free']} MiB",
        )
        verdict(
            rep["preflight"].startswith(f"device: {want} "), f"GPU {index}: check says {rep['preflight']!r}"
        )
    print(f"gpu-check: {'FAILED: ' + str(len(failures)) + ' check(s)' if failures else 'all checks passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(probe() if sys.argv[1:] == ["--probe"] else main())
