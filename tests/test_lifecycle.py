"""The service under load and through its life: saturation, overload, deadlines, drain, keys, stop."""

from __future__ import annotations

import json
import math
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from ocr_app.auth import hash_key

from .docs import TEXTS, encode, pdf, render
from .server import OCR_APP, Server, StallServer


def dense_page(lines: int = 30):
    """A full page of text: seconds of CPU work for the engine."""
    text = [TEXTS["en"][i % 4] for i in range(lines)]
    return render(text, size=28, width=1100).image


@pytest.fixture(scope="module")
def small() -> bytes:
    return encode(render(["Short note 77"]).image, "PNG")


# A page for the test engine, which reads every page back as its self-test text.
PAGE = encode(render(["Held"]).image, "PNG")


@pytest.fixture(scope="module")
def tight(tmp_path_factory):
    """One request in flight, two waiting, one engine worker: easy to saturate."""
    # The deadline is far: these tests are about order and counts, and heavy pages queue behind each other.
    srv = Server(
        tmp_path_factory.mktemp("tight"), max_concurrency=1, max_queue=2, request_timeout_s=600
    ).start()
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def saturated(tmp_path_factory):
    """As `tight`, with the test engine (tests/stall_engine.py): while `wedge` exists in its control directory
    the page in flight waits, so one request stays in flight and two wait for as long as a test needs, without
    seconds of real OCR behind them."""
    srv = StallServer(tmp_path_factory.mktemp("saturated"), engine="rapidocr", max_concurrency=1, max_queue=2)
    srv.control = tmp_path_factory.mktemp("saturated-control")
    srv.start(env={"STALL_CONTROL": str(srv.control)})
    yield srv
    assert srv.stop() == 0


@pytest.fixture
def wedged(saturated):
    """Three requests sent, one in flight (its page held) and two queued; the futures, then released."""
    wedge = saturated.control / "wedge"
    wedge.touch()
    with ThreadPoolExecutor(3) as pool:
        try:
            futures = [pool.submit(saturated.ocr, PAGE, "image/png") for _ in range(3)]
            yield futures
        finally:
            wedge.unlink(missing_ok=True)


def test_health_answers_while_the_engine_is_saturated(saturated, wedged):
    body = saturated.wait_until(lambda h: h["inflight"] == 1 and h["queued"] == 2)
    # Ordering, not timing: /healthz and /livez answered while all three were still pending.
    livez = saturated.client(key=None).get("/livez")
    assert not any(f.done() for f in wedged)
    assert body["status"] == "ready" and livez.status_code == 200
    (saturated.control / "wedge").unlink()
    assert [f.result().status_code for f in wedged] == [200, 200, 200]


def test_full_queue_is_503_at_once_and_loses_nothing(saturated, wedged):
    before = saturated.metrics().get('ocr_rejected_total{reason="overloaded"}', 0)
    saturated.wait_until(lambda h: h["inflight"] == 1 and h["queued"] == 2)
    r = saturated.ocr(PAGE, "image/png")
    assert not any(f.done() for f in wedged)  # refused while the others were still pending
    assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded"
    assert int(r.headers["retry-after"]) >= 1
    (saturated.control / "wedge").unlink()
    assert [f.result().status_code for f in wedged] == [200, 200, 200]
    assert saturated.metrics()['ocr_rejected_total{reason="overloaded"}'] == before + 1
    assert saturated.ocr(PAGE, "image/png").status_code == 200


def test_drain_file_turns_health_to_draining_but_requests_still_work(tight, small):
    tight.drain_file.touch()
    try:
        r = tight.health()
        assert r.status_code == 503 and r.json()["status"] == "draining"
        assert tight.ocr(small, "image/png").status_code == 200
    finally:
        tight.drain_file.unlink()
    assert tight.health().status_code == 200


def test_keys_rotate_without_restart(tight, small):
    new_key = subprocess.run(
        [OCR_APP, "keys", "add", "rotated", "--file", str(tight.keys_file)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()[-1]
    assert tight.ocr(small, "image/png", key=new_key).status_code == 200
    stored = tight.keys_file.read_text()
    assert f"\nrotated:{hash_key(new_key)}\n" in stored and new_key not in stored  # hashes only
    subprocess.run([OCR_APP, "keys", "remove", "rotated", "--file", str(tight.keys_file)], check=True)
    assert tight.ocr(small, "image/png", key=new_key).status_code == 401
    tight.proc.send_signal(signal.SIGHUP)  # an explicit reload is harmless
    assert tight.ocr(small, "image/png").status_code == 200
    assert tight.key not in tight.keys_file.read_text()


def test_metrics_move(tight, small):
    before = tight.metrics()
    assert tight.ocr(small, "image/png").status_code == 200
    assert tight.ocr(small, "image/png", key="wrong").status_code == 401
    after = tight.metrics()

    def delta(name):
        return after.get(name, 0) - before.get(name, 0)

    assert delta('ocr_requests_total{code="200"}') == 1
    assert delta('ocr_requests_total{code="401"}') == 1
    assert delta('ocr_rejected_total{reason="unauthorized"}') == 1
    assert delta("ocr_pages_total") == 1
    assert delta("ocr_request_duration_seconds_count") == 2
    assert delta("ocr_inference_seconds_count") == 1
    assert delta("ocr_engine_pages_total") == 1
    assert after["ocr_model_loaded"] == 1
    assert after["ocr_inflight_requests"] == 0 and after["ocr_queue_depth"] == 0


def test_logs_are_json_lines_without_document_text(tight, small):
    r = tight.ocr(small, "image/png", headers={"X-Request-ID": "log-check-1"})
    assert "Short note" in r.json()["pages"][0]["text"]
    [access] = tight.log_records(lambda x: x.get("request_id") == "log-check-1" and x["message"] == "request")
    assert access["caller"] == "tests" and access["route"] == "/v1/ocr" and access["status"] == 200
    assert access["pages"] == 1 and access["bytes"] == len(small) and access["duration_ms"] > 0
    assert {"time", "level"} <= set(access)
    assert all(json.loads(line) for line in tight.logs().splitlines() if line.strip())
    assert "Short note" not in tight.logs()


def test_deadline_returns_504_cancels_the_work_and_keeps_serving(tmp_path, small):
    deadline = 2
    srv = Server(tmp_path, request_timeout_s=deadline, max_concurrency=2, max_pages=1000).start()
    try:
        # Sized by this machine's own speed, not assumed: ten deadlines' worth of pages (at least 20).
        start = time.monotonic()
        one = srv.ocr(pdf([dense_page(8)]), "application/pdf")
        per_page = time.monotonic() - start if one.status_code == 200 else deadline
        pages = max(20, math.ceil(10 * deadline / per_page))
        data = pdf([dense_page(8)] * pages)
        before = srv.metrics()["ocr_engine_pages_total"]
        r = srv.ocr(data, "application/pdf")
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        # A follow-up queues behind whatever page was still running: once one is answered, the
        # abandoned request's remaining pages would have run too, had they not been cancelled.
        # (On a busy machine a follow-up may itself pass the 2 s deadline; it is retried.)
        codes = []
        while 200 not in codes and len(codes) < 5:
            codes.append(srv.ocr(small, "image/png").status_code)
        assert codes[-1] == 200 and set(codes) <= {200, 504}, codes
        ran = srv.metrics()["ocr_engine_pages_total"] - before
        assert ran <= pages // 2, f"{ran} of {pages} pages ran for a request cancelled after {deadline} s"
        assert srv.health().json()["inflight"] == 0
    finally:
        assert srv.stop() == 0


class NotifyListener:
    """Stands in for systemd's notify socket: records every datagram the service sends."""

    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages: list[str] = []
        self.stopped = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopped:
            try:
                self.messages.append(self.sock.recv(256).decode())
            except TimeoutError:
                continue

    def wait_for(self, message: str, timeout: float = 120) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if message in self.messages:
                return self.messages.index(message)
            time.sleep(0.02)
        raise TimeoutError(f"{message} not received; got {self.messages[-5:]}")

    def close(self):
        self.stopped = True
        self.thread.join()
        self.sock.close()


def test_startup_notify_watchdog_and_sigterm_with_work_in_flight(tmp_path, small):
    """With the test engine (tests/stall_engine.py): its load is held (`hold_load`) until the loading state
    has been checked, and the request in flight at SIGTERM is held in the engine (`wedge`) until the server
    is seen waiting for it, so both orders are certain rather than left to real OCR's speed."""
    notify = NotifyListener(tmp_path / "notify.sock")
    srv = StallServer(tmp_path / "srv", engine="rapidocr")
    control = tmp_path / "control"
    control.mkdir()
    (control / "hold_load").touch()
    srv.start(
        wait_ready=False,
        env={"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "1000000", "STALL_CONTROL": str(control)},
    )
    try:
        first = srv.wait_until(lambda h: True)
        assert first["status"] == "loading" and first["model_loaded"] is False
        r = srv.ocr(small, "image/png")
        assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
        assert "READY=1" not in notify.messages
        (control / "hold_load").unlink()

        notify.wait_for("READY=1")
        assert srv.health().json()["status"] == "ready"
        notify.wait_for("WATCHDOG=1")

        (control / "wedge").touch()
        with ThreadPoolExecutor(1) as pool:
            inflight = pool.submit(srv.ocr, small, "image/png")
            srv.wait_until(lambda h: h["inflight"] == 1)
            srv.proc.send_signal(signal.SIGTERM)
            # The server waits for the held request (uvicorn says so once it has stopped listening): a server
            # that did not would go on to exit, cutting it off, and never say it.
            waiting = srv.log_records(lambda r: r["message"].startswith("Waiting for connections to close"))
            assert waiting and srv.proc.poll() is None and not inflight.done(), srv.logs()[-2000:]
            (control / "wedge").unlink()
            assert inflight.result().status_code == 200  # finished, not cut off
        assert srv.proc.wait(60) == 0
        notify.wait_for("STOPPING=1")
    finally:
        srv.stop(signal.SIGKILL)
        notify.close()


def test_engine_that_cannot_load_exits_nonzero(tmp_path):
    # engine vllm in a venv without vLLM (this one): a clear reason, and an exit for systemd to act on.
    model = tmp_path / "model"
    model.mkdir()
    srv = Server(tmp_path / "srv", engine="vllm", model_path=str(model))
    srv.start(wait_ready=False)
    assert srv.proc.wait(120) == 1
    assert "vLLM is not installed: install ocr-app[vllm]" in srv.logs()


def test_engine_vllm_without_a_model_is_a_configuration_error(tmp_path):
    srv = Server(tmp_path, engine="vllm")
    srv.start(wait_ready=False)
    assert srv.proc.wait(60) == 2
    assert "model_path is required for engine vllm" in srv.logs()
