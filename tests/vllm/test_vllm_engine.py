"""engine: vllm through real HTTP: the real app on vLLM's CPU build with a tiny LightOnOCR checkpoint.

The checkpoint reads a page drawn by tiny_model.page(v) as VARIANTS[v].markdown, the text that page
shows, so the model's answer, its lines, their confidences and their boxes (grounding) can all be
checked, and each answer by position: a page swapped within a document, or an answer crossed between
concurrent requests, fails.
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest
from PIL import Image

from ..docs import encode, multipage_tiff, pdf
from .conftest import VllmServer, vllm_settings
from .tiny_model import VARIANTS, page

# Starting the app with vLLM takes ~1 min on 2 idle cores, several on busy ones: fixtures count in.
pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def pages():
    """Each variant's page, as the model was fitted on it."""
    return [page(v) for v in range(len(VARIANTS))]


@pytest.fixture(scope="module")
def png(pages) -> bytes:
    return encode(pages[0].image, "PNG")


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


def markdown_lines(variant: int) -> list[str]:
    return [line for line in VARIANTS[variant].markdown.split("\n") if line]


def assert_clean_page(p: dict, variant: int, rendered) -> None:
    assert p["text"] == VARIANTS[variant].markdown
    assert [line["text"] for line in p["lines"]] == markdown_lines(variant)
    assert p["warnings"] == []
    for line, drawn in zip(p["lines"], rendered.boxes, strict=True):
        assert 0.5 < line["confidence"] <= 1.0, line
        # Grounding: the detector's box of the same text (the rendered box, give or take padding).
        assert line["bbox"] is not None, line
        assert iou(line["bbox"], normalised(drawn, rendered.image.size)) > 0.5, (line, drawn)


def test_image_gives_the_models_markdown_with_confidences_and_boxes(server, pages):
    for v, rendered in enumerate(pages):
        r = server.ocr(encode(rendered.image, "PNG"), "image/png")
        assert r.status_code == 200, r.text
        body = r.json()
        assert (body["engine"], body["model"]) == ("vllm", "tiny-lightonocr")
        [p] = body["pages"]
        assert (p["page"], p["width"], p["height"]) == (1, rendered.image.width, rendered.image.height)
        assert_clean_page(p, v, rendered)


@pytest.mark.parametrize(
    ("kind", "order"), [("application/pdf", [1, 2, 0]), ("image/tiff", [2, 0, 1])], ids=["pdf", "tiff"]
)
def test_multipage_document_reads_each_page_in_its_place(server, pages, kind, order):
    images = [pages[v].image for v in order]
    r = server.ocr(pdf(images) if kind == "application/pdf" else multipage_tiff(images), kind)
    assert r.status_code == 200, r.text
    got = r.json()["pages"]
    assert [p["page"] for p in got] == list(range(1, len(order) + 1))
    for p, v in zip(got, order, strict=True):
        assert_clean_page(p, v, pages[v])


def test_concurrent_requests_each_get_their_own_pages(server, pages):
    order = [0, 1, 2, 1]
    with ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda v: server.ocr(encode(pages[v].image, "PNG"), "image/png"), order))
    assert [r.status_code for r in responses] == [200] * len(order)
    for r, v in zip(responses, order, strict=True):
        assert_clean_page(r.json()["pages"][0], v, pages[v])


def test_no_text_found_means_no_boxes(server):
    # A blank page reads as the variant of its colour (white: 0); the detector finds nothing to ground.
    r = server.ocr(encode(Image.new("RGB", (700, 300), "white"), "PNG"), "image/png")
    assert r.status_code == 200, r.text
    [p] = r.json()["pages"]
    assert p["text"] == VARIANTS[0].markdown
    assert [line["bbox"] for line in p["lines"]] == [None] * len(markdown_lines(0))


def test_max_tokens_is_honoured(server, png):
    before = server.metrics()
    r = server.ocr(png, "image/png", params={"max_tokens": 5})
    assert r.status_code == 200, r.text
    after = server.metrics()
    [p] = r.json()["pages"]
    full = VARIANTS[0].markdown
    assert full.startswith(p["text"]) and len(p["text"]) < len(full)

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


# The deadline must fall while the pages are inside vLLM: after the decode of the document below (2.5 s on
# 2 quiet cores, measured 2026-12-01; with a 3 s deadline it sometimes fell before vLLM had any page) and
# well before the model's work on it (19 s). A page like `png` takes ~1 s.
STRICT_DEADLINE_S = 8


@pytest.fixture(scope="module", autouse=True)
def strict_loading(tmp_path_factory, tiny_checkpoint, vllm_env, server):
    """A second app with a short deadline and no grounding, started (not waited for) as soon as `server` is
    ready, so that its engine loads while the tests of `server` run rather than after them: a load is about
    a minute, mostly on one core. The last test kills its engine core."""
    settings = vllm_settings(tiny_checkpoint, request_timeout_s=STRICT_DEADLINE_S, vllm_grounding=False)
    srv = VllmServer(tmp_path_factory.mktemp("strict"), vllm_env, **settings).start(wait_ready=False)
    yield srv
    srv.stop(signal.SIGKILL)


@pytest.fixture(scope="module")
def strict(strict_loading):
    strict_loading.wait_status("ready", timeout=900)
    return strict_loading


def test_request_past_its_deadline_is_504_and_aborted(strict, png):
    # 30 frames of 1540x1540, quick to decode (~80 ms each): ~3000 image tokens each, ~90k tokens for the
    # model, ~0.65 s of CPU work a frame, more than twice the deadline in all.
    frames = 30
    tiff = multipage_tiff([Image.new("RGB", (1540, 1540), "white")] * frames)
    before = strict.metrics()
    r = strict.ocr(tiff, "image/tiff")
    assert r.status_code == 504, r.text
    assert r.json()["error"]["code"] == "timeout"
    after = strict.metrics()
    # Pages had reached vLLM and were aborted there with the HTTP request: none is queued or running,
    # and not all of them finished. (vLLM's own prompt-token counter only moves once a prefill
    # completes, which a loaded machine may not reach within the deadline.)
    aborted = after["ocr_vllm_aborted_requests_total"] - before["ocr_vllm_aborted_requests_total"]
    finished = total(after, "vllm:request_success_total") - total(before, "vllm:request_success_total")
    assert aborted > 0 and finished < frames
    assert after["ocr_vllm_unfinished_requests"] == 0
    ok = strict.ocr(png, "image/png")
    assert ok.status_code == 200, ok.text
    assert ok.json()["pages"][0]["text"] == VARIANTS[0].markdown


def test_engine_death_makes_the_app_unhealthy_and_exit_nonzero(strict):
    [core] = strict.engine_core_pids()
    os.kill(core, signal.SIGKILL)
    assert strict.proc.wait(120) != 0
    logs = strict.logs()
    assert "vllm engine dead" in logs and "engine unusable, exiting" in logs
