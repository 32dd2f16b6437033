"""Documents are decoded in worker processes that the request's deadline, a CPU-time limit and a memory limit
stop: the answer is a clear 4xx/504, the worker is replaced, and other requests (at the same time and
right after) are served. Every document is generated here (nothing binary is committed)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from PIL import Image

from ocr_app.config import Settings
from ocr_app.documents.decode import PAGE_DIR_PREFIX, DecodePool, DecodeRequest, _page_dir, decode_document
from ocr_app.documents.pages import load_pages

from .docs import encode, multipage_tiff, png_bomb, render
from .hostile import slow_render_pdf
from .server import Server
from .test_errors import assert_error


@pytest.fixture(scope="module")
def clean() -> bytes:
    return encode(render(["Clean page 42"]).image, "PNG")


def assert_served(srv: Server, clean: bytes) -> None:
    r = srv.ocr(clean, "image/png")
    assert r.status_code == 200, r.text
    assert "42" in r.json()["pages"][0]["text"]


def killed(srv: Server, reason: str) -> float:
    return srv.metrics().get(f'ocr_decode_workers_killed_total{{reason="{reason}"}}', 0.0)


def test_deadline_kills_the_render_and_others_are_served(tmp_path, clean):
    deadline = 10  # room for the clean page at load 14 (6 s was not); the hostile one renders for ~43 s
    srv = Server(tmp_path, request_timeout_s=deadline, max_concurrency=2, preprocess_workers=2).start()
    try:
        answer: dict[str, object] = {}

        def hostile() -> None:
            start = time.monotonic()
            answer["response"] = srv.ocr(slow_render_pdf(), "application/pdf")
            answer["seconds"] = time.monotonic() - start

        thread = threading.Thread(target=hostile)
        thread.start()
        srv.wait_until(lambda h: h["inflight"] >= 1)
        assert_served(srv, clean)  # while PDFium renders the hostile page in another worker
        thread.join()
        assert_error(answer["response"], 504, "timeout")
        assert answer["seconds"] <= deadline + 1, answer["seconds"]
        assert killed(srv, "deadline") == 1  # the render stopped with its worker, not only the answer
        assert_served(srv, clean)
        assert srv.health().json()["inflight"] == 0
    finally:
        assert srv.stop() == 0


@pytest.fixture(scope="module")
def bounded(tmp_path_factory):
    """Tight decode bounds, a far deadline: what stops a document here is the limit, not the clock."""
    srv = Server(
        tmp_path_factory.mktemp("bounded"),
        request_timeout_s=120,
        preprocess_workers=1,
        decode_cpu_s=1,
        decode_memory_mb=256,
    ).start()
    yield srv
    assert srv.stop() == 0


def test_cpu_limit_kills_the_worker_with_413_and_the_next_request_is_served(bounded, clean):
    r = bounded.ocr(slow_render_pdf(), "application/pdf")
    err = assert_error(r, 413, "decode_cpu_limit")
    assert "decode_cpu_s" in err["message"]
    assert killed(bounded, "cpu_limit") == 1
    assert_served(bounded, clean)  # by the replacement: the pool has one worker


def test_memory_limit_is_413_and_the_next_request_is_served(bounded, clean):
    # 49 MP (under max_pixels) in ~30 KB: its RGB page alone needs ~200 MB, more than the worker's 256 MB.
    r = bounded.ocr(png_bomb(7000, 7000), "image/png")
    err = assert_error(r, 413, "decode_memory_limit")
    assert "decode_memory_mb" in err["message"]
    # Replaced: what the worker freed stays in its heap, under its bound, and would refuse the next page.
    assert killed(bounded, "memory_limit") == 1
    assert_served(bounded, clean)


def test_multipart_is_parsed_in_the_worker(bounded, clean):
    files = {"file": ("clean.png", clean, "image/png")}
    with bounded.client() as c:
        r = c.post("/v1/ocr", files=files)
    assert r.status_code == 200, r.text
    bad = httpx.Request("POST", "http://x", files={"other": ("x", b"x")})
    body, ctype = bad.read(), bad.headers["content-type"]
    assert_error(bounded.ocr(body, ctype), 422, "invalid_parameter")


def _post_and_leave(srv: Server, body: bytes, send: int, until) -> None:
    """POST /v1/ocr on a raw socket, send `send` bytes of the body, wait for until() (polled), then close."""
    head = (
        f"POST /v1/ocr HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {srv.key}\r\n"
        f"Content-Type: application/pdf\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as sock:
        sock.sendall(head + body[:send])
        until()


def test_a_client_that_leaves_stops_its_work_and_is_counted_499_not_500(tmp_path, clean):
    # One slot and one worker: whatever a departed client left running would hold up the clean page.
    srv = Server(tmp_path, request_timeout_s=120, max_concurrency=1, preprocess_workers=1).start()
    try:
        requests = 'ocr_requests_total{code="%s"}'
        # Gone mid-upload: the body never completes.
        pdf = slow_render_pdf()  # under the object bound: PDFium renders it for tens of seconds
        _post_and_leave(srv, pdf, len(pdf) // 2, lambda: srv.wait_until(lambda h: h["inflight"] == 1))
        srv.wait_until(lambda h: h["inflight"] == 0, timeout=10)
        # Gone while its document renders: the worker is killed at once, not at the deadline or the CPU limit.
        _post_and_leave(srv, pdf, len(pdf), lambda: srv.wait_until(lambda h: h["inflight"] == 1))
        srv.wait_until(lambda h: h["inflight"] == 0, timeout=10)
        m = srv.metrics()
        assert m.get(requests % "499") == 2, m
        assert m.get(requests % "500") is None, srv.logs()[-3000:]
        assert killed(srv, "client_gone") == 1
        assert killed(srv, "deadline") == 0
        assert_served(srv, clean)
        assert "unhandled error" not in srv.logs()
    finally:
        assert srv.stop() == 0


# ------------------------------------------------------------------ pages crossing as files on tmpfs


@pytest.fixture
def pool():
    p = DecodePool.from_settings(Settings(auth_disabled=True), workers=1)
    p.start()
    yield p
    p.close()


def _decode(pool: DecodePool, body: bytes, content_type: str):
    return asyncio.run(pool.decode(DecodeRequest(body, content_type), time.monotonic() + 60))


def test_pages_cross_as_files_that_are_gone_once_read(pool):
    pages = [render([f"Page {n} of three"]).image for n in (1, 2, 3)]
    photo = Image.new("RGB", (3000, 2000), "white")  # shrunk to max_image_side in the worker
    photo.paste(render(["A photographed line"], size=120).image, (100, 100))
    for body, ctype in ((multipage_tiff(pages), "image/tiff"), (encode(photo, "JPEG"), "image/jpeg")):
        decoded = _decode(pool, body, ctype)
        expected = load_pages(body, ctype, None, pool.limits)  # the same function, in this process
        assert [p.number for p in decoded] == [p.number for p in expected]
        for got, want in zip(decoded, expected, strict=True):
            assert (got.width, got.height, got.size) == (want.width, want.height, want.image.size)
            assert got.rgb().tobytes() == want.image.tobytes()  # pixel for pixel
            # The server holds the page file's mapping as the engine's array; the engine may write to it.
            assert got.image is None and got.bgr.flags.writeable
        assert os.listdir(pool._page_dir) == []  # each page's file removed once read
    page_dir = pool._page_dir
    pool.close()
    assert not os.path.exists(page_dir)


def test_page_files_nobody_reads_are_removed_by_the_next_decode(pool):
    # What a worker leaves when its request has gone (client left, deadline) just as it wrote its pages:
    # the function a worker runs, run here, writing into the pool's directory under a token not in flight.
    body = multipage_tiff([render([f"Left page {n}"]).image for n in (1, 2)])
    stray = decode_document(
        DecodeRequest(body, "image/tiff"), pool.limits, 30, os.path.join(pool._page_dir, "gone")
    )
    assert sorted(os.listdir(pool._page_dir)) == ["gone-1", "gone-2"], [p.path for p in stray]
    [page] = _decode(pool, encode(render(["Next"]).image, "PNG"), "image/png")
    assert page.size[0] > 0
    assert os.listdir(pool._page_dir) == []


def test_a_dead_servers_page_directory_is_removed_when_a_pool_starts():
    made = Path(_page_dir())
    root = made.parent  # /dev/shm here, as on a host
    made.rmdir()
    dead_pid = subprocess.Popen(["true"])
    dead_pid.wait()
    dead = root / f"{PAGE_DIR_PREFIX}{dead_pid.pid}-test"
    alive = root / f"{PAGE_DIR_PREFIX}{os.getpid()}-test"
    for d in (dead, alive):
        d.mkdir()
        (d / "x-1").write_bytes(b"\0" * 12)
    try:
        p = DecodePool.from_settings(Settings(auth_disabled=True), workers=1)
        p.close()
        assert not dead.exists()  # a killed server's pages: nobody will read them
        assert (alive / "x-1").exists()  # a running server's (this process): kept
    finally:
        shutil.rmtree(dead, ignore_errors=True)
        shutil.rmtree(alive, ignore_errors=True)
