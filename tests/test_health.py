"""/healthz tells the load balancer the truth: 503 `degraded` with a reason while the instance cannot take new
work in reasonable time (its event loop lagging, its decode pool stalled, its engine wedged), and 200 again
by itself once the cause is gone. The real app over real HTTP; the engine is tests/stall_engine.py's, which
a test can wedge or make block the loop; the decode pool is the app's own."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from .docs import encode, pdf, render
from .hostile import slow_render_pdf
from .server import Server, StallServer
from .test_errors import assert_error

HERE = Path(__file__).parent
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def control(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("stall-control")


@pytest.fixture(scope="module")
def srv(tmp_path_factory, control):
    s = StallServer(
        tmp_path_factory.mktemp("health"),
        engine="rapidocr",
        # The deadline ends the hostile render (tens of CPU seconds) by the clock, however busy the machine:
        # later than the stall bound, sooner than decode_cpu_s would.
        request_timeout_s=8,
        max_concurrency=2,
        preprocess_workers=1,  # one document occupies the whole pool
        decode_cpu_s=60,
        health_loop_lag_s=0.5,
        health_loop_lag_window_s=2,
        health_decode_stall_s=1.5,
        health_engine_stall_s=1.5,
    ).start(env={"STALL_CONTROL": str(control)})
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def clean() -> bytes:
    return encode(render(["Clean page 42"]).image, "PNG")


def poll_health(
    srv: Server, predicate: Callable[[httpx.Response], bool], timeout: float = 30
) -> httpx.Response:
    """The first /healthz answer that satisfies predicate: a bounded poll, not a timing assumption."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        r = srv.health()
        if r is not None:
            if predicate(r):
                return r
            seen.append((r.status_code, r.json()["status"], r.json().get("reason")))
        time.sleep(0.02)
    raise TimeoutError(f"/healthz never matched within {timeout} s; last answers {seen[-3:]}")


def degraded_for(words: str) -> Callable[[httpx.Response], bool]:
    def match(r: httpx.Response) -> bool:
        body = r.json()
        return r.status_code == 503 and body["status"] == "degraded" and words in (body["reason"] or "")

    return match


def ready(r: httpx.Response) -> bool:
    return r.status_code == 200 and r.json()["status"] == "ready" and r.json()["reason"] is None


def test_ready_has_no_reason(srv):
    # Polled: on a busy machine the first decode probe may wait out the 1.5 s bound behind a worker's start.
    assert ready(poll_health(srv, lambda r: r.json()["status"] == "ready"))


def test_event_loop_lag_takes_the_instance_out_until_the_window_passes(srv, control, clean):
    poll_health(srv, ready)
    before = srv.metrics()
    (control / "block_loop").write_text("2")  # the next request blocks the loop for 2 s
    assert srv.ocr(clean, "image/png").status_code == 200
    r = poll_health(srv, degraded_for("event loop lag"), timeout=10)
    assert "health_loop_lag_s" in r.json()["reason"]
    poll_health(srv, ready)  # the 2 s window passed: back without a restart
    assert "event loop lag" in srv.logs()  # the journal says why, once
    after = srv.metrics()

    def delta(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    # The metric saw it too: a sample over 1 s, which a healthy loop never has.
    over_1s = delta("ocr_event_loop_lag_seconds_count") - delta('ocr_event_loop_lag_seconds_bucket{le="1.0"}')
    assert over_1s >= 1


def test_stalled_decode_pool_takes_the_instance_out_until_a_worker_is_free(srv, clean):
    poll_health(srv, ready)
    with ThreadPoolExecutor(1) as pool:
        # Renders for tens of CPU seconds in the only worker, until its deadline kills it.
        hostile = pool.submit(srv.ocr, slow_render_pdf(), "application/pdf")
        r = poll_health(srv, degraded_for("decode pool stalled"), timeout=30)
        assert not hostile.done()  # out while the worker was still busy, not after
        assert r.elapsed.total_seconds() < 2  # /healthz itself never waits on the pool
        assert_error(hostile.result(), 504, "timeout")
    poll_health(srv, ready)  # the replacement worker answered the probe
    assert srv.ocr(clean, "image/png").status_code == 200


def test_wedged_engine_takes_the_instance_out_until_it_makes_progress(srv, control, clean):
    poll_health(srv, ready)
    wedge = control / "wedge"
    wedge.touch()
    try:
        with ThreadPoolExecutor(1) as pool:
            stuck = pool.submit(srv.ocr, clean, "image/png")
            r = poll_health(srv, degraded_for("engine wedged"), timeout=30)
            assert "1 request(s)" in r.json()["reason"] and not stuck.done()
            wedge.unlink()
            assert stuck.result().status_code == 200
    finally:
        wedge.unlink(missing_ok=True)
    poll_health(srv, ready)


def test_slow_engine_that_finishes_pages_is_not_wedged(srv, control):
    poll_health(srv, ready)
    trickle = control / "trickle"
    trickle.write_text("0.6")  # 5 pages: 3 s in the engine, twice health_engine_stall_s, a page every 0.6 s
    try:
        with ThreadPoolExecutor(1) as pool:
            document = pdf([render([f"Page {i}"]).image for i in range(5)])
            slow = pool.submit(srv.ocr, document, "application/pdf")
            answers = []
            while not slow.done():  # polled all the while the request runs
                r = srv.health()
                if r is not None:
                    answers.append((r.status_code, r.json()["reason"]))
                time.sleep(0.02)
            assert slow.result().status_code == 200
    finally:
        trickle.unlink(missing_ok=True)
    # The engine only: on a busy machine the PDF's decode may itself pass the 1.5 s decode bound.
    wedged = [reason for _, reason in answers if "engine wedged" in (reason or "")]
    assert answers and not wedged, wedged


def df_free(path: Path) -> int:
    """Free bytes for an unprivileged writer on path's filesystem, as coreutils' df reads them."""
    out = subprocess.run(
        ["df", "--output=avail", "-B1", str(path)], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1])


def disk_low_on(path: Path) -> Callable[[httpx.Response], bool]:
    def match(r: httpx.Response) -> bool:
        body = r.json()
        low = [
            p for p in body["problems"] if p["code"] == "disk_low" and f"disk: {path} has " in p["message"]
        ]
        return (
            r.status_code == 503 and body["status"] == "degraded" and bool(low) and body["reason"] is not None
        )

    return match


def test_a_filling_disk_takes_the_instance_out_until_there_is_room_again(tmp_path_factory, control):
    """A watched path not made yet (nginx's body buffers before nginx) is measured on the filesystem it would
    be made on; filling that filesystem past the bound takes the instance out, freeing it brings it back."""
    room = tmp_path_factory.mktemp("disk")
    free = df_free(room)
    margin = 64 * MiB
    if free < 4 * margin:
        pytest.skip(f"{room} has {free // MiB} MiB free: too little to fill safely")
    bound_mb = (free - margin) // MiB  # free space stays above it by about the margin until the fill
    s = StallServer(
        tmp_path_factory.mktemp("disk-server"),
        engine="rapidocr",
        health_disk_paths=[str(room / "nginx" / "body")],
        health_disk_min_free_mb=bound_mb,
    ).start(env={"STALL_CONTROL": str(control)})
    try:
        assert ready(poll_health(s, lambda r: r.json()["status"] == "ready"))
        assert s.health().json()["problems"] == []
        fill = room / "fill"
        low_on_room = disk_low_on(room)

        def filled_and_low(r: httpx.Response) -> bool:
            """The fill grown until free space is a margin under the bound, as often as others on this shared
            filesystem free some (a file deleted beside the test gave the instance its room back once)."""
            short = df_free(room) - (bound_mb * MiB - margin)
            if short > 0:
                with fill.open("ab") as f:
                    os.posix_fallocate(f.fileno(), fill.stat().st_size, short)
            return low_on_room(r)

        fill.touch()
        r = poll_health(s, filled_and_low)
        (low,) = [p for p in r.json()["problems"] if f"disk: {room} has " in p["message"]]
        assert f"(under health_disk_min_free_mb {bound_mb})" in low["message"], low
        # The load balancer's check sees 503 as long as the disk stays full.
        assert s.health().status_code == 503
        fill.unlink()
        assert ready(poll_health(s, lambda r: r.json()["status"] == "ready"))
        assert s.health().json()["problems"] == []
    finally:
        assert s.stop() == 0


# --- the lag window on a clock of the test's own ---------------------------------------------------------


class _Engine:
    """What HealthMonitor.problems() asks of an engine: its pages and its device."""

    pages_done = 0

    def device_problem(self) -> None:
        return None


@pytest.mark.parametrize(("after_s", "out"), [(0.0, True), (2.999, True), (3.0, False), (60.0, False)])
def test_a_lag_keeps_the_instance_out_for_its_window_and_no_longer(monkeypatch, after_s, out):
    # A lag seen at t = 100 with health_loop_lag_window_s = 3: out until t = 103, in again from then on.
    from ocr_app import metrics
    from ocr_app.config import load_settings
    from ocr_app.ocr import health

    settings = load_settings(None, auth_disabled=True, health_loop_lag_s=0.5, health_loop_lag_window_s=3)
    monitor = health.HealthMonitor(settings, metrics.Metrics(), None, _Engine())  # type: ignore[arg-type]
    monitor._lag_seen_s, monitor._lag_seen_at = 0.8, 100.0
    monkeypatch.setattr(health.time, "monotonic", lambda: 100.0 + after_s)
    assert [p.code for p in monitor.problems()] == (["event_loop_lag"] if out else [])
