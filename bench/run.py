"""ocrfleet benchmark: the service against its own engine, against rapidocr-api, and its cheap paths.

Run from the repository root with `python -m bench.run` (or `make bench`).
Everything is measured side by side in one run and printed as a table with ratios and goals; the
figures also go to bench/results.json. Timings are reported, never asserted: the exit status is 0
unless something crashed.

    1. service ÷ direct in-process engine throughput, same documents, concurrency 1 and 4
    2. service ÷ rapidocr-api (PyPI peer) throughput, same documents, concurrency 1 and 4
    3. /healthz p50/p99 while 16 large documents are in flight
    4. decode + resize of a 12 MP JPEG through the decode pool (draft mode, pages copied back) vs full decode
    +  PNG-bomb refusal latency and server RSS growth
    6. /healthz p50/p99 under attack: 20 MB multipart bodies of tiny parts and nested-XObject PDFs, repeatedly
    7. the rapidocr engine on upright single-column pages with orientation and layout on vs off (per page),
       and the order-sensitive CER of the layout pages, upright, turned 90/180/270 and photographed
    8. bulk jobs: a multi-page PDF as one job (PostgreSQL queue, a throw-away cluster) vs the same pages
       sent as single-page synchronous requests by a saturating client, one service: pages/s ratio
    9. the development set (#41, bench/devset.yaml): real pages degraded like scans, the rapidocr engine's
       CER in reading order and bag-of-words error beside Tesseract 5's, per kind and per page
   10. a searchable PDF from a 20-page 300 dpi scan (#42): the service (format=pdf) beside OCRmyPDF with
       Tesseract 5, with ocrmypdf-rapidocr and with this package's plugin (the service its engine): pages/s
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

import yaml

from bench.attack import bench_attack
from bench.decode import bench_bomb, bench_decode
from bench.devset import bench_devset
from bench.documents import make_documents
from bench.harness import Config, PassResult, log, ours_pass, pc, ratio, summarise_passes
from bench.healthz import bench_healthz
from bench.jobs import bench_jobs
from bench.layout import bench_layout
from bench.ocrmypdf import bench_ocrmypdf
from bench.report import print_report
from bench.servers import OurService, Process, free_port, peer_argv
from bench.throughput import peer_pass, phase_ours_vs_direct, phase_passes
from ocr_app.config import load_settings
from ocr_app.engines import resolve_engine_name
from tests.docs import png_bomb

ROOT = Path(__file__).resolve().parent.parent
RESULTS_FILE = Path(__file__).resolve().parent / "results.json"


def parse_args(argv: list[str] | None) -> tuple[Config, bool]:
    p = argparse.ArgumentParser(
        prog="bench.run", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="one round, fewer repetitions: for development")
    p.add_argument("--rounds", type=int, help="passes per side and concurrency (default 2, quick 1)")
    p.add_argument(
        "--only",
        default="direct,peer,healthz,decode,bomb,attack,layout,devset,jobs,ocrmypdf",
        help="comma-separated subset of: direct,peer,healthz,decode,bomb,attack,layout,devset,jobs,ocrmypdf",
    )
    p.add_argument("--concurrency", default="1,4", help="client concurrencies for 1 and 2 (default 1,4)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one of our service settings, e.g. --set rapidocr_threads=2 (repeatable)",
    )
    a = p.parse_args(argv)
    overrides = {}
    for item in a.set:
        k, _, v = item.partition("=")
        overrides[k.strip()] = yaml.safe_load(v)
    cfg = Config(
        rounds=a.rounds or (1 if a.quick else 2),
        warmup=True,
        healthz_docs=4 if a.quick else 16,
        decode_reps=5 if a.quick else 21,
        bomb_reps=2 if a.quick else 5,
        concurrencies=tuple(int(c) for c in a.concurrency.split(",")),
        only={s.strip() for s in a.only.split(",")},
        overrides=overrides,
        attack_window_s=20.0 if a.quick else 30.0,
        job_pages=16 if a.quick else 48,
        latency_requests=6 if a.quick else 20,
    )
    return cfg, a.quick


def service_overrides(cfg: Config) -> dict:
    """Our configuration: the shipped defaults (workers = CPUs, 1 thread each, max_concurrency the engine's),
    plus a queue and a deadline roomy enough that the healthz load (16 big documents at once) is admitted."""
    over = {"max_queue": max(16, cfg.healthz_docs), "request_timeout_s": 300, **cfg.overrides}
    return over


def run(cfg: Config, quick: bool, workdir: Path) -> dict:
    t_start = pc()
    res: dict = {
        "mode": "quick" if quick else "full",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg": [round(x, 2) for x in os.getloadavg()],
        },
        "errors": [],
    }
    log("rendering documents")
    docs, letter_pdf, photo = make_documents()
    res["documents"] = [doc.describe() for doc in docs]
    big_docs = [(docs[0] if i % 2 == 0 else letter_pdf) for i in range(cfg.healthz_docs)]
    overrides = service_overrides(cfg)
    settings = load_settings(None, auth_disabled=True, **overrides)
    settings = settings.for_engine(resolve_engine_name(settings))
    keys = ("rapidocr_workers", "rapidocr_threads", "max_concurrency", "preprocess_workers", "max_queue")
    res["settings"] = {
        k: getattr(settings, k) for k in (*keys, "rapidocr_use_cls", "max_image_side", "pdf_dpi")
    }
    res["settings_text"] = " ".join(f"{k}={getattr(settings, k)}" for k in (*keys, "request_timeout_s"))
    res["rounds"] = cfg.rounds
    res["concurrencies"] = list(cfg.concurrencies)

    def guarded(name: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as err:
            traceback.print_exc()
            res["errors"].append(f"{name}: {type(err).__name__}: {str(err)[:500]}")

    # 4. decode: in-process, before any server is up.
    if "decode" in cfg.only:
        log("measurement 4: 12 MP JPEG decode + resize")
        guarded("decode", lambda: res.__setitem__("decode", bench_decode(photo, settings, cfg.decode_reps)))
    # 7. the engine alone, in-process, before any server is up.
    if "layout" in cfg.only:
        log("measurement 7: orientation and layout on vs off, CER of the layout pages")
        guarded("layout", lambda: res.__setitem__("layout", bench_layout(2 if quick else 5)))
    # 9. the development set, in-process too.
    if "devset" in cfg.only:
        log("measurement 9: the development set, ours vs Tesseract")
        guarded("devset", lambda: res.__setitem__("devset", bench_devset()))

    ours_a: dict[int, list[PassResult]] = {}
    ours_b: dict[int, list[PassResult]] = {}
    peer: dict[int, list[PassResult]] = {}

    # 1. service vs direct engine (our service's passes also count for 2: ours, peer, ours).
    if "direct" in cfg.only or "peer" in cfg.only:

        def phase1() -> None:
            svc = OurService(workdir / "ours-1", overrides)
            try:
                log(f"starting ocr-app serve on :{svc.port}")
                svc.start()
                if "direct" in cfg.only:
                    log("measurement 1: service vs direct in-process engine")
                    out, passes = phase_ours_vs_direct(svc, docs, cfg)
                    res["service_vs_direct"] = out
                    for p in passes:
                        ours_a.setdefault(p.concurrency, []).append(p)
                else:
                    ours_a.update(phase_passes(lambda c: ours_pass(svc, docs, c), "service", cfg))
            finally:
                svc.stop()

        guarded("service vs direct", phase1)

    # 2. rapidocr-api, alone on the machine.
    if "peer" in cfg.only:

        def phase2() -> None:
            port = free_port()
            proc = Process("rapidocr-api", peer_argv(port), workdir, "/", port)
            try:
                log(f"starting rapidocr-api on :{port}")
                proc.start()
                log("measurement 2: rapidocr-api")
                peer.update(phase_passes(lambda c: peer_pass(proc, docs, c), "rapidocr-api", cfg))
            finally:
                proc.stop()

        guarded("rapidocr-api", phase2)

    # Our service again: its second block for 2, then the bomb and the healthz load.
    if cfg.only & {"peer", "healthz", "bomb", "attack"}:

        def phase3() -> None:
            servers: list[OurService] = []

            def service() -> OurService:
                """The running service; a fresh one if the last has died (the death is reported)."""
                if servers and servers[-1].process.proc.poll() is None:
                    return servers[-1]
                svc = OurService(workdir / f"ours-{len(servers) + 2}", overrides)
                servers.append(svc)
                log(f"starting ocr-app serve on :{svc.port}")
                return svc.start()

            def peer_block() -> None:
                svc = service()
                log("measurement 2: our service again (ours, peer, ours)")
                ours_b.update(phase_passes(lambda c: ours_pass(svc, docs, c), "service", cfg))

            def bomb() -> None:
                log("PNG bomb refusal")
                res["bomb"] = bench_bomb(service(), png_bomb(), cfg.bomb_reps)

            def healthz() -> None:
                log(f"measurement 3: /healthz with {len(big_docs)} big documents in flight")
                res["healthz"] = bench_healthz(service(), big_docs)

            def attack() -> None:
                log(f"measurement 6: /healthz under attack for {cfg.attack_window_s:g} s")
                res["attack"] = bench_attack(service(), cfg.attack_window_s)

            # The attack last: a nested PDF it leaves running is waited for, but nothing else should share it.
            steps = (("peer", peer_block), ("bomb", bomb), ("healthz", healthz), ("attack", attack))
            try:
                for name, fn in steps:
                    if name in cfg.only:
                        guarded(f"service (second run): {name}", fn)
            finally:
                for svc in servers:
                    svc.stop()

        guarded("service (second run)", phase3)

    # 8. bulk jobs vs synchronous requests, a service of its own with a job database.
    if "jobs" in cfg.only:
        log("measurement 8: bulk job vs synchronous requests")
        guarded("jobs", lambda: res.__setitem__("jobs", bench_jobs(workdir, overrides, cfg)))

    # 10. searchable PDFs: the service beside OCRmyPDF, a service of its own.
    if "ocrmypdf" in cfg.only:
        guarded(
            "ocrmypdf",
            lambda: res.__setitem__("ocrmypdf", bench_ocrmypdf(workdir / "ocrmypdf", overrides, cfg.rounds)),
        )
        for name, side in (res.get("ocrmypdf") or {}).get("sides", {}).items():
            if side.get("error"):
                res["errors"].append(f"ocrmypdf {name}: {side['error']}")

    if peer:
        res["service_vs_peer"] = {}
        for c in cfg.concurrencies:
            s = summarise_passes(ours_a.get(c, []) + ours_b.get(c, []))
            p = summarise_passes(peer.get(c, []))
            res["service_vs_peer"][f"c{c}"] = {
                "service": s,
                "rapidocr_api": p,
                "ratio": ratio(s["throughput_docs_per_s"], p["throughput_docs_per_s"]),
            }
    for section in ("service_vs_direct", "service_vs_peer"):
        for c, m in (res.get(section) or {}).items():
            for side, v in m.items():
                if isinstance(v, dict) and v.get("errors"):
                    res["errors"].append(
                        f"{section} {c} {side}: {len(v['errors'])} failed requests: {v['errors'][0]}"
                    )
    if res.get("healthz", {}).get("load_errors"):
        res["errors"].append(f"healthz load: {res['healthz']['load_errors'][0]}")
    for who in ("multipart", "nested_pdf"):
        if res.get("attack", {}).get(who, {}).get("errors"):
            res["errors"].append(f"attack {who}: {res['attack'][who]['errors'][0]}")
    res["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    res["wall_s"] = round(pc() - t_start, 1)
    return res


def _json_safe(obj):
    if isinstance(obj, float):
        return round(obj, 4)
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def main(argv: list[str] | None = None) -> int:
    cfg, quick = parse_args(argv)

    def on_term(signum, frame):  # SIGTERM unwinds like Ctrl-C, so every server is stopped
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    with tempfile.TemporaryDirectory(prefix="ocrfleet-bench-") as tmp:
        try:
            res = run(cfg, quick, Path(tmp))
        except Exception:
            traceback.print_exc()
            return 1
    print_report(res)
    out = _json_safe(res)
    text = json.dumps(out, ensure_ascii=False)
    RESULTS_FILE.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    print(text)
    print(f"(written to {RESULTS_FILE.relative_to(ROOT)}; total {res['wall_s']} s)")
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
