"""The bench's shared machinery for side-by-side figures: the run's Config, its log, a pass (every document
sent once at a given client concurrency, timed) and its summary, and the statistics ratios are made of.

A pass's result is the same whichever side it drove (our service, the direct engine, the peer), so that
two sides measured the same way are divided."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import httpx

from bench.documents import Doc
from bench.servers import OurService

pc = time.perf_counter


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class Config:
    """What one run measures, and how many times (bench/run.py parse_args: the command line)."""

    rounds: int
    warmup: bool
    healthz_docs: int
    decode_reps: int
    bomb_reps: int
    concurrencies: tuple[int, ...]
    only: set[str]
    overrides: dict
    attack_window_s: float = 30.0
    job_pages: int = 48
    latency_requests: int = 20


def median(xs: Iterable[float]) -> float | None:
    xs = list(xs)
    return statistics.median(xs) if xs else None


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


@dataclass
class PassResult:
    side: str
    concurrency: int
    seconds: float
    done: int
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lines: dict[str, int] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0


async def drive(
    side: str, docs: list[Doc], concurrency: int, one: Callable[[Doc], Awaitable[int]]
) -> PassResult:
    """Send every document once, `concurrency` at a time; each worker takes the next document."""
    pending = iter(docs)
    res = PassResult(side, concurrency, 0.0, 0)

    async def worker() -> None:
        for doc in pending:  # one iterator shared by the workers: next() never interleaves in asyncio
            t = pc()
            try:
                res.lines[doc.name] = await one(doc)
            except Exception as err:
                res.errors.append(f"{doc.name}: {type(err).__name__}: {str(err)[:200]}")
                continue
            res.latencies.append(pc() - t)
            res.done += 1

    t0 = pc()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    res.seconds = pc() - t0
    return res


def async_client(url: str, concurrency: int, headers: dict | None = None) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
    return httpx.AsyncClient(base_url=url, headers=headers or {}, timeout=600, limits=limits)


def ours_pass(svc: OurService, docs: list[Doc], concurrency: int, side: str = "service") -> PassResult:
    async def run() -> PassResult:
        async with async_client(
            svc.process.url, concurrency, {"Authorization": f"Bearer {svc.key}"}
        ) as client:

            async def one(doc: Doc) -> int:
                r = await client.post("/v1/ocr", content=doc.data, headers={"Content-Type": doc.ctype})
                if r.status_code != 200:
                    raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
                return sum(len(p["lines"]) for p in r.json()["pages"])

            return await drive(side, docs, concurrency, one)

    res = asyncio.run(run())
    svc.process.check_alive()
    return res


def summarise_passes(passes: list[PassResult]) -> dict:
    ok = [p for p in passes if not p.errors]  # a pass with a failed request does not count
    return {
        "throughput_docs_per_s": median(p.throughput for p in ok),
        "passes": len(ok),
        "failed_passes": len(passes) - len(ok),
        "docs_per_pass": max((p.done + len(p.errors) for p in passes), default=0),
        "per_pass_docs_per_s": [round(p.throughput, 4) for p in passes],
        "latency_p50_s": median(lat for p in passes for lat in p.latencies),
        "errors": [e for p in passes for e in p.errors],
        "lines": passes[-1].lines if passes else {},
    }
