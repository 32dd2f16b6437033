"""Documents are decoded in worker processes that the request's deadline, a CPU-time limit and a memory limit
stop: the answer is a clear 4xx/504, the worker is replaced, and other requests (at the same time and
right after) are served. Every document is generated here (nothing binary is committed)."""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
import resource
import shutil
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import httpx
import pytest
from pebble import ProcessExpired
from PIL import Image

from ocr_app.config import Settings
from ocr_app.documents import decode
from ocr_app.documents.decode import (
    OUT_OF_MEMORY_EXIT,
    PAGE_DIR_PREFIX,
    DecodePool,
    DecodeRequest,
    _killed_by_backstop,
    _page_dir,
    decode_document,
)
from ocr_app.documents.image import Limits
from ocr_app.documents.pages import load_pages
from ocr_app.errors import DecodeCpuLimit, DecodeMemoryLimit, InvalidDocument
from ocr_app.sched import JOB_NICE

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
            assert got.preview is None  # not asked for
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


def test_a_dead_servers_page_directory_is_removed_when_a_pool_starts(monkeypatch):
    """Directories of servers that are gone are removed; a running server's are kept, and that server is
    only asked whether it lives (signal 0), never signalled. Another server that removed a dead server's
    directory between our listing and our removal stops nothing."""
    made = Path(_page_dir())
    root = made.parent  # /dev/shm here, as on a host
    made.rmdir()
    dead_pid = subprocess.Popen(["true"])
    dead_pid.wait()
    running = subprocess.Popen(["sleep", "600"])  # another server: killed by any signal sent to it
    dead = root / f"{PAGE_DIR_PREFIX}{dead_pid.pid}-test"
    gone = f"{PAGE_DIR_PREFIX}{dead_pid.pid}-removed-by-another"  # listed, then removed by another server
    alive = root / f"{PAGE_DIR_PREFIX}{running.pid}-test"
    ours = root / f"{PAGE_DIR_PREFIX}{os.getpid()}-test"
    for d in (dead, alive, ours):
        d.mkdir()
        (d / "x-1").write_bytes(b"\0" * 12)
    listdir = os.listdir
    monkeypatch.setattr(
        decode.os, "listdir", lambda path: [gone, *listdir(path)] if path == str(root) else listdir(path)
    )
    try:
        p = DecodePool.from_settings(Settings(auth_disabled=True), workers=1)
        p.close()
        assert not dead.exists()  # a killed server's pages: nobody will read them
        assert (alive / "x-1").exists()  # a running server's: kept
        assert (ours / "x-1").exists()  # this process's: kept
        assert running.poll() is None, f"the running server was signalled: {running.returncode}"
    finally:
        running.kill()
        running.wait()
        for d in (dead, alive, ours):
            shutil.rmtree(d, ignore_errors=True)


def test_a_count_in_a_worker_reads_a_multipart_bodys_file_and_fingerprints_it_alone(pool):
    """The job routes' page count: of the file inside a multipart body, with the sha256 of that file's bytes
    (recomputed here), so the same document sent under two boundaries has one fingerprint."""
    document = multipage_tiff([render([f"Counted page {n}"]).image for n in (1, 2, 3)])
    want = hashlib.sha256(document).hexdigest()

    def count(body: bytes, content_type: str, bound: int = 10) -> tuple[int, str]:
        return asyncio.run(pool.count_pages(DecodeRequest(body, content_type), bound, time.monotonic() + 60))

    assert count(document, "image/tiff") == (3, want)
    for boundary in ("first-boundary", "another-one"):
        # httpx writes the body under the boundary the Content-Type header names.
        sent = httpx.Request(
            "POST",
            "http://x",
            files={"file": ("doc.tiff", document, "image/tiff")},
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        )
        body = sent.read()
        assert f"--{boundary}".encode() in body
        assert count(body, sent.headers["content-type"]) == (3, want), boundary
    assert count(document, "image/tiff", bound=2)[0] == 2  # at most the bound


def test_only_a_task_its_backstop_ended_counts_as_killed_by_it():
    """The cancelled request's worker is counted killed by the backstop only when pebble's timeout ended the
    task: not when it finished (with a result or another error) or was cancelled."""
    done, failed, timed_out, cancelled = (Future() for _ in range(4))
    done.set_result(3)
    failed.set_exception(ValueError("not a backstop"))
    timed_out.set_exception(TimeoutError())
    cancelled.cancel()
    assert [_killed_by_backstop(f) for f in (done, failed, timed_out, cancelled)] == [
        False,
        False,
        True,
        False,
    ]
    assert not _killed_by_backstop(Future())  # still running: not asked for its exception (that would wait)


@pytest.mark.parametrize("idle", [False, True], ids=["interactive", "jobs"])
def test_only_the_job_pools_workers_run_at_the_job_priority(idle):
    settings = Settings(auth_disabled=True)
    # The interactive pool as the app makes it: without saying idle (its default).
    pool = (
        DecodePool.from_settings(settings, workers=1, idle=True)
        if idle
        else DecodePool.from_settings(settings, workers=1)
    )
    pool.start()
    try:
        pid = pool.probe().result(timeout=60)
        own = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, pid) == (JOB_NICE if idle else own)
    finally:
        pool.close()


@pytest.mark.parametrize(
    ("code", "reason", "error"),
    [
        (-signal.SIGXCPU, "cpu_limit", DecodeCpuLimit),
        (-signal.SIGKILL, "memory_limit", DecodeMemoryLimit),  # the kernel's or the cgroup's OOM kill
        (-signal.SIGABRT, "memory_limit", DecodeMemoryLimit),  # PDFium's allocator refused
        (OUT_OF_MEMORY_EXIT, "memory_limit", DecodeMemoryLimit),  # MemoryError in the worker
        (-signal.SIGSEGV, "crashed", InvalidDocument),
        (1, "crashed", InvalidDocument),
    ],
)
def test_how_a_worker_ended_says_what_the_client_is_told(pool, code, reason, error):
    got_reason, got_error = pool._expired(ProcessExpired("gone", code=code))
    assert (got_reason, type(got_error)) == (reason, error)


def test_a_task_past_its_deadline_is_ended_by_the_pools_own_backstop(pool):
    """Without the caller's asyncio deadline (an event loop too busy to fire it), pebble's timeout, timed from
    the same deadline, ends the worker: TimeoutError, counted as a deadline kill."""
    killed: list[str] = []
    pool.on_killed = killed.append
    with pytest.raises(TimeoutError):
        asyncio.run(pool._run(time.sleep, (120,), time.monotonic() + 0.5))
    assert killed == ["deadline"]


def _count_pages(request: DecodeRequest, tmp_path) -> int:
    return decode.count_document_pages(request, 5, 30)[0]


def _decode_pages(request: DecodeRequest, tmp_path) -> int:
    limits = Limits.from_settings(Settings(auth_disabled=True))
    return len(decode.decode_document(request, limits, 30, str(tmp_path / "t")))


@pytest.mark.parametrize("run", [_count_pages, _decode_pages], ids=["count", "decode"])
def test_the_cpu_soft_limit_starts_at_the_next_whole_second_of_use(monkeypatch, tmp_path, run):
    # Counting a document's pages and decoding them: 7.4 s of CPU used so far, a deadline of 30 s: the
    # soft limit is set at 8 + 30, then lifted (None).
    limits: list[int | None] = []
    monkeypatch.setattr(decode, "_cpu_used_s", lambda: 7.4)
    monkeypatch.setattr(decode, "_set_cpu_soft_limit", limits.append)
    assert run(DecodeRequest(multipage_tiff([render(["One"]).image]), "image/tiff"), tmp_path) == 1
    assert limits == [math.ceil(7.4) + 30, None]


def test_cpu_used_is_user_and_system_time():
    # Enough system time that user - system is far from user + system: stat() calls are the kernel's work.
    while resource.getrusage(resource.RUSAGE_SELF).ru_stime < 0.2:
        for _ in range(20_000):
            os.stat("/")
    before = time.process_time()  # the standard library's reading of the same (CLOCK_PROCESS_CPUTIME_ID)
    used = decode._cpu_used_s()
    assert before - 0.05 <= used <= time.process_time() + 0.05


def test_the_address_space_read_is_the_kernels_in_bytes():
    page = os.sysconf("SC_PAGE_SIZE")

    def statm() -> int:  # the same figure, in pages, from another file of the kernel's
        return int(Path("/proc/self/statm").read_text().split()[0]) * page

    for _ in range(10):  # a read between two equal ones (nothing mapped in between)
        first, got, last = statm(), decode._address_space(), statm()
        if first == last:
            assert got == first
            return
    pytest.fail("the address space kept changing")


def test_a_read_only_shm_puts_the_pages_in_the_temporary_directory(monkeypatch, tmp_path):
    def access(path, mode):  # /dev/shm there but not writable (a container's read-only mount)
        return not (path == "/dev/shm" and mode & os.W_OK)

    monkeypatch.setattr(decode.os, "access", access)
    monkeypatch.setattr(decode.tempfile, "tempdir", str(tmp_path))
    made = Path(_page_dir())
    assert made.parent == tmp_path, made
    made.rmdir()


def test_another_users_process_counts_alive(monkeypatch):
    def kill(pid, sig):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(decode.os, "kill", kill)
    assert decode._alive(12345)


def test_without_glibc_the_workers_keep_the_allocators_defaults(monkeypatch):
    def no_glibc(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(decode.ctypes, "CDLL", no_glibc)
    assert decode._keep_freed_memory() is None


def test_a_count_out_of_memory_ends_its_worker_as_a_decode_does(monkeypatch):
    """MemoryError under RLIMIT_AS while counting: the worker exits (OUT_OF_MEMORY_EXIT), as in a decode, so
    the parent answers DecodeMemoryLimit and the next document gets a fresh worker."""

    class Exited(Exception):
        pass

    def out_of_memory(*args):
        raise MemoryError

    def exit_out_of_memory():
        raise Exited

    monkeypatch.setattr(decode, "count_pages", out_of_memory)
    monkeypatch.setattr(decode, "_exit_out_of_memory", exit_out_of_memory)
    monkeypatch.setattr(decode, "_set_cpu_soft_limit", lambda limit: None)
    with pytest.raises(Exited):
        decode.count_document_pages(DecodeRequest(b"%PDF-", "application/pdf"), 5, 30)
