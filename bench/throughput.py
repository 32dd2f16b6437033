"""Measurements 1 and 2, throughput side by side: our service against its own pipeline driven in-process
(1, the direct engine: what HTTP costs), and against rapidocr-api, the PyPI peer (2)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from bench.documents import Doc
from bench.harness import (
    Config,
    PassResult,
    async_client,
    drive,
    log,
    ours_pass,
    ratio,
    summarise_passes,
)
from bench.servers import OurService, Process
from ocr_app.config import Settings
from ocr_app.engines import create_engine
from ocr_app.metrics import Metrics
from ocr_app.ocr.pipeline import Job, Pipeline


class DirectEngine:
    """The service's own pipeline (ocr_app/ocr/pipeline.py: admission, decode pool, engine, response) with the
    service's settings, driven in this process: what the service could at best do without HTTP."""

    def __init__(self, settings: Settings):
        self.pipeline = Pipeline(settings, create_engine(settings), Metrics())
        # One loop for every pass: admission's semaphore belongs to the loop it first waited on.
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.pipeline.start())

    def run_pass(self, docs: list[Doc], concurrency: int) -> PassResult:
        async def run() -> PassResult:
            async def one(doc: Doc) -> int:
                async def read() -> bytes:
                    return doc.data

                answer = await self.pipeline.run(read, Job(doc.ctype), "bench")
                return sum(len(p.lines) for p in answer.pages)

            return await drive("direct", docs, concurrency, one)

        return self.loop.run_until_complete(run())

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.pipeline.close())
        finally:
            self.loop.close()


def phase_ours_vs_direct(svc: OurService, docs: list[Doc], cfg: Config) -> tuple[dict, list[PassResult]]:
    """Measurement 1: alternate direct and service passes (A B, then B A) after warming both up."""
    direct = DirectEngine(svc.settings)
    try:
        if cfg.warmup:
            log("warm-up: direct engine and service, one pass each")
            direct.run_pass(docs, max(cfg.concurrencies))
            ours_pass(svc, docs, max(cfg.concurrencies))
        out: dict = {}
        service_passes: list[PassResult] = []
        for c in cfg.concurrencies:
            d_passes, s_passes = [], []
            for r in range(cfg.rounds):
                order = ("direct", "service") if r % 2 == 0 else ("service", "direct")
                for side in order:
                    if side == "direct":
                        d_passes.append(direct.run_pass(docs, c))
                        p = d_passes[-1]
                    else:
                        s_passes.append(ours_pass(svc, docs, c))
                        p = s_passes[-1]
                    log(f"  c={c} round {r + 1}: {side:8s} {p.throughput:.3f} docs/s ({p.seconds:.1f} s)")
            service_passes += s_passes
            d, s = summarise_passes(d_passes), summarise_passes(s_passes)
            out[f"c{c}"] = {
                "direct": d,
                "service": s,
                "ratio": ratio(s["throughput_docs_per_s"], d["throughput_docs_per_s"]),
                "pairwise_ratios": [
                    round(sp.throughput / dp.throughput, 4) for sp, dp in zip(s_passes, d_passes, strict=True)
                ],
            }
        return out, service_passes
    finally:
        direct.close()


def peer_pass(peer: Process, docs: list[Doc], concurrency: int) -> PassResult:
    async def run() -> PassResult:
        async with async_client(peer.url, concurrency) as client:

            async def one(doc: Doc) -> int:
                files = {"image_file": (doc.filename, doc.data, doc.ctype)}
                r = await client.post("/ocr", files=files)
                if r.status_code != 200:
                    raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
                return len(r.json())

            return await drive("rapidocr-api", docs, concurrency, one)

    res = asyncio.run(run())
    peer.check_alive()
    return res


def phase_passes(run: Callable[[int], PassResult], label: str, cfg: Config) -> dict[int, list[PassResult]]:
    if cfg.warmup:
        log(f"warm-up: {label}, one pass")
        run(max(cfg.concurrencies))
    out: dict[int, list[PassResult]] = {}
    for c in cfg.concurrencies:
        out[c] = []
        for r in range(cfg.rounds):
            p = run(c)
            out[c].append(p)
            log(f"  c={c} round {r + 1}: {label} {p.throughput:.3f} docs/s ({p.seconds:.1f} s)")
    return out
