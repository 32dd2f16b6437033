"""`ocr-app jobs submit|status|result|cancel` as a user runs it (a subprocess: exit status, stdout, stderr)
against the real app and a real PostgreSQL (tests/postgres.py), through the fixtures of tests/test_jobs.py.

A dropped event stream is made by a proxy between the client and the app that cuts the first stream it
carries just after its first page event: with a reset, or with a clean end of the body (what an instance
that stops does to its streams)."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import socket
import ssl
import struct
import subprocess
import threading
import time

import pytest

from ocr_app import auth
from ocr_app.fleet.jobclient import iter_lines, iter_sse

from .docs import encode, render
from .server import OCR_APP
from .test_jobs import StallServer, doc, make_server, submit_ok, wait_status
from .test_pdf_format import pdftotext

PDF_TYPE = "application/pdf"


@pytest.fixture(scope="module")
def srv(tmp_path_factory, postgres):
    srv = make_server(
        StallServer,
        tmp_path_factory,
        postgres,
        "cli_jobs",
        engine="rapidocr",
        max_concurrency=2,
        job_range_pages=2,
        max_job_pages=10,
        max_jobs_in_flight=4,
    ).start(env={"STALL_CONTROL": str(tmp_path_factory.mktemp("stall-control"))})
    yield srv
    assert srv.stop() == 0, srv.logs()[-2000:]


def env_of(srv, url: str | None = None, key: str | None = "default") -> dict[str, str]:
    """The server's URL and key in the environment, as a user would export them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OCR_APP_")}
    env["OCR_APP_URL"] = url or srv.url
    if key:
        env["OCR_APP_KEY"] = srv.key if key == "default" else key
    return env


def cli(srv, *args, url: str | None = None, key: str | None = "default", timeout: float = 60):
    """`ocr-app jobs ARGS`."""
    return subprocess.run(
        [OCR_APP, "jobs", *map(str, args)],
        capture_output=True,
        text=True,
        env=env_of(srv, url, key),
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def ndjson(srv, job_id: str) -> list[dict]:
    with srv.client() as c:
        r = c.get(f"/v1/jobs/{job_id}/result", headers={"Accept": "application/x-ndjson"})
    assert r.status_code == 200, r.text
    return [json.loads(x) for x in r.text.splitlines()]


def lines(text: str) -> list[dict]:
    return [json.loads(x) for x in text.splitlines()]


def test_submit_follow_writes_every_page_once_in_order(srv, tmp_path):
    pdf = tmp_path / "three pages.pdf"
    pdf.write_bytes(doc(3, "f"))
    out = tmp_path / "out.jsonl"
    r = cli(srv, "submit", pdf, "--follow", "--output", out)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""  # the pages went to --output, progress to stderr
    job_id = r.stderr.split()[1]
    pages = lines(out.read_text())
    assert [p["page"] for p in pages] == [1, 2, 3]
    assert pages == ndjson(srv, job_id)  # each page as the service stored it
    assert "3 of 3 pages" in r.stderr and "done: 3 page(s)" in r.stderr
    assert srv.key not in r.stderr

    # `result` writes the same lines; to stdout without --output.
    again = cli(srv, "result", job_id)
    assert again.returncode == 0, again.stderr
    assert again.stdout == out.read_text()
    # --pages and stdout: only the pages asked for.
    some = cli(srv, "submit", pdf, "--pages", "1,3", "--follow")
    assert some.returncode == 0, some.stderr
    assert [p["page"] for p in lines(some.stdout)] == [1, 3]


def test_status_result_cancel(srv, tmp_path):
    pdf = tmp_path / "two.pdf"
    pdf.write_bytes(doc(2, "c"))
    srv.drain_file.touch()  # a draining instance claims nothing: the job stays queued
    try:
        r = cli(srv, "submit", pdf, "--idempotency-key", "cli-1")
        assert r.returncode == 0, r.stderr
        job_id = r.stdout.strip()
        assert "submitted" in r.stderr and f"ocr-app jobs status {job_id}" in r.stderr
        same = cli(srv, "submit", pdf, "--idempotency-key", "cli-1")
        assert (same.returncode, same.stdout.strip()) == (0, job_id)
        assert "Idempotency-Key" in same.stderr

        status = cli(srv, "status", job_id)
        assert status.returncode == 0, status.stderr
        body = json.loads(status.stdout)
        assert (body["job_id"], body["status"], body["pages"]["total"]) == (job_id, "queued", 2)

        early = cli(srv, "result", job_id)  # not finished: the server's 409, as it says it
        assert early.returncode == 1 and early.stdout == ""
        assert "HTTP 409 job_not_finished: the job is queued" in early.stderr
        assert "(request id " in early.stderr

        cancelled = cli(srv, "cancel", job_id)
        assert cancelled.returncode == 0, cancelled.stderr
        assert json.loads(cancelled.stdout)["status"] == "cancelled"
        assert "cancelled (0 of 2 pages read)" in cancelled.stderr
    finally:
        srv.drain_file.unlink(missing_ok=True)
    # A cancelled job has no page to give, and says so by its exit status.
    for args in (("result", job_id), ("result", job_id, "--follow")):
        after = cli(srv, *args)
        assert after.returncode == 1 and after.stdout == ""
        assert f"job {job_id}" in after.stderr and "ended cancelled: 0 page(s) written" in after.stderr


def test_errors_say_what_the_server_said_and_exit_1_or_2(srv, tmp_path):
    pdf = tmp_path / "one.pdf"
    pdf.write_bytes(doc(1, "e"))
    wrong = cli(srv, "submit", pdf, key="ocr_wrong-key-not-printed")
    assert wrong.returncode == 1 and wrong.stdout == ""
    assert wrong.stderr.startswith("ocr-app: HTTP 401 unauthorized: invalid API key")
    assert "(request id " in wrong.stderr and "ocr_wrong-key-not-printed" not in wrong.stderr
    assert "the server refused the API key: check --key / OCR_APP_KEY" in wrong.stderr
    missing = cli(srv, "status", "00000000-0000-0000-0000-000000000000")
    assert missing.returncode == 1 and "HTTP 404 not_found: no such job for this API key" in missing.stderr
    too_many = tmp_path / "eleven.pdf"
    too_many.write_bytes(doc(11, "x"))  # max_job_pages 10
    r = cli(srv, "submit", too_many)
    assert r.returncode == 1 and "HTTP 413 too_many_pages" in r.stderr and "max_job_pages" in r.stderr
    # --webhook-url reaches the server, which allows no receiver here.
    r = cli(srv, "submit", pdf, "--webhook-url", "http://127.0.0.1:9/hook")
    assert r.returncode == 1 and "HTTP 400 invalid_webhook" in r.stderr, r.stderr
    # The network: nothing listens there.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    r = cli(srv, "status", "00000000-0000-0000-0000-000000000000", url=closed)
    assert r.returncode == 1 and "ConnectError" in r.stderr
    # Usage: exit 2.
    assert cli(srv, "submit", tmp_path / "no-such.pdf").returncode == 2
    assert cli(srv, "status").returncode == 2
    assert cli(srv, "status", "x", url="localhost:8000").returncode == 2
    assert cli(srv, "status", "x", "--cacert", tmp_path / "no-ca.pem").returncode == 2


class CuttingProxy:
    """TCP from the client to the app, but the first `cuts` event streams are cut just after their first
    page event: mode `reset` (RST), `end` (the chunked body ends cleanly, as a stopping instance ends its
    streams) or `refuse` (every event-stream connection closed before an answer)."""

    def __init__(self, upstream_port: int, mode: str, cuts: int = 1):
        self.upstream_port, self.mode, self.cuts = upstream_port, mode, cuts
        self.heads: list[str] = []  # the first request head of each connection
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head and (chunk := conn.recv(65536)):
            head += chunk
        self.heads.append(head.decode(errors="replace"))
        events = b"/events " in head.split(b"\r\n", 1)[0]
        if events and self.mode == "refuse":
            conn.close()
            return
        up = socket.create_connection(("127.0.0.1", self.upstream_port))
        up.sendall(head)
        if events and self.cuts > 0:  # a GET: nothing more to send up; conn is this thread's alone
            self.cuts -= 1
            self._cut(up, conn)
            return
        threading.Thread(target=self._pump, args=(conn, up), daemon=True).start()
        self._pump(up, conn)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def _cut(self, up: socket.socket, conn: socket.socket) -> None:
        seen = b""
        while (start := seen.find(b"event: page\n")) < 0 or seen.find(b"\n\n", start) < 0:
            chunk = up.recv(65536)
            assert chunk, "the stream ended before a page event"
            seen += chunk
        end = seen.find(b"\n\n", start) + 2
        # Each event is one chunk of the chunked body: its CRLF follows the event's blank line.
        conn.sendall(seen[:end] + b"\r\n")
        if self.mode == "end":
            conn.sendall(b"0\r\n\r\n")
        else:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
        up.close()


@pytest.mark.parametrize("mode", ["reset", "end"])
def test_follow_resumes_a_dropped_stream_after_the_last_page(srv, mode):
    with srv.client() as c:
        job_id = submit_ok(c, doc(3, f"d{mode}"), headers={"Content-Type": PDF_TYPE}).json()["job_id"]
        wait_status(c, job_id, lambda b: b["status"] == "done")
    proxy = CuttingProxy(srv.port, mode)
    try:
        r = cli(srv, "result", job_id, "--follow", url=proxy.url)
    finally:
        proxy.close()
    assert r.returncode == 0, r.stderr
    assert [p["page"] for p in lines(r.stdout)] == [1, 2, 3]  # every page once, in order
    assert lines(r.stdout) == ndjson(srv, job_id)
    assert "resuming after page 1" in r.stderr
    streams = [h for h in proxy.heads if "/events " in h.splitlines()[0]]
    assert len(streams) == 2
    assert "last-event-id" not in streams[0].lower()
    assert "last-event-id: 1\r\n" in streams[1].lower()


def test_follow_gives_up_after_its_retries(srv):
    with srv.client() as c:
        job_id = submit_ok(c, doc(1, "g"), headers={"Content-Type": PDF_TYPE}).json()["job_id"]
    proxy = CuttingProxy(srv.port, "refuse")
    started = time.monotonic()
    try:
        r = cli(srv, "result", job_id, "--follow", "--retries", "2", url=proxy.url)
    finally:
        proxy.close()
    assert r.returncode == 1 and r.stdout == ""
    assert "the event stream failed 3 times without a page in between" in r.stderr
    assert f"ocr-app jobs result {job_id} --follow" in r.stderr
    assert len([h for h in proxy.heads if "/events " in h]) == 3
    assert time.monotonic() - started < 20  # 0.5 s, then 1 s between tries


def test_progress_is_one_line_per_page_off_a_terminal(srv, tmp_path):
    pdf = tmp_path / "two.pdf"
    pdf.write_bytes(doc(2, "p"))
    r = cli(srv, "submit", pdf, "--follow", "-o", tmp_path / "o.jsonl")
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr
    page_lines = [x for x in r.stderr.splitlines() if ": page " in x]
    assert [x.split(": page ", 1)[1] for x in page_lines] == ["1 (1 of 2 pages)", "2 (2 of 2 pages)"]


def test_progress_is_a_bar_redrawn_in_place_on_a_terminal(srv, tmp_path):
    pdf = tmp_path / "two.pdf"
    pdf.write_bytes(doc(2, "t"))
    master, terminal = pty.openpty()
    try:
        r = subprocess.run(
            [OCR_APP, "jobs", "submit", pdf, "--follow"],
            stdout=subprocess.PIPE,
            stderr=terminal,
            env=env_of(srv),
            timeout=60,
        )
        os.close(terminal)
        shown = b""
        with contextlib.suppress(OSError):  # EIO once the terminal is closed and read
            while chunk := os.read(master, 65536):
                shown += chunk
    finally:
        os.close(master)
    assert r.returncode == 0
    assert [json.loads(x)["page"] for x in r.stdout.splitlines()] == [1, 2]  # the pages: stdout only
    text = shown.decode()
    job_id = text.split()[1]
    # Redrawn in place (CR, erase to the end of the line) with the id's first 8 characters, then a last line.
    assert f"\rjob {job_id[:8]}: [" + "#" * 15 + "." * 15 + "] 1 of 2 pages" in text
    assert f"\rjob {job_id[:8]}: [" + "#" * 30 + "] 2 of 2 pages" in text and "\x1b[K" in text
    assert text.rstrip().endswith(f"job {job_id}: done: 2 page(s)")


# --- the SSE parser and line splitter, on what a stream may hold -------------------------------------------


def test_sse_parser_reads_the_standard_s_cases():
    raw = [
        b': comment\r\nid: 1\r\nevent: page\r\ndata: {"text": "a\xe2\x80',  # U+2028, split mid-character
        b'\xa8b\xc2\x85c"}\r',  # ...and U+0085, then a CR whose LF comes in the next chunk
        b"\n\r\nevent: progress\ndata: x\ndata:y\n\ndata\n\n",
        b"id: 2\0\nevent: done\ndata: {}\n\nevent: cut\ndata: z",
    ]
    events = list(iter_sse(iter_lines(raw)))
    assert [(e.event, e.data, e.id) for e in events] == [
        ("page", '{"text": "a\u2028b\u0085c"}', "1"),
        ("progress", "x\ny", "1"),  # the last event id carries over; one leading space dropped
        ("message", "", "1"),
        ("done", "{}", "1"),  # an id holding NUL is ignored; an event without its blank line is dropped
    ]
    assert list(iter_lines([b"a\rb\r", b"\r\nc"])) == ["a", "b", "", "c"]


def test_help_names_the_commands_and_exit_statuses():
    r = subprocess.run([OCR_APP, "jobs", "--help"], capture_output=True, text=True, timeout=30)
    commands = ("submit", "status", "result", "cancel", "list", "wait")
    assert r.returncode == 0 and all(c in r.stdout for c in commands)
    text = " ".join(r.stdout.split())
    assert "Exit 0: the job is done with every page read" in text and "2: a usage error" in text


# --- many documents, stdin, list, wait, what errors say -----------------------------------------------------

ACCEPTED = "accepted types: PNG, JPEG, WEBP, TIFF, BMP, PDF"


def png(seed: str) -> bytes:
    return encode(render([f"{seed} picture"], size=28, width=500).image, "PNG")


def new_key(srv, name: str) -> str:
    """A key of its own: its jobs, its max_jobs_in_flight (the server reads the keys file again)."""
    return auth.add_key(srv.keys_file, name)


def closed_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_submit_a_folder_skips_what_is_not_a_document_and_follows_into_dir(srv, tmp_path):
    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.pdf").write_bytes(doc(1, "b"))
    (folder / "sub" / "a.pdf").write_bytes(doc(2, "a"))
    (folder / "sub" / "c.png").write_bytes(png("c"))
    (folder / "notes.txt").write_text("not a document")
    (folder / "empty.pdf").write_bytes(b"")
    out = tmp_path / "out"
    r = cli(srv, "submit", folder, "--follow", "-o", out)
    assert r.returncode == 0, r.stderr
    rows = [x.split("\t") for x in r.stdout.splitlines()]  # JOB_ID<TAB>PATH, in the folder's sorted order
    assert [p for _, p in rows] == [str(folder / n) for n in ("b.pdf", "sub/a.pdf", "sub/c.png")]
    assert f"skipped {folder / 'empty.pdf'}: empty file: nothing to read ({ACCEPTED})" in r.stderr
    why = "not a document of an accepted type (PNG, JPEG, WEBP, TIFF, BMP, PDF)"
    assert f"skipped {folder / 'notes.txt'}: {why}" in r.stderr
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert written == ["b.pdf.jsonl", "sub/a.pdf.jsonl", "sub/c.png.jsonl"]
    for (job_id, path), pages in zip(rows, (1, 2, 1), strict=True):
        got = lines((out / f"{os.path.relpath(path, folder)}.jsonl").read_text())
        assert got == ndjson(srv, job_id) and len(got) == pages

    # Usage, before any request (nothing listens at the URL): -o with a folder needs --follow and a
    # directory; a file named that is empty or not a document names the accepted types.
    nowhere = closed_url()
    no_follow = cli(srv, "submit", folder, "-o", out, url=nowhere)
    assert no_follow.returncode == 2 and "add --follow" in no_follow.stderr
    a_file = cli(srv, "submit", folder, "--follow", "-o", folder / "b.pdf", url=nowhere)
    assert a_file.returncode == 2 and "not a directory" in a_file.stderr
    empty = cli(srv, "submit", folder / "empty.pdf", url=nowhere)
    assert empty.returncode == 2 and f"empty file: nothing to read ({ACCEPTED})" in empty.stderr
    text = cli(srv, "submit", folder / "notes.txt", url=nowhere)
    assert text.returncode == 2 and "not a document of an accepted type (PNG, JPEG" in text.stderr


def test_submit_a_folder_larger_than_the_key_s_job_limit(srv, tmp_path):
    """max_jobs_in_flight is 4: while the instance drains, 4 jobs stay queued and the fifth gets 429; the CLI
    waits for one to finish (none does until the drain ends) and then submits it."""
    key = new_key(srv, "cli-limit")
    folder = tmp_path / "five"
    folder.mkdir()
    for n in range(5):
        (folder / f"{n}.pdf").write_bytes(doc(1, f"l{n}"))
    srv.drain_file.touch()
    try:
        proc = subprocess.Popen(
            [OCR_APP, "jobs", "submit", str(folder)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env_of(srv, key=key),
        )
        assert proc.stderr is not None
        seen = []
        while "waiting for a job to finish" not in (line := proc.stderr.readline()):
            assert line, "".join(seen)
            seen.append(line)
        assert "HTTP 429 too_many_jobs" in line and str(folder / "4.pdf") in line
    finally:
        srv.drain_file.unlink(missing_ok=True)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    rows = [x.split("\t") for x in stdout.splitlines()]
    assert [p for _, p in rows] == [str(folder / f"{n}.pdf") for n in range(5)]
    assert len({j for j, _ in rows}) == 5 and "5 submitted, 0 not accepted" in stderr


def test_submit_stdin(srv, tmp_path):
    r = subprocess.run(
        [OCR_APP, "jobs", "submit", "-", "--follow"],
        input=png("stdin"),
        capture_output=True,
        env=env_of(srv),
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    job_id = r.stderr.decode().split()[1]
    assert lines(r.stdout.decode()) == ndjson(srv, job_id) and len(ndjson(srv, job_id)) == 1
    empty = subprocess.run(
        [OCR_APP, "jobs", "submit", "-"], input=b"", capture_output=True, env=env_of(srv), timeout=60
    )
    assert empty.returncode == 2 and b"stdin is empty: send one of PNG, JPEG" in empty.stderr


def test_list_and_wait(srv):
    key = new_key(srv, "cli-list")
    with srv.client(key) as c:
        first, second = (submit_ok(c, doc(1, f"w{n}")).json()["job_id"] for n in range(2))
    # wait: each job as it ends, exit 0 when all are done with every page.
    r = cli(srv, "wait", first, second, key=key)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == sorted([f"{first}\tdone\t1/1", f"{second}\tdone\t1/1"])

    table = cli(srv, "list", key=key)
    assert table.returncode == 0, table.stderr
    rows = table.stdout.splitlines()
    assert rows[0].split() == ["JOB", "STATUS", "PAGES", "CREATED"]
    assert [x.split()[:3] for x in rows[1:]] == [
        [second, "done", "1/1"],
        [first, "done", "1/1"],
    ]  # newest first
    one = cli(srv, "list", "--limit", "1", "--json", key=key)
    assert [j["job_id"] for j in json.loads(one.stdout)["jobs"]] == [second] and "--all" in one.stderr
    every = cli(srv, "list", "--limit", "1", "--all", "--json", key=key)  # follows next_cursor
    assert [j["job_id"] for j in json.loads(every.stdout)["jobs"]] == [second, first]
    other = cli(srv, "list", "--json", key=new_key(srv, "cli-list-other"))
    assert other.returncode == 0 and json.loads(other.stdout) == {"jobs": [], "next_cursor": None}

    # A job that never ends here (the instance drains): --timeout says so; a cancelled job exits 1.
    srv.drain_file.touch()
    try:
        with srv.client(key) as c:
            stuck = submit_ok(c, doc(1, "w-stuck")).json()["job_id"]
            queued = cli(srv, "list", "--status", "queued", "--status", "running", "--json", key=key)
            assert [j["job_id"] for j in json.loads(queued.stdout)["jobs"]] == [stuck]
            late = cli(srv, "wait", first, stuck, "--timeout", "0.3", key=key)
            assert late.returncode == 1 and late.stdout == f"{first}\tdone\t1/1\n"
            assert f"--timeout 0.3 s passed; not finished yet: {stuck}" in late.stderr
            assert c.delete(f"/v1/jobs/{stuck}").json()["status"] == "cancelled"
    finally:
        srv.drain_file.unlink(missing_ok=True)
    cancelled = cli(srv, "wait", stuck, key=key)
    assert (
        cancelled.returncode == 1 and f"job {stuck} ended cancelled: 0 of 1 page(s) read" in cancelled.stderr
    )


def test_a_certificate_not_trusted_names_cacert(tmp_path):
    """An HTTPS server whose certificate no CA of the client signed: the message says what to pass."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *(
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
            ),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):  # ssl.SSLError too: the client gives up on the certificate
            conn, _ = server.accept()
            with conn:
                context.wrap_socket(conn, server_side=True).close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        url = f"https://127.0.0.1:{server.getsockname()[1]}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("OCR_APP_")}
        r = subprocess.run(
            [OCR_APP, "jobs", "list", "--url", url, "--key", "k"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
    finally:
        server.close()
    assert r.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in r.stderr
    assert "pass --cacert FILE (or set OCR_APP_CA_FILE)" in r.stderr


def test_a_url_is_sent_for_the_server_to_fetch():
    """An http(s) argument is not read here: POST /v1/jobs carries {"url": ...} as JSON."""
    import argparse

    import httpx

    from ocr_app.fleet.submission import gather, post

    docs, skipped, many = gather(["https://example.org/scans/a.pdf"])
    assert (skipped, many, docs[0].name) == ([], False, "example.org_scans_a.pdf")
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(202, json={"job_id": "j"})

    args = argparse.Namespace(idempotency_key=None, pages="1-2", webhook_url=None)
    with httpx.Client(base_url="http://ocr", transport=httpx.MockTransport(answer)) as client:
        assert post(client, docs[0], args).status_code == 202
    assert sent[0].headers["content-type"] == "application/json" and sent[0].url.params["pages"] == "1-2"
    assert json.loads(sent[0].content) == {"url": "https://example.org/scans/a.pdf"}


def result_in(srv, job_id: str, fmt: str) -> bytes:
    with srv.client() as c:
        r = c.get(f"/v1/jobs/{job_id}/result", params={"format": fmt})
    assert r.status_code == 200, r.text
    return r.content


def test_format_writes_a_file_per_document_with_its_extension(srv, tmp_path):
    """--format: the server's result in that format, a file each under -o DIR (<path><extension>), or one
    file (-o) or stdout for a job; JSON Lines stay the default."""
    from ocr_app.fleet.jobclient import EXTENSIONS
    from ocr_app.ocr import formats

    assert list(EXTENSIONS) == list(formats.FORMATS)  # the client names every format the server has
    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.pdf").write_bytes(doc(1, "b"))
    (folder / "sub" / "a.pdf").write_bytes(doc(2, "a"))
    out = tmp_path / "out"
    r = cli(srv, "submit", folder, "--follow", "--format", "text", "-o", out)
    assert r.returncode == 0, r.stderr
    rows = [x.split("\t") for x in r.stdout.splitlines()]
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert written == ["b.pdf.txt", "sub/a.pdf.txt"]
    for job_id, path in rows:
        got = (out / f"{os.path.relpath(path, folder)}.txt").read_bytes()
        assert got == result_in(srv, job_id, "text") and got.count(b"\f") == (1 if "a.pdf" in path else 0)

    job_id = rows[1][0]
    r = cli(srv, "result", job_id, "--format", "pdf", "-o", tmp_path / "a.pdf")
    assert r.returncode == 0, r.stderr
    # The same PDF (not byte for byte: the layer's font carries its creation time).
    got, want = (
        pdftotext((tmp_path / "a.pdf").read_bytes(), tmp_path),
        pdftotext(result_in(srv, job_id, "pdf"), tmp_path),
    )
    assert got == want and len(got) == 2
    r = subprocess.run(
        [OCR_APP, "jobs", "result", job_id, "--format", "markdown"], capture_output=True, env=env_of(srv)
    )
    assert r.returncode == 0 and r.stdout == result_in(srv, job_id, "markdown")
    one = cli(srv, "submit", folder / "b.pdf", "--follow", "--format", "alto", "-o", tmp_path / "b.xml")
    assert one.returncode == 0, one.stderr
    assert (tmp_path / "b.xml").read_bytes().startswith(b'<?xml version="1.0"')
    r = cli(srv, "result", job_id)  # JSON Lines, as before
    assert r.returncode == 0 and lines(r.stdout) == ndjson(srv, job_id)
    bad = cli(srv, "result", job_id, "--format", "docx")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
