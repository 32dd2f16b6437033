"""Settings: YAML file, OCR_APP_* overrides, and clear refusals that name the key."""

from __future__ import annotations

import subprocess

import pytest

from ocr_app.config import ConfigError, load_settings

from .server import OCR_APP


def test_yaml_then_env_override(tmp_path, monkeypatch):
    cfg = tmp_path / "c.yml"
    cfg.write_text("port: 9001\nmax_pages: 7\nauth_disabled: true\n")
    monkeypatch.setenv("OCR_APP_MAX_PAGES", "9")
    s = load_settings(cfg)
    assert (s.port, s.max_pages, s.max_upload_bytes, s.max_image_side, s.pdf_dpi) == (
        9001,
        9,
        20 << 20,
        1540,
        200,
    )
    assert (s.max_pixels, s.request_timeout_s, s.engine) == (50_000_000, 30.0, "auto")


@pytest.mark.parametrize(
    ("yaml_text", "needle"),
    [
        ("max_pages: 0\nauth_disabled: true\n", "max_pages"),
        ("port: 70000\nauth_disabled: true\n", "port"),
        ("engine: gpu\nauth_disabled: true\n", "engine"),
        ("max_pagez: 3\nauth_disabled: true\n", "max_pagez: unknown setting"),
        ("port: 8000\n", "api_keys_file is required"),
        ("port: [1\n", "c.yml"),
    ],
)
def test_invalid_settings_name_the_key(tmp_path, yaml_text, needle):
    cfg = tmp_path / "c.yml"
    cfg.write_text(yaml_text)
    with pytest.raises(ConfigError, match="invalid configuration") as exc:
        load_settings(cfg)
    assert needle in str(exc.value)


def test_bad_env_value_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("OCR_APP_REQUEST_TIMEOUT_S", "soon")
    with pytest.raises(ConfigError, match="OCR_APP_REQUEST_TIMEOUT_S"):
        load_settings(None, auth_disabled=True)


def test_serve_with_invalid_config_exits_nonzero_with_message(tmp_path):
    cfg = tmp_path / "c.yml"
    cfg.write_text("max_concurrency: -1\nauth_disabled: true\n")
    r = subprocess.run([OCR_APP, "serve", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "max_concurrency" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(
        [OCR_APP, "serve", "--config", str(tmp_path / "nope.yml")], capture_output=True, text=True
    )
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_concurrency_follows_the_engine(tmp_path):
    """Unset, max_concurrency fills the engine's batch (vllm_max_num_seqs on vllm, so a GPU host deployed with
    the defaults is not held to a few pages); the CPU engine's workers, at least 2; a set value is kept."""
    s = load_settings(auth_disabled=True, vllm_max_num_seqs=48, rapidocr_workers=6)
    assert s.max_concurrency is None
    assert s.for_engine("vllm").max_concurrency == 48
    assert s.for_engine("rapidocr").max_concurrency == 6
    assert load_settings(auth_disabled=True, rapidocr_workers=1).for_engine("rapidocr").max_concurrency == 2
    fixed = load_settings(auth_disabled=True, max_concurrency=3)
    assert fixed.for_engine("vllm").max_concurrency == 3
    # Job pages: as many in flight as max_concurrency; beside interactive ones only on the batching engine.
    assert (s.for_engine("vllm").job_max_inflight, s.for_engine("vllm").job_max_interactive) == (48, 24)
    assert (s.for_engine("rapidocr").job_max_inflight, s.for_engine("rapidocr").job_max_interactive) == (6, 0)
    assert fixed.for_engine("rapidocr").job_max_inflight == 3
    own = load_settings(auth_disabled=True, job_max_inflight=1, job_max_interactive=2).for_engine("vllm")
    assert (own.job_max_inflight, own.job_max_interactive) == (1, 2)
