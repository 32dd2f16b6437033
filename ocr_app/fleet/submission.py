"""`ocr-app jobs submit`: files, folders (walked recursively, each document by its bytes), `-` for stdin and
URLs as jobs, within the key's max_jobs_in_flight.

A folder's files that are not documents of an accepted type (or are empty) are listed as skipped on stderr;
a file named on the command line that is not one is a usage error, before any request. When the server
answers 429 too_many_jobs, the rest wait for one of this batch's jobs to finish (with --follow: the oldest
one not yet followed is followed) or for the answer's Retry-After, then go: a batch never fails for 429.
One document prints its job id; several print `JOB_ID<TAB>SOURCE` a line. With several, `--follow -o DIR`
writes each document's pages into DIR/<its path under the folder>.jsonl (with --format: the format's
extension, jobclient.EXTENSIONS, e.g. .txt).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import ConfigError
from ..documents.upload import RASTER_TYPES, sniff
from .jobclient import (
    EXTENSIONS,
    Progress,
    _expect,
    _follow_to,
    follow,
    follow_format,
    retry_after_s,
    server_error,
)

if TYPE_CHECKING:
    import httpx

ACCEPTED = ", ".join([*RASTER_TYPES.values(), "PDF"])  # the server's SUPPORTED_TYPES, by name
URL_RE = re.compile(r"^https?://", re.IGNORECASE)
FINISHED = ("done", "failed", "cancelled")
# The server answers 429 with Retry-After; without one, this long at most between two tries.
DEFAULT_WAIT_S = 10.0


@dataclass(frozen=True)
class Document:
    source: str  # as the user named it: a path, `-` or a URL
    name: str  # its result file under -o DIR, less `.jsonl`
    content_type: str
    path: Path | None = None
    data: bytes | None = None
    url: str | None = None


@dataclass
class Submitted:
    doc: Document
    job_id: str
    finished: bool = False
    followed: bool = False


def _kind(path: Path) -> tuple[str | None, str]:
    """The file's media type, or None and why it is not sent."""
    try:
        with path.open("rb") as f:
            head = f.read(1024)
    except OSError as err:
        return None, f"cannot read it: {err.strerror}"
    if not head:
        return None, f"empty file: nothing to read (accepted types: {ACCEPTED})"
    kind = sniff(head)
    return kind, "" if kind else f"not a document of an accepted type ({ACCEPTED})"


def gather(sources: list[str]) -> tuple[list[Document], list[tuple[str, str]], bool]:
    """The documents to submit, the folder files skipped (and why), and whether there are several."""
    docs: list[Document] = []
    skipped: list[tuple[str, str]] = []
    folder = False
    for src in sources:
        if URL_RE.match(src):
            name = re.sub(r"[^A-Za-z0-9._-]+", "_", src.split("://", 1)[1]).strip("_") or "url"
            docs.append(Document(src, name, "application/json", url=src))
        elif src == "-":
            data = sys.stdin.buffer.read()
            kind = sniff(data)
            if not data or kind is None:
                what = "empty" if not data else "not a document of an accepted type"
                raise ConfigError(f"-: stdin is {what}: send one of {ACCEPTED}")
            docs.append(Document("-", "stdin", kind, data=data))
        elif (root := Path(src)).is_dir():
            folder = True
            for path in sorted(p for p in root.rglob("*") if p.is_file()):
                kind, why = _kind(path)
                if kind is None:
                    skipped.append((str(path), why))
                else:
                    docs.append(Document(str(path), path.relative_to(root).as_posix(), kind, path=path))
        elif not root.exists():
            raise ConfigError(f"cannot read {src}: no such file or directory")
        else:
            kind, why = _kind(root)
            if kind is None:
                raise ConfigError(f"{src}: {why}")
            docs.append(Document(src, root.name, kind, path=root))
    return docs, skipped, folder or len(docs) > 1


def post(client: httpx.Client, doc: Document, args: argparse.Namespace) -> httpx.Response:
    headers = {"Content-Type": doc.content_type}
    if args.idempotency_key:
        headers["Idempotency-Key"] = args.idempotency_key
    params = {k: v for k, v in (("pages", args.pages), ("webhook_url", args.webhook_url)) if v} or None
    if doc.url is not None:  # the server fetches it
        return client.post("/v1/jobs", json={"url": doc.url}, headers=headers, params=params)
    if doc.data is not None:
        return client.post("/v1/jobs", content=doc.data, headers=headers, params=params)
    assert doc.path is not None
    with doc.path.open("rb") as f:  # streamed in chunks (with its Content-Length), never read whole
        return client.post("/v1/jobs", content=f, headers=headers, params=params)


def _too_many_jobs(r: httpx.Response) -> bool:
    if r.status_code != 429:
        return False
    try:
        return bool(r.json()["error"]["code"] == "too_many_jobs")
    except (ValueError, KeyError, TypeError):
        return False


class Batch:
    """Several documents: submitted in order, within the key's limit; followed into DIR with --follow."""

    def __init__(
        self,
        client: httpx.Client,
        args: argparse.Namespace,
        out_dir: Path | None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.client, self.args, self.out_dir, self.sleep = client, args, out_dir, sleep
        self.jobs: list[Submitted] = []
        self.rc = 0

    def submit(self, doc: Document) -> httpx.Response:
        """POST the document, waiting for a slot as often as the server says the key has none."""
        said = False
        while _too_many_jobs(r := post(self.client, doc, self.args)):
            if not said:
                print(f"{doc.source}: {server_error(r)}; waiting for a job to finish", file=sys.stderr)
                said = True
            self.wait_for_slot(r)
        return r

    def wait_for_slot(self, r: httpx.Response) -> None:
        if self.out_dir is not None and (oldest := next((s for s in self.jobs if not s.followed), None)):
            self.follow(oldest)  # it finishes: a slot
            return
        wait = retry_after_s(r, 60.0)
        deadline = time.monotonic() + (DEFAULT_WAIT_S if wait is None else wait)
        delay = 0.2
        while (left := deadline - time.monotonic()) > 0:
            self.sleep(min(delay, left))
            delay = min(delay * 2, 2.0)
            freed = False
            for s in self.jobs:
                if not s.finished:
                    body = _expect(self.client.get(f"/v1/jobs/{s.job_id}"), 200)
                    s.finished = freed = body["status"] in FINISHED
                    if freed:
                        break
            if freed:
                return

    def follow(self, s: Submitted) -> None:
        assert self.out_dir is not None
        s.followed = s.finished = True
        fmt = getattr(self.args, "format", None)
        target = self.out_dir / f"{s.doc.name}{EXTENSIONS[fmt] if fmt else '.jsonl'}"
        target.parent.mkdir(parents=True, exist_ok=True)
        progress = Progress(s.job_id)
        if fmt:
            outcome = follow_format(self.client, s.job_id, fmt, target, progress, self.args.retries)
        else:
            with target.open("w", encoding="utf-8") as out:
                outcome = follow(self.client, s.job_id, out, progress, retries=self.args.retries)
        rc, message = outcome.verdict(s.job_id)
        progress.say(f"{message.removeprefix(f'job {s.job_id} ')} -> {target}")
        self.rc |= rc

    def run(self, docs: list[Document]) -> int:
        failed = 0
        pending = deque(docs)
        while pending:
            doc = pending.popleft()
            r = self.submit(doc)
            if r.status_code in (401, 403):  # the same for every document
                raise server_error(r)
            if r.status_code != 202:
                print(f"ocr-app: {doc.source}: {server_error(r)}", file=sys.stderr)
                failed += 1
                continue
            job_id = _expect(r, 202)["job_id"]
            print(f"{job_id}\t{doc.source}", flush=True)
            self.jobs.append(Submitted(doc, job_id))
        if self.out_dir is not None:
            for s in self.jobs:
                if not s.followed:
                    self.follow(s)
        print(f"{len(self.jobs)} submitted, {failed} not accepted", file=sys.stderr)
        return 1 if failed else self.rc


def submit(client: httpx.Client, args: argparse.Namespace) -> int:
    docs, skipped, many = gather(args.files)
    for source, why in skipped:
        print(f"skipped {source}: {why}", file=sys.stderr)
    if not docs:
        raise ConfigError(f"no document to submit (accepted types: {ACCEPTED})")
    if not many:
        return _submit_one(client, args, docs[0])
    if args.idempotency_key:
        raise ConfigError("--idempotency-key: one document only (each document needs a key of its own)")
    out_dir = None
    if args.output:
        out_dir = Path(args.output)
        if not args.follow:
            raise ConfigError("-o with several documents: add --follow (one result file each into -o DIR)")
        if out_dir.exists() and not out_dir.is_dir():
            raise ConfigError(f"-o {out_dir}: not a directory (several documents: one result file each)")
        out_dir.mkdir(parents=True, exist_ok=True)
    elif args.follow:
        raise ConfigError("--follow with several documents: add -o DIR (one result file each)")
    return Batch(client, args, out_dir).run(docs)


def _submit_one(client: httpx.Client, args: argparse.Namespace, doc: Document) -> int:
    r = Batch(client, args, None).submit(doc)
    job_id = _expect(r, 202)["job_id"]
    again = " (the job this Idempotency-Key already made)" if r.headers.get("idempotent-replayed") else ""
    if not args.follow:
        print(job_id)
        print(
            f"job {job_id} submitted{again}: `ocr-app jobs status {job_id}`, "
            f"`ocr-app jobs result {job_id} --follow`",
            file=sys.stderr,
        )
        return 0
    print(f"job {job_id} submitted{again}", file=sys.stderr)
    return _follow_to(client, job_id, args)
