"""Measurement 4 and the PNG bomb: what a document costs before the engine. A 12 MP JPEG decoded and resized
through the service's decode pool against a full decode in-process, and a decompression bomb refused from its
header, at what latency and memory cost."""

from __future__ import annotations

import asyncio
import io
import time

import httpx
from PIL import Image

from bench.harness import median, pc, percentile
from bench.servers import OurService, proc_status_kb
from ocr_app.config import Settings
from ocr_app.documents.decode import DecodePool, DecodeRequest
from ocr_app.documents.image import Limits
from ocr_app.documents.pages import load_pages


def bench_decode(photo: bytes, settings: Settings, reps: int) -> dict:
    """Measurement 4: the 12 MP JPEG through the service's decode pool (the worker's load_pages in JPEG draft
    mode, the page copied back) vs Image.open + load + LANCZOS resize in this process; and load_pages
    alone in this process, to show what the process boundary costs."""
    limits = Limits.from_settings(settings)
    side = settings.max_image_side
    ours: list[float] = []
    inproc: list[float] = []
    full: list[float] = []
    floor: list[float] = []  # libjpeg's half-scale decode alone: no resize, no copy
    sizes = set()
    pool = DecodePool.from_settings(settings)  # the service's, as Pipeline builds it
    pool.start()
    loop = asyncio.new_event_loop()

    def run_ours() -> None:
        t = pc()
        [page] = loop.run_until_complete(
            pool.decode(DecodeRequest(photo, "image/jpeg"), time.monotonic() + 60)
        )
        ours.append(pc() - t)
        sizes.add(("ours", page.size))

    def run_inproc() -> None:
        t = pc()
        [page] = load_pages(photo, "image/jpeg", None, limits)
        inproc.append(pc() - t)
        sizes.add(("in-process", page.image.size))

    def run_floor() -> None:
        t = pc()
        im = Image.open(io.BytesIO(photo))
        im.draft("RGB", (side, side * im.height // im.width))
        im.load()
        floor.append(pc() - t)
        sizes.add(("floor", im.size))

    def run_full() -> None:
        t = pc()
        im = Image.open(io.BytesIO(photo))
        im.load()
        f = side / max(im.size)
        im = im.convert("RGB").resize((round(im.width * f), round(im.height * f)), Image.Resampling.LANCZOS)
        full.append(pc() - t)
        sizes.add(("full", im.size))

    try:
        for fn in (run_ours, run_inproc, run_floor, run_full):  # warm-up, not counted
            fn()
        for xs in (ours, inproc, floor, full):
            xs.clear()
        for i in range(reps):
            order = (run_ours, run_inproc, run_floor, run_full)
            for fn in order if i % 2 == 0 else reversed(order):
                fn()
    finally:
        pool.close()
        loop.close()
    ms_ours, ms_inproc, ms_full = median(ours) * 1000, median(inproc) * 1000, median(full) * 1000
    return {
        "ours_ms": ms_ours,
        "in_process_ms": ms_inproc,
        "decode_floor_ms": median(floor) * 1000,
        "full_decode_ms": ms_full,
        "ours_p90_ms": percentile(ours, 90) * 1000,
        "full_decode_p90_ms": percentile(full, 90) * 1000,
        "ratio_ours_over_full": ms_ours / ms_full,
        "speedup": ms_full / ms_ours,
        "n": reps,
        "output_sizes": sorted(f"{k} {w}x{h}" for k, (w, h) in sizes),
    }


def bench_bomb(svc: OurService, bomb: bytes, reps: int) -> dict:
    """A 40000x40000 1-bit PNG: refused from its header, at what latency and memory cost."""
    svc.process.check_alive()
    pid = svc.process.pid
    rss0, hwm0 = proc_status_kb(pid, "VmRSS"), proc_status_kb(pid, "VmHWM")
    lat, statuses = [], []
    headers = {"Authorization": f"Bearer {svc.key}", "Content-Type": "image/png"}
    with httpx.Client(base_url=svc.process.url, timeout=120) as client:
        for _ in range(reps):
            t = pc()
            r = client.post("/v1/ocr", content=bomb, headers=headers)
            lat.append(pc() - t)
            statuses.append(r.status_code)
    rss1, hwm1 = proc_status_kb(pid, "VmRSS"), proc_status_kb(pid, "VmHWM")
    mb = 1 / 1024
    return {
        "latency_ms": median(lat) * 1000,
        "latency_max_ms": max(lat) * 1000,
        "statuses": sorted(set(statuses)),
        "n": reps,
        "bytes": len(bomb),
        "rss_before_mb": rss0 * mb if rss0 else None,
        "rss_growth_mb": (rss1 - rss0) * mb if rss0 and rss1 else None,
        "peak_rss_growth_mb": (hwm1 - hwm0) * mb if hwm0 and hwm1 else None,
    }
