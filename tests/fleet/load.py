"""A bounded load generator: OCR requests with real documents, at a fixed concurrency, to one URL, each worker
back to back or at its own pace (`interval_s`).

A request counts as failed unless it is answered 200 with the document's text: every document carries a
word and a number that must both come back (`misread`), so a release that keeps digits but garbles letters
fails requests too. It runs until `finish()`; at most `max_requests` requests are ever sent.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from PIL import Image

from tests.docs import encode, render

WORDS = ["invoice", "delivery", "receipt", "contract", "statement", "order"]


@dataclass
class Document:
    body: bytes
    word: str  # letters: what a release that keeps digits and garbles text gets wrong
    number: str


def misread(doc: Document, text: str) -> str | None:
    """Why `text` is not `doc`'s reading, or None when it is (spacing and case aside: OCR's own noise)."""
    flat = "".join(text.split()).lower()
    missing = [w for w in (doc.word.lower(), doc.number) if w not in flat]
    return f"{' and '.join(missing)} not read" if missing else None


def documents(n: int = 6) -> list[Document]:
    out = []
    for i in range(n):
        number = f"{4000 + 97 * i}"
        word = WORDS[i % len(WORDS)]
        # The second line's capitals are what the fleet's canary revision misreads (test_fleet): the word and
        # the number still come back, so its answers are worse but no request fails.
        lines = [f"{word.title()} number {number}", "OCRFLEET ROLLING UPGRADE"]
        page = render(lines, size=32, width=900)
        out.append(Document(encode(page.image, "PNG"), word, number))
    return out


LARGE_BYTES = 2_000_000  # "documents up to 2 MB": what the LB holds whole so that it can replay them


def large_documents(n: int = 2) -> list[Document]:
    """Documents of just under LARGE_BYTES: an ordinary page stored as an uncompressed PNG, so that the OCR
    costs what a small one does while the request is as large as the LB's replay buffer is sized for."""
    out = []
    for i in range(n):
        number = f"{7000 + 89 * i}"
        page = render([f"Scanned page number {number}", "ocrfleet crash replay"], size=32, width=900).image
        rows = LARGE_BYTES // (page.width * 3 + 1) - 8  # PNG: 1 filter byte per row, plus zlib/chunk framing
        canvas = Image.new("RGB", (page.width, rows), "white")
        canvas.paste(page, (0, 0))
        body = encode(canvas, "PNG", compress_level=0)
        assert LARGE_BYTES * 0.95 < len(body) <= LARGE_BYTES, len(body)
        out.append(Document(body, "scanned", number))
    return out


@dataclass
class Load:
    client: Callable[[], httpx.Client]
    concurrency: int = 4
    # Each worker starts a request at most every interval_s seconds (0: back to back). Back to back, the load
    # takes every core the lab's hosts leave free, and the playbooks it runs beside wait for the CPU; paced,
    # it still has requests arriving at every host through each drain, restart and rejoin.
    interval_s: float = 0.0
    max_requests: int = 20000
    docs: list[Document] = field(default_factory=documents)
    issued: int = 0
    ok: int = 0
    failed: int = 0
    failures: Counter = field(default_factory=Counter)
    first_failures: list[str] = field(default_factory=list)
    # When each paced request's turn came (time.monotonic(), by its X-Request-ID): the worker's next request
    # waits for interval_s after it.
    turns: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._limit = self.max_requests
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()  # set by finish(): a paced worker stops waiting for its next turn
        self.started = 0.0
        self.seconds = 0.0

    @property
    def total(self) -> int:
        return self.ok + self.failed

    @property
    def exhausted(self) -> bool:
        """True when the cap ended the load (it may not have covered everything it ran beside)."""
        return self.issued >= self.max_requests

    def start(self) -> Load:
        self.started = time.monotonic()
        for i in range(self.concurrency):
            t = threading.Thread(target=self._worker, args=(i,), name=f"load-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def finish(self, min_total: int) -> None:
        """Stop once at least min_total requests were sent (and what was sent is answered)."""
        with self._lock:
            self._limit = min(self.max_requests, max(self.issued, min_total))
        if self.issued >= self._limit:
            self._stopping.set()
        for t in self._threads:
            t.join()
        self.seconds = time.monotonic() - self.started

    def check(self, min_total: int, prefix: str = "") -> None:
        """After finish(): print the figures (`<prefix>failed_requests=F <prefix>total_requests=N`, once per
        scenario) and require that nothing failed and at least min_total requests ran."""
        print(f"{prefix}failed_requests={self.failed} {prefix}total_requests={self.total}", flush=True)
        kinds = dict(self.failures)
        print(f"[load] {self.total} requests in {self.seconds:.0f} s; failures by kind: {kinds}", flush=True)
        assert self.failed == 0, self.first_failures
        assert self.total >= min_total

    def _ticket(self) -> int | None:
        with self._lock:
            if self.issued >= self._limit:
                return None
            self.issued += 1
            return self.issued

    def _record(self, ok: bool, what: str = "") -> None:
        with self._lock:
            if ok:
                self.ok += 1
            else:
                self.failed += 1
                self.failures[what.split(":")[0]] += 1
                if len(self.first_failures) < 20:
                    self.first_failures.append(what)

    def _worker(self, index: int) -> None:
        next_start = 0.0
        with self.client() as c:
            while (n := self._ticket()) is not None:
                rid = f"load-{index}-{n}"
                if self.interval_s:  # this worker's requests start at least interval_s apart
                    self._stopping.wait(max(0.0, next_start - time.monotonic()))
                    self.turns[rid] = turn = time.monotonic()
                    next_start = turn + self.interval_s
                doc = self.docs[n % len(self.docs)]
                try:
                    headers = {"Content-Type": "image/png", "X-Request-ID": rid}
                    r = c.post("/v1/ocr", content=doc.body, headers=headers)
                except httpx.HTTPError as err:
                    self._record(False, f"{type(err).__name__}: request {n}: {err}")
                    continue
                if r.status_code != 200:
                    self._record(False, f"HTTP {r.status_code}: request {n}: {r.text[:200]}")
                elif why := misread(doc, text := r.json()["pages"][0]["text"]):
                    self._record(False, f"wrong text: request {n}: {why}: {text[:200]!r}")
                else:
                    self._record(True)
