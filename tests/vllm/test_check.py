"""`ocr-app check` with engine vllm: its preflight on vLLM's CPU build, and what it catches.

`check` does not load a vllm engine (a running instance holds the GPU; tests/test_check.py proves that no
second load happens); these tests show that the preflight it runs instead does real work: vLLM imported,
its platform probed, the model's config, tokenizer, chat template and weights read, and vLLM's own
validation of the engine settings against the model.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import vllm_settings

pytestmark = pytest.mark.timeout(900)


def check(tmp_path: Path, env: dict, model: Path, **settings) -> subprocess.CompletedProcess:
    cfg = tmp_path / "config.yml"
    config = vllm_settings(model, auth_disabled=True, drain_file=str(tmp_path / "drain"), **settings)
    cfg.write_text(yaml.safe_dump(config))
    return subprocess.run(
        [sys.executable, "-m", "ocr_app.cli", "check", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def test_check_runs_the_vllm_preflight_without_loading(tmp_path, tiny_checkpoint, vllm_env):
    r = check(tmp_path, vllm_env, tiny_checkpoint)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "device: cpu (vLLM's platform)" in out
    assert "model: tiny-lightonocr (mistral3): config, tokenizer, template, 1 weights" in out
    assert "engine: vLLM accepts the settings (max_model_len 4096)" in out
    assert "ok: engine vllm (tiny-lightonocr) on cpu passed its preflight; not loaded" in out


def test_check_names_what_the_load_would_fail_on(tmp_path, tiny_checkpoint, vllm_env):
    # More context than the model has positions (16384): vLLM's own validation refuses it.
    r = check(tmp_path, vllm_env, tiny_checkpoint, vllm_max_model_len=32768)
    assert r.returncode == 1
    assert "vLLM rejects the engine settings" in r.stderr and "32768" in r.stderr

    # (Each check imports vLLM, about a minute on 2 cores: one case of the model files' own checks.)
    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, broken)
    [weights] = broken.glob("*.safetensors")
    weights.write_bytes(weights.read_bytes()[:4])  # a truncated download
    r = check(tmp_path, vllm_env, broken)
    assert r.returncode == 1
    assert f"{weights}: not a safetensors file" in r.stderr
