"""engine: vllm through real HTTP: the real app on vLLM's CPU build with a tiny LightOnOCR checkpoint.

The checkpoint reads every page as tiny_model.PAGE_MARKDOWN, and the test pages show that text, so the
model's answer, its lines, their confidences and their boxes (grounding) can all be checked.
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest
from PIL import Image

from ..docs import encode, multipage_tiff, pdf, render
from .conftest import VllmServer, vllm_settings
from .tiny_model import PAGE_LINES, PAGE_MARKDOWN

EXPECTED_LINES = [line for line in PAGE_MARKDOWN.split("\n") if line]
# Starting the app with vLLM takes ~1 min on 2 idle cores, several on busy ones: fixtures count in.
pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def page():
    return render(PAGE_LINES)


@pytest.fixture(scope="module")
def png(page) -> bytes:
    return encode(page.image, "PNG")


def iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def normalised(box, size):
    w, h = size
    return (box[0] / w, box[1] / h, box[2] / w, box[3] / h)


def total(metrics: dict[str, float], name: str) -> float:
    """A metric summed over its label sets (vLLM labels its own by model and engine)."""
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


def assert_clean_page(p: dict, rendered) -> None:
    assert p["text"] == PAGE_MARKDOWN
    assert [line["text"] for line in p["lines"]] == EXPECTED_LINES
    assert p["warnings"] == []
    for line, drawn in zip(p["lines"], rendered.boxes, strict=True):
        assert 0.5 < line["confidence"] <= 1.0, line
        # Grounding: the detector's box of the same text (the rendered box, give or take padding).
        assert line["bbox"] is not None, line
        assert iou(line["bbox"], normalised(drawn, rendered.image.size)) > 0.5, (line, drawn)


def test_image_gives_the_models_markdown_with_confidences_and_boxes(server, page, png):
    r = server.ocr(png, "image/png")
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["engine"], body["model"]) == ("vllm", "tiny-lightonocr")
    [p] = body["pages"]
    assert (p["page"], p["width"], p["height"]) == (1, page.image.width, page.image.height)
    assert_clean_page(p, page)


def test_two_page_pdf(server, page):
    r = server.ocr(pdf([page.image, page.image]), "application/pdf")
    assert r.status_code == 200, r.text
    pages = r.json()["pages"]
    assert [p["page"] for p in pages] == [1, 2]
    for p in pages:
        assert_clean_page(p, page)


def test_four_concurrent_requests_all_succeed(server, png, page):
    with ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda _: server.ocr(png, "image/png"), range(4)))
    assert [r.status_code for r in responses] == [200] * 4
    for r in responses:
        assert_clean_page(r.json()["pages"][0], page)


def test_no_text_found_means_no_boxes(server):
    # A blank page: the model still writes its text, the detector finds nothing to ground it on.
    r = server.ocr(encode(Image.new("RGB", (700, 300), "white"), "PNG"), "image/png")
    assert r.status_code == 200, r.text
    [p] = r.json()["pages"]
    assert p["text"] == PAGE_MARKDOWN
    assert [line["bbox"] for line in p["lines"]] == [None] * len(EXPECTED_LINES)


def test_max_tokens_is_honoured(server, png):
    before = server.metrics()
    r = server.ocr(png, "image/png", params={"max_tokens": 5})
    assert r.status_code == 200, r.text
    after = server.metrics()
    [p] = r.json()["pages"]
    assert PAGE_MARKDOWN.startswith(p["text"]) and len(p["text"]) < len(PAGE_MARKDOWN)

    def delta(name: str) -> float:
        return total(after, name) - total(before, name)

    attempts = delta("vllm:request_params_max_tokens_count")
    asked = delta("vllm:request_params_max_tokens_sum")
    written = delta("vllm:generation_tokens_total")
    assert attempts >= 1 and asked == 5 * attempts and written == 5 * attempts

    for bad in (0, 513, "x"):
        r = server.ocr(png, "image/png", params={"max_tokens": bad})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "invalid_parameter"


def test_degenerate_output_is_retried_and_reported(server, png):
    # Cut at 5 tokens, every answer ends with finish reason `length`: degenerate, so the page is run
    # again at each retry temperature (0.5, 0.8), then returned cut, with warnings.
    before = server.metrics()["ocr_engine_retries_total"]
    r = server.ocr(png, "image/png", params={"max_tokens": 5})
    assert r.status_code == 200, r.text
    [p] = r.json()["pages"]
    codes = [w.split(":", 1)[0] for w in p["warnings"]]
    assert codes == ["retried", "max_tokens_reached"], p["warnings"]
    assert "2 retries" in p["warnings"][0] and "at temperature 0.8" in p["warnings"][0]
    assert server.metrics()["ocr_engine_retries_total"] - before == 2
    for line in p["lines"]:
        assert 0.0 <= line["confidence"] <= 1.0


def test_healthz(server):
    r = server.health()
    assert r.status_code == 200
    h = r.json()
    assert (h["status"], h["model_loaded"], h["engine"]) == ("ready", True, "vllm")
    assert h["model"] == "tiny-lightonocr"
    assert h["device"] == "cpu"  # vLLM's CPU build; "cuda:N" on GPU hosts
    assert h["available_memory_mb"] > 0
    assert h["version"] and h["inflight"] == 0 and h["queued"] == 0


def test_metrics_export_ours_and_vllms(server, png):
    assert server.ocr(png, "image/png").status_code == 200
    m = server.metrics()
    assert m["ocr_model_loaded"] == 1 and m["ocr_pages_total"] >= 1 and "ocr_engine_retries_total" in m
    assert total(m, "vllm:request_success_total") >= 1 and total(m, "vllm:generation_tokens_total") > 0
    assert any(k.startswith("vllm:num_requests_running") for k in m)
    text = server.client(key=None).get("/metrics").text
    families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(families) == len(set(families)), "a metric family exported twice"
    assert "process_cpu_seconds_total" in families and any(f.startswith("vllm:") for f in families)


@pytest.fixture(scope="module")
def strict(tmp_path_factory, tiny_checkpoint, vllm_env):
    """A second app with a short deadline and no grounding; the last test kills its engine core."""
    settings = vllm_settings(tiny_checkpoint, request_timeout_s=3, vllm_grounding=False)
    srv = VllmServer(tmp_path_factory.mktemp("strict"), vllm_env, **settings).start()
    yield srv
    srv.stop(signal.SIGKILL)


def test_request_past_its_deadline_is_504_and_aborted(strict, png):
    # 30 frames of 1540x1540, quick to decode: ~3000 image tokens each, ~90k tokens for the model,
    # many times the 3 s deadline of CPU work (a page like `png` takes a tenth of a second).
    frames = 30
    tiff = multipage_tiff([Image.new("RGB", (1540, 1540), "white")] * frames)
    before = strict.metrics()
    r = strict.ocr(tiff, "image/tiff")
    assert r.status_code == 504, r.text
    assert r.json()["error"]["code"] == "timeout"
    after = strict.metrics()
    # The pages had reached vLLM (it was reading them), and left it with the HTTP request: none is
    # queued or running, and not all of them finished.
    read = total(after, "vllm:prompt_tokens_total") - total(before, "vllm:prompt_tokens_total")
    finished = total(after, "vllm:request_success_total") - total(before, "vllm:request_success_total")
    assert read > 0 and finished < frames
    assert after["ocr_vllm_unfinished_requests"] == 0
    ok = strict.ocr(png, "image/png")
    assert ok.status_code == 200, ok.text
    assert ok.json()["pages"][0]["text"] == PAGE_MARKDOWN


def test_engine_death_makes_the_app_unhealthy_and_exit_nonzero(strict):
    [core] = strict.engine_core_pids()
    os.kill(core, signal.SIGKILL)
    assert strict.proc.wait(120) != 0
    logs = strict.logs()
    assert "vllm engine dead" in logs and "engine unusable, exiting" in logs
