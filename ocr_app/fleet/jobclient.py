"""`ocr-app jobs submit|status|result|cancel|list|wait`: a client of a running service's bulk jobs.

Results are JSON Lines: one page per line, in page order, each as `/v1/ocr` returns it, or
`{"page", "error": {"code", "message"}}` for a page that could not be read; the lines of
`GET /v1/jobs/{id}/result` with `Accept: application/x-ndjson`. `--follow` reads the job's Server-Sent
Events instead and writes each page as it arrives; a stream that drops (a reset, a timeout, an instance
that stops and ends its streams) is resumed with `Last-Event-ID` set to the last page written, so no page
is written twice or skipped. Progress goes to stderr, the pages to stdout or `--output`.

With `--format` (json, text, markdown, hocr, alto, pdf) the result is `GET /v1/jobs/{id}/result?format=`
instead, written as the server sends it once the job is finished (`--follow` waits for it, showing
progress); a folder's documents go into `-o DIR` as DIR/<path><extension> (EXTENSIONS).

Exit status: 0 when the job is done with every page read; 1 on an error from the server (its message and
request id are printed) or the network, or a job that ended without every page read (cancelled, failed,
expired, a page error); 2 on a usage error. The API key is sent, never printed.
"""

from __future__ import annotations

import argparse
import codecs
import json
import os
import re
import ssl
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ..config import ConfigError

if TYPE_CHECKING:
    import httpx

NDJSON = "application/x-ndjson"
# --format: the name of each result file under -o DIR ends so (JSON Lines without --format: .jsonl). The
# server's formats (ocr_app/ocr/formats/), named here without importing them (pikepdf and the like).
EXTENSIONS = {
    "json": ".json",
    "text": ".txt",
    "markdown": ".md",
    "hocr": ".hocr",
    "alto": ".xml",
    "pdf": ".pdf",
}
# Answers a later try may not get: the instance is loading, draining or overloaded, or the load balancer
# found no instance. Anything else (401, 404, ...) will not change by asking again.
RETRYABLE = {502, 503, 504}
_EOL = re.compile(r"\r\n|\r|\n")


class ClientError(Exception):
    """A server's error answer or a transport failure: printed, exit 1."""


# --- Server-Sent Events ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    event: str
    data: str
    id: str | None  # the last event ID (the HTML standard's buffer: it carries over to later events)
    retry_ms: int | None


def iter_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """UTF-8 text split at CRLF, CR or LF only (text/event-stream's line ends; str.splitlines, and so
    httpx's iter_lines, also split at U+2028 or U+0085, which a page's JSON may hold unescaped). A last line
    without its end is yielded too: the SSE parser drops an unfinished event anyway."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending: list[str] = []
    after_cr = False  # the last chunk ended with CR: a LF first in the next one belongs to it
    for chunk in chunks:
        text = decoder.decode(chunk)
        if after_cr and text.startswith("\n"):
            text = text[1:]
        if not text:
            continue
        after_cr = text.endswith("\r")
        *ended, rest = _EOL.split(text)
        for piece in ended:
            pending.append(piece)
            yield "".join(pending)
            pending = []
        pending.append(rest)
    pending.append(decoder.decode(b"", final=True))
    if last := "".join(pending):
        yield last


def iter_sse(lines: Iterable[str]) -> Iterator[Event]:
    """The events of a text/event-stream, parsed as the HTML standard says: `field: value` lines (one space
    after the colon dropped), `:` comments ignored, data lines joined by LF, an event dispatched at a blank
    line and only if it has data, `id` kept for later events unless it holds NUL, `retry` in milliseconds."""
    name, last_id, retry = "", None, None
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield Event(name or "message", "\n".join(data), last_id, retry)
            name, data = "", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
        elif field == "id":
            if "\0" not in value:
                last_id = value
        elif field == "retry" and value.isascii() and value.isdigit():
            retry = int(value)


# --- answers and errors ---------------------------------------------------------------------------------


_SECONDS = re.compile(r"[0-9]{1,9}")


def retry_after_s(r: httpx.Response, cap_s: float, now: datetime | None = None) -> float | None:
    """How long the answer's Retry-After asks to wait, at most `cap_s`: seconds or an HTTP date (RFC 9110
    10.2.3); None without one or with one that is neither (then the caller's own pause holds)."""
    value = r.headers.get("retry-after", "").strip()
    if _SECONDS.fullmatch(value):
        return min(float(value), cap_s)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000": UTC, as HTTP dates are
        when = when.replace(tzinfo=UTC)
    return min(max((when - (now or datetime.now(UTC))).total_seconds(), 0.0), cap_s)


def server_error(r: httpx.Response) -> ClientError:
    """The API's JSON error as one line: status, code, message, request id (or what a proxy answered)."""
    request_id = r.headers.get("x-request-id")
    try:
        err = r.json()["error"]
        code, message = str(err["code"]), str(err["message"])
        request_id = err.get("request_id") or request_id
    except (ValueError, KeyError, TypeError):
        code, message = "", " ".join(r.text.split())[:200] or r.reason_phrase
    text = f"HTTP {r.status_code}{f' {code}' if code else ''}: {message}"
    if request_id:
        text += f" (request id {request_id})"
    if retry := r.headers.get("retry-after"):
        text += f"; retry after {retry} s"
    if r.status_code == 401:
        text += "; the server refused the API key: check --key / OCR_APP_KEY"
    return ClientError(text)


def _expect(r: httpx.Response, status: int) -> dict[str, Any]:
    if r.status_code != status:
        raise server_error(r)
    try:
        body: dict[str, Any] = r.json()
        return body
    except ValueError:
        raise ClientError(f"HTTP {r.status_code}: not JSON: {r.text[:200]!r}") from None


def _line(data: str) -> tuple[str, int, dict[str, Any] | None]:
    """A page (or page error) as one JSON line, its page number, and its error if it is one."""
    try:
        page = json.loads(data)
        number = int(page["page"])
    except (ValueError, KeyError, TypeError):
        raise ClientError(f"the server sent a page that is not one: {data[:200]!r}") from None
    error = page.get("error") if "text" not in page else None
    return json.dumps(page, ensure_ascii=False), number, error


# --- progress, on stderr --------------------------------------------------------------------------------


class Progress:
    """A bar redrawn in place on a terminal; elsewhere (a log, a pipe) one line per page."""

    WIDTH = 30

    def __init__(self, job_id: str, stream: IO[str] | None = None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.job_id = job_id
        self.label = f"job {job_id}"
        self.total: int | None = None
        self.done = 0
        self.status = ""
        self.drawn = False

    def _columns(self) -> int:
        try:
            return os.get_terminal_size(self.stream.fileno()).columns or 80
        except (OSError, ValueError):
            return 80

    def _of(self) -> str:
        return f"{self.done} of {self.total if self.total is not None else '?'} pages"

    def update(self, status: str | None = None, page: int | None = None) -> None:
        if self.tty:
            self.status = status or self.status
            filled = int(self.WIDTH * self.done / self.total) if self.total else 0
            bar = "#" * filled + "." * (self.WIDTH - filled)
            # The id's first 8 characters: the line must fit the terminal to be redrawn in place.
            line = f"job {self.job_id[:8]}: [{bar}] {self._of()} {self.status}"
            self.stream.write(f"\r{line[: max(self._columns() - 1, 20)]}\x1b[K")
            self.drawn = True
        elif page is not None:
            self.stream.write(f"{self.label}: page {page} ({self._of()})\n")
        elif status is not None:
            self.stream.write(f"{self.label}: {status} ({self._of()})\n")
        self.stream.flush()

    def say(self, message: str) -> None:
        if self.drawn:
            self.stream.write("\n")
            self.drawn = False
        self.stream.write(f"{self.label}: {message}\n")
        self.stream.flush()


# --- the commands ---------------------------------------------------------------------------------------


@dataclass
class Outcome:
    status: str
    pages: int = 0
    errors: list[tuple[int, dict[str, Any]]] | None = None

    def verdict(self, job_id: str) -> tuple[int, str]:
        """Exit status and the closing line for stderr."""
        errors = self.errors or []
        if self.status != "done":
            return 1, f"job {job_id} ended {self.status}: {self.pages} page(s) written"
        if errors:
            listed = "; ".join(f"page {n}: {e.get('code')}: {e.get('message')}" for n, e in errors[:5])
            more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
            return 1, f"job {job_id} done: {len(errors)} of {self.pages} page(s) not read: {listed}{more}"
        return 0, f"job {job_id} done: {self.pages} page(s)"


def _open_output(path: str | None) -> IO[str]:
    if not path or path == "-":
        return sys.stdout
    try:
        return open(path, "w", encoding="utf-8")  # closed by the caller
    except OSError as err:
        raise ConfigError(f"cannot write {path}: {err.strerror}") from None


def follow(
    client: httpx.Client,
    job_id: str,
    out: IO[str],
    progress: Progress,
    retries: int = 5,
    after: int = 0,
    sleep: Callable[[float], None] = time.sleep,
) -> Outcome:
    """Write each page of the job's event stream as a line of `out`, from the page after `after`, until
    its `done` event; a stream that fails or ends before `done` is opened again with Last-Event-ID, up to
    `retries` times in a row without a page arriving in between."""
    import httpx

    outcome = Outcome("running", errors=[])
    assert outcome.errors is not None
    last = after
    failures = 0
    delay = 0.5
    while True:
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-store"}
        if last:
            headers["Last-Event-ID"] = str(last)
        try:
            with client.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as r:
                if r.status_code != 200:
                    r.read()
                    err = server_error(r)
                    if r.status_code not in RETRYABLE:
                        raise err
                    reason = str(err)
                    if (wait := retry_after_s(r, 30.0)) is not None:
                        delay = max(delay, wait)
                else:
                    reason = "the stream ended before the job did"
                    for ev in iter_sse(iter_lines(r.iter_bytes())):
                        if ev.retry_ms is not None:
                            delay = ev.retry_ms / 1000
                        if ev.event == "progress":
                            info = json.loads(ev.data)
                            progress.total = info.get("pages_total", progress.total)
                            progress.update(status=info.get("status"))
                        elif ev.event in ("page", "page_error"):
                            line, page, error = _line(ev.data)
                            if page <= last:  # already written: never twice
                                continue
                            out.write(line + "\n")
                            out.flush()
                            last, failures = page, 0
                            outcome.pages += 1
                            if error is not None:
                                outcome.errors.append((page, error))
                            progress.done += 1
                            progress.update(page=page)
                        elif ev.event == "done":
                            outcome.status = json.loads(ev.data).get("status", "done")
                            return outcome
                        elif ev.event == "unavailable":  # the service's job database is away for now
                            reason = json.loads(ev.data).get("message", "the job database is away")
        except httpx.TransportError as err:  # reset, refused, timed out, cut mid-body
            reason = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        failures += 1
        if failures > retries:
            raise ClientError(
                f"the event stream failed {failures} times without a page in between ({reason}); the job "
                f"goes on: `ocr-app jobs result {job_id} --follow` picks it up"
            )
        progress.say(f"event stream lost ({reason}); resuming after page {last} in {delay:g} s")
        sleep(delay)
        delay = min(delay * 2, 10.0)


def fetch_format(client: httpx.Client, job_id: str, fmt: str, path: str | Path | None) -> Outcome:
    """The finished job's result in `fmt`, written to `path` (stdout: None or -) as the server sends it;
    the job's outcome from its status."""
    with client.stream("GET", f"/v1/jobs/{job_id}/result", params={"format": fmt}) as r:
        if r.status_code != 200:
            r.read()
            raise server_error(r)
        to_stdout = path is None or str(path) in ("", "-")
        try:
            out: IO[bytes] = sys.stdout.buffer if path is None or to_stdout else open(path, "wb")  # noqa: SIM115
        except OSError as err:
            raise ConfigError(f"cannot write {path}: {err.strerror}") from None
        try:
            for chunk in r.iter_bytes():
                out.write(chunk)
        finally:
            out.flush()
            if not to_stdout:
                out.close()
    body = _expect(client.get(f"/v1/jobs/{job_id}"), 200)
    errors = [(e["page"], e["error"]) for e in body.get("errors", [])]
    pages = body.get("pages", {})
    return Outcome(body["status"], pages.get("done", 0) + pages.get("failed", 0), errors)


def follow_format(
    client: httpx.Client, job_id: str, fmt: str, path: str | Path | None, progress: Progress, retries: int
) -> Outcome:
    """--follow --format: the job's events for progress (their pages not kept), then its result in fmt."""
    with open(os.devnull, "w", encoding="utf-8") as sink:
        followed = follow(client, job_id, sink, progress, retries=retries)
    if followed.status == "expired":
        return followed
    return fetch_format(client, job_id, fmt, path)


def _follow_to(client: httpx.Client, job_id: str, args: argparse.Namespace) -> int:
    progress = Progress(job_id)
    if getattr(args, "format", None):
        try:
            outcome = follow_format(client, job_id, args.format, args.output, progress, args.retries)
        except KeyboardInterrupt:
            progress.say(f"interrupted; the job goes on: `ocr-app jobs result {job_id} --follow`")
            return 130
        rc, message = outcome.verdict(job_id)
        progress.say(message.removeprefix(f"job {job_id} "))
        return rc
    out = _open_output(args.output)
    try:
        outcome = follow(client, job_id, out, progress, retries=args.retries)
    except KeyboardInterrupt:
        progress.say(f"interrupted; the job goes on: `ocr-app jobs result {job_id} --follow`")
        return 130
    finally:
        if out is not sys.stdout:
            out.close()
    rc, message = outcome.verdict(job_id)
    progress.say(message.removeprefix(f"job {job_id} "))
    return rc


def status(client: httpx.Client, args: argparse.Namespace) -> int:
    print(json.dumps(_expect(client.get(f"/v1/jobs/{args.job_id}"), 200), indent=2))
    return 0


def cancel(client: httpx.Client, args: argparse.Namespace) -> int:
    body = _expect(client.delete(f"/v1/jobs/{args.job_id}"), 200)
    print(json.dumps(body, indent=2))
    pages = body.get("pages", {})
    print(
        f"job {args.job_id}: {body.get('status')} ({pages.get('done', 0)} of {pages.get('total', '?')} "
        "pages read)",
        file=sys.stderr,
    )
    return 0


def result(client: httpx.Client, args: argparse.Namespace) -> int:
    if args.follow:
        return _follow_to(client, args.job_id, args)
    if args.format:
        outcome = fetch_format(client, args.job_id, args.format, args.output)
        rc, message = outcome.verdict(args.job_id)
        print(message, file=sys.stderr)
        return rc
    with client.stream("GET", f"/v1/jobs/{args.job_id}/result", headers={"Accept": NDJSON}) as r:
        if r.status_code != 200:
            r.read()
            raise server_error(r)
        # The job is finished (else 409): its status for the verdict, read once the lines are written.
        outcome = Outcome("done", errors=[])
        assert outcome.errors is not None
        out = _open_output(args.output)
        try:
            for text in iter_lines(r.iter_bytes()):
                if not text:
                    continue
                line, page, error = _line(text)
                out.write(line + "\n")
                outcome.pages += 1
                if error is not None:
                    outcome.errors.append((page, error))
        finally:
            if out is not sys.stdout:
                out.close()
            else:
                out.flush()
    outcome.status = _expect(client.get(f"/v1/jobs/{args.job_id}"), 200)["status"]
    rc, message = outcome.verdict(args.job_id)
    print(message, file=sys.stderr)
    return rc


def submit(client: httpx.Client, args: argparse.Namespace) -> int:
    from .submission import submit

    return submit(client, args)


def list_jobs(client: httpx.Client, args: argparse.Namespace) -> int:
    from .joblist import list_jobs

    return list_jobs(client, args)


def wait(client: httpx.Client, args: argparse.Namespace) -> int:
    from .joblist import wait

    return wait(client, args)


COMMANDS = {
    "submit": submit,
    "status": status,
    "result": result,
    "cancel": cancel,
    "list": list_jobs,
    "wait": wait,
}


def tls_failure(err: BaseException) -> bool:
    """A certificate the client could not verify: its cause, or its message (another TLS stack's)."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def run(args: argparse.Namespace, make_client: Callable[[argparse.Namespace], httpx.Client]) -> int:
    """`ocr-app jobs ...`: the server's and the network's errors as one line on stderr, exit 1."""
    import httpx

    if not re.match(r"^https?://", args.url):
        raise ConfigError(f"--url {args.url!r}: give it as http://HOST:PORT or https://HOST")
    if args.cacert and not Path(args.cacert).is_file():
        raise ConfigError(f"--cacert {args.cacert}: no such file")
    if getattr(args, "retries", 0) < 0:
        raise ConfigError("--retries: 0 or more")
    try:
        with make_client(args) as client:
            return COMMANDS[args.jobs_cmd](client, args)
    except ClientError as err:
        print(f"ocr-app: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except httpx.TransportError as err:
        hint = ""
        if tls_failure(err):
            hint = (
                "; the server's TLS certificate could not be verified: pass --cacert FILE (or set "
                "OCR_APP_CA_FILE), the CA that signed it"
            )
        print(f"ocr-app: {args.url}: {type(err).__name__}: {err}{hint}", file=sys.stderr)
        return 1
