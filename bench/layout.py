"""Measurement 7: the rapidocr engine in-process with orientation and layout on vs off, per page, the layout
of a dense page, the order-sensitive CER of the contract tests' layout pages, and the CPU a page costs with
ONNX Runtime's threads spinning (its default) vs not (the service's setting)."""

from __future__ import annotations

import asyncio
import random
import time

from bench.harness import median, pc
from tests.docs import TEXTS, layout_pages, photo_like, render


def bench_layout(reps: int) -> dict:
    """Measurement 7: the rapidocr engine in-process (one instance, the service's thread count), page by page.

    Per-page latency on upright single-column pages (the contract tests' renders) with orientation on and
    off, alternating; the layout's own cost on each page's boxes (page_layout: XY-cut and blocks) beside the
    plain row sort it replaced, so that "both off" is the engine as it was before #12. Then the CER of the
    layout pages (tests/docs.py layout_pages), order-sensitive (whitespace runs made one space), upright,
    turned 90/180/270 (Pillow turns counterclockwise) and photo-like, with the rotation the engine applied."""
    import jiwer

    from ocr_app.engines.layout import page_layout, row_order
    from ocr_app.engines.rapidocr.engine import RapidOcrEngine

    singles = [render(TEXTS[lang], lang).image for lang in ("en", "latin")] + [
        render([f"Line {k} of a plain letter, one column of text" for k in range(12)], size=32).image
    ]
    on, off = RapidOcrEngine(workers=1, threads=2), RapidOcrEngine(workers=1, threads=2, orientation=False)
    for eng in (on, off):
        asyncio.run(eng.load())
    t_on: list[float] = []
    t_off: list[float] = []
    t_layout: list[float] = []
    t_rows: list[float] = []
    try:
        for im in singles:  # warm-up
            on._run(im), off._run(im)
        for i in range(reps):
            for im in singles:
                for eng, xs in ((on, t_on), (off, t_off)) if i % 2 == 0 else ((off, t_off), (on, t_on)):
                    t = pc()
                    page = eng._run(im)
                    xs.append(pc() - t)
                boxes = [ln.bbox for ln in page.lines]
                t = pc()
                page_layout(boxes)
                t_layout.append(pc() - t)
                t = pc()
                row_order(boxes, range(len(boxes)))
                t_rows.append(pc() - t)
        # A dense page (three columns of lines, shuffled): 2000 lines beside 500. Linear or n log n work
        # grows ~4-5x; a quadratic step would show as ~16x.
        dense_ms = {}
        for n in (500, 2000):
            rnd = random.Random(n)
            boxes = [(50 + c * 320, k * 30.0, 340 - (k % 7) * 20 + c * 320, k * 30.0 + 20)
                     for c in range(3) for k in range(n // 3)]  # fmt: skip
            rnd.shuffle(boxes)
            page_layout(boxes)  # warm-up
            runs = []
            for _ in range(max(reps, 3)):
                t = pc()
                page_layout(boxes)
                runs.append(pc() - t)
            dense_ms[len(boxes)] = median(runs) * 1000
        cer_rows = []
        for name, doc in layout_pages().items():
            row = {"page": name}
            for variant in ("upright", "90", "180", "270", "photo"):
                image = doc.image
                if variant == "photo":
                    image = photo_like(image)
                elif variant != "upright":
                    image = image.rotate(int(variant), expand=True)
                got = on._run(image)
                flat = " ".join(doc.text.split()), " ".join(got.joined_text().split())
                row[variant] = {"cer": jiwer.cer(*flat), "rotation": got.rotation}
            cer_rows.append(row)
    finally:
        for eng in (on, off):
            asyncio.run(eng.close())
    # Pages like the fleet's load (tests/fleet/load.py): two lines, 900 pixels wide.
    spin = bench_spinning(
        [
            render([f"Invoice number {4000 + k}", "OCRFLEET ROLLING UPGRADE"], size=32, width=900).image
            for k in range(3)
        ],
        reps,
    )
    timed = {"on": t_on, "off": t_off, "layout": t_layout, "rows": t_rows}
    ms = {k: median(v) * 1000 for k, v in timed.items()}
    before = ms["off"] - ms["layout"] + ms["rows"]  # orientation off, rows sorted as before #12
    return {
        "orientation_on_ms": ms["on"],
        "orientation_off_ms": ms["off"],
        "layout_ms": ms["layout"],
        "row_sort_ms": ms["rows"],
        "before_ms": before,
        "ratio": ms["on"] / before,
        "n": len(t_on),
        "dense_ms": dense_ms,
        "cer": cer_rows,
        **spin,
    }


def bench_spinning(pages: list, reps: int) -> dict:
    """CPU seconds (this process's, ONNX Runtime's threads included) and wall time per page, one instance with
    the service's 2 threads whose sessions spin (ONNX Runtime's default) beside one whose sessions do not (the
    service's ORT_SESSION_CONFIG). Process CPU counts every thread, so one engine at a time is loaded and
    measured, in the order A B B A (a drift in the machine's speed falls on both)."""
    from ocr_app.engines.rapidocr import engine as rapid

    shipped = rapid.ORT_SESSION_CONFIG
    cpu: dict[str, list[float]] = {"spinning": [], "not_spinning": []}
    wall: dict[str, list[float]] = {"spinning": [], "not_spinning": []}
    for name in ("spinning", "not_spinning", "not_spinning", "spinning"):
        rapid.ORT_SESSION_CONFIG = dict.fromkeys(shipped, "1" if name == "spinning" else "0")
        try:
            eng = rapid.RapidOcrEngine(workers=1, threads=2, orientation=False)
            asyncio.run(eng.load())  # the sessions are built here, with the options above
        finally:
            rapid.ORT_SESSION_CONFIG = shipped
        try:
            for im in pages:  # warm-up
                eng._run(im)
            for _ in range(reps):
                for im in pages:
                    c, t = time.process_time(), pc()
                    eng._run(im)
                    cpu[name].append(time.process_time() - c)
                    wall[name].append(pc() - t)
        finally:
            asyncio.run(eng.close())
    return {
        "spinning_cpu_s": median(cpu["spinning"]),
        "not_spinning_cpu_s": median(cpu["not_spinning"]),
        "spinning_ms": median(wall["spinning"]) * 1000,
        "not_spinning_ms": median(wall["not_spinning"]) * 1000,
        "spinning_n": len(cpu["spinning"]),
    }
