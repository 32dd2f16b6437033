"""`ocr-app eval`: a fixed evaluation set read by a running instance, as figures a release gate compares.

A set is a directory of documents (PNG, JPEG, TIFF, WebP, PDF), each with its expected text beside it
(`<stem>.txt`; the same layout as the ocr_app role's golden document). Each document is sent to `/v1/ocr` (or,
with route `chat`, to `/v1/chat/completions` as one `data:` image, its Markdown read as text: escapes, heading
marks and page breaks dropped) one at a time (latency is the instance's, not a queue's), `repeat` times; the
figures are the character error rate (CER) per document and over the set (edit distance / expected
characters, whitespace ignored: engines break lines and space columns differently, what matters is what they
read) and the latency's p50/p95. Compared with a baseline (the same command's JSON against the old version,
through the same route), the run is refused when its CER is higher by more than a margin in points, or its
median latency by more than a ratio.
"""

from __future__ import annotations

import base64
import math
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rapidfuzz.distance import Levenshtein

from ..config import ConfigError
from ..documents.upload import sniff


@dataclass
class Document:
    name: str
    data: bytes
    media_type: str
    expected: str


@dataclass
class DocumentResult:
    name: str
    chars: int  # expected characters, whitespace removed
    distance: int  # edit distance of what was read to them (all of them for a document not read)
    latencies_ms: list[float] = field(default_factory=list)
    error: str | None = None  # the first failed request's answer, e.g. "HTTP 413 payload_too_large: ..."

    @property
    def cer(self) -> float:
        return self.distance / self.chars


@dataclass
class Margins:
    cer_points: float = 1.0  # how much higher the CER may be than the baseline's, in percentage points
    latency_ratio: float = 1.5  # how much slower the median latency may be than the baseline's


ROUTES = ("ocr", "chat")
_ESCAPE = re.compile(r"\\(.)")
_HEADING = re.compile(r"^#+ ", re.MULTILINE)
_BREAK = re.compile(r"^---$", re.MULTILINE)


def markdown_text(markdown: str) -> str:
    """The chat route's Markdown as the text it says: escapes, heading marks and page breaks dropped."""
    return _ESCAPE.sub(r"\1", _BREAK.sub("", _HEADING.sub("", markdown)))


def squeeze(text: str) -> str:
    """Text as compared: whitespace removed (engines break lines and space columns differently; what matters
    is what they read). shadow.py compares a canary's answers the same way."""
    return "".join(text.split())


def load_set(directory: Path) -> list[Document]:
    """The documents of the set that have an expected text, sorted by name."""
    if not directory.is_dir():
        raise ConfigError(f"{directory}: not a directory (an evaluation set is documents + <stem>.txt)")
    docs = []
    for path in sorted(directory.iterdir()):
        expected = path.with_suffix(".txt")
        if path.suffix == ".txt" or not path.is_file() or not expected.is_file():
            continue
        data = path.read_bytes()
        media_type = sniff(data)
        if media_type is None:
            raise ConfigError(f"{path}: not a document the service reads (PNG, JPEG, TIFF, WebP, PDF)")
        text = expected.read_text(encoding="utf-8")
        if not squeeze(text):
            raise ConfigError(f"{expected}: the expected text is empty")
        docs.append(Document(path.name, data, media_type, text))
    if not docs:
        raise ConfigError(f"{directory}: no document with its expected text (<stem>.txt) beside it")
    return docs


def _error(resp: httpx.Response) -> str:
    try:
        err = resp.json()["error"]
        return f"HTTP {resp.status_code} {err['code']}: {err['message']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {resp.status_code}: {resp.text[:200]}"


def read_document(client: httpx.Client, doc: Document, repeat: int, route: str = "ocr") -> DocumentResult:
    expected = squeeze(doc.expected)
    result = DocumentResult(doc.name, len(expected), len(expected))
    image = f"data:{doc.media_type};base64,{base64.b64encode(doc.data).decode('ascii')}"
    chat = {
        "model": "eval",
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}}]}],
    }
    for _ in range(repeat):
        start = time.perf_counter()
        try:
            if route == "chat":
                resp = client.post("/v1/chat/completions", json=chat)
            else:
                resp = client.post("/v1/ocr", content=doc.data, headers={"Content-Type": doc.media_type})
        except httpx.HTTPError as err:
            result.error = f"{type(err).__name__}: {err}"
            return result
        elapsed_ms = (time.perf_counter() - start) * 1000.0
        if resp.status_code != 200:
            result.error = _error(resp)
            return result
        result.latencies_ms.append(round(elapsed_ms, 1))
        if route == "chat":
            got = squeeze(markdown_text(resp.json()["choices"][0]["message"]["content"]))
        else:
            got = squeeze("".join(page["text"] for page in resp.json()["pages"]))
        # The worst of the repeats: an engine that reads a page differently each time is not better for it.
        distance = Levenshtein.distance(expected, got)
        result.distance = distance if len(result.latencies_ms) == 1 else max(result.distance, distance)
    return result


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: a latency some request really had."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100.0 * len(ordered)) - 1)]


def evaluate(
    client: httpx.Client, docs: list[Document], repeat: int = 1, route: str = "ocr"
) -> dict[str, Any]:
    results = [read_document(client, doc, repeat, route) for doc in docs]
    latencies = [ms for r in results for ms in r.latencies_ms]
    chars = sum(r.chars for r in results)
    return {
        "route": route,
        "documents": [asdict(r) | {"cer": round(r.cer, 5)} for r in results],
        "cer": round(sum(r.distance for r in results) / chars, 5),
        "chars": chars,
        "requests": len(latencies),
        "p50_ms": percentile(latencies, 50) if latencies else None,
        "p95_ms": percentile(latencies, 95) if latencies else None,
        "failed": [r.name for r in results if r.error],
    }


def judge(
    report: dict[str, Any], baseline: dict[str, Any] | None, margins: Margins, max_cer_percent: float | None
) -> list[str]:
    """Why the report fails the gate (empty: it passes): a document not read, a CER or a median latency
    worse than the baseline's beyond the margins, a CER above max_cer_percent."""
    worse = []
    if report["failed"]:
        worse.append(f"{len(report['failed'])} document(s) not read: {', '.join(report['failed'])}")
    if baseline is not None and baseline.get("route", "ocr") != report.get("route", "ocr"):
        worse.append(
            f"the baseline was read through route {baseline.get('route', 'ocr')}, this through "
            f"{report.get('route', 'ocr')}: not comparable"
        )
        baseline = None
    if baseline is not None:
        if report["cer"] > baseline["cer"] + margins.cer_points / 100.0:
            worse.append(
                f"CER {report['cer']:.2%} > the baseline's {baseline['cer']:.2%} "
                f"+ {margins.cer_points} points"
            )
        # The median: what a slower version moves; the p95 of a few requests is one request.
        if report["p50_ms"] is not None and baseline.get("p50_ms"):
            ratio = report["p50_ms"] / baseline["p50_ms"]
            if ratio > margins.latency_ratio:
                worse.append(
                    f"p50 latency {report['p50_ms']:.0f} ms is {ratio:.2f}x the baseline's "
                    f"{baseline['p50_ms']:.0f} ms (at most {margins.latency_ratio}x)"
                )
    if max_cer_percent is not None and report["cer"] > max_cer_percent / 100.0:
        worse.append(f"CER {report['cer']:.2%} > {max_cer_percent}%")
    return worse


def format_report(report: dict[str, Any]) -> str:
    width = max(len("document"), *(len(d["name"]) for d in report["documents"]))
    lines = [f"{'document':<{width}}  {'CER':>7}  {'chars':>6}  {'p50 ms':>8}  error".rstrip()]
    for d in report["documents"]:
        p50 = f"{percentile(d['latencies_ms'], 50):.0f}" if d["latencies_ms"] else "-"
        row = f"{d['name']:<{width}}  {d['cer']:>7.2%}  {d['chars']:>6}  {p50:>8}  {d['error'] or ''}"
        lines.append(row.rstrip())
    p50, p95 = report["p50_ms"], report["p95_ms"]
    latency = f"p50 {p50:.0f} ms, p95 {p95:.0f} ms" if p50 is not None else "no latency (nothing read)"
    lines.append(
        f"overall: CER {report['cer']:.2%} over {report['chars']} characters; {report['requests']} requests, "
        + latency
    )
    return "\n".join(lines)
