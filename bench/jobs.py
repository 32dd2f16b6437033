"""Measurement 8, bulk jobs: the same pages as one job (PostgreSQL queue, a throw-away cluster) and as
single-page synchronous requests by a saturating client, one service; then /v1/ocr latency beside a job."""

from __future__ import annotations

import statistics
import subprocess
import time
from datetime import datetime
from pathlib import Path

import httpx
from PIL import Image

from bench.documents import Doc
from bench.harness import Config, log, ours_pass, pc, percentile
from bench.servers import OurService, clean_env, ocr_app_argv
from ocr_app.engines import resolve_engine_name
from scripts.pg_cluster import Cluster
from tests.docs import TEXTS, pdf, render

THINK_S = 1.0  # the second interactive client: this long between requests (> job_yield_s)


def job_pages(n: int) -> list[Image.Image]:
    """n pages of text (four distinct ones, repeated), each read by the engine in a fraction of a second."""
    pool = TEXTS["en"] + TEXTS["latin"]
    distinct = [render([pool[(i + k) % len(pool)] for k in range(12)], "en").image for i in range(4)]
    return [distinct[i % 4] for i in range(n)]


def jobs_sync_pass(svc: OurService, pages: list[bytes], concurrency: int) -> float:
    """Seconds for every page, each its own one-page PDF, through POST /v1/ocr by `concurrency` clients."""
    docs = [Doc(f"p{i + 1}", data, "application/pdf", (0, 0)) for i, data in enumerate(pages)]
    res = ours_pass(svc, docs, concurrency, side="sync")
    if res.errors:
        raise RuntimeError(f"synchronous pages failed: {res.errors[0]}")
    return res.seconds


def _svc_client(svc: OurService) -> httpx.Client:
    return httpx.Client(base_url=svc.process.url, headers={"Authorization": f"Bearer {svc.key}"}, timeout=600)


def submit_job(client: httpx.Client, document: bytes) -> str:
    """POST /v1/jobs of the whole PDF; its status URL."""
    r = client.post("/v1/jobs", content=document, headers={"Content-Type": "application/pdf"})
    if r.status_code != 202:
        raise RuntimeError(f"POST /v1/jobs: HTTP {r.status_code}: {r.text[:200]}")
    return r.json()["status_url"]


def wait_job(client: httpx.Client, status_url: str, n: int) -> dict:
    """Until the job's status says it ended (polled every 0.5 s: a client's own load stays out of the
    figure); it must be done with every page read. Its last status."""
    while (job := client.get(status_url).json())["status"] in ("queued", "running"):
        time.sleep(0.5)
    if job["status"] != "done" or job["pages"]["done"] != n:
        raise RuntimeError(f"job ended {job['status']} with {job['pages']}")
    return job


def jobs_job_pass(svc: OurService, document: bytes, n: int) -> float:
    """Seconds from POST /v1/jobs of the whole PDF until the job finished, by the job's own finished_at
    (the database's clock, this machine's: the poll interval is not in the figure)."""
    with _svc_client(svc) as client:
        t0 = time.time()
        job = wait_job(client, submit_job(client, document), n)
    svc.process.check_alive()
    return datetime.fromisoformat(job["finished_at"]).timestamp() - t0


def latencies(svc: OurService, body: bytes, n: int, pause_s: float = 0.0) -> list[float]:
    """Seconds of n one-page POST /v1/ocr requests sent one after the other (an interactive client),
    pause_s apart."""
    out = []
    with _svc_client(svc) as client:
        for i in range(n):
            if i and pause_s:
                time.sleep(pause_s)  # the client's think time, not a measurement
            t = pc()
            r = client.post("/v1/ocr", content=body, headers={"Content-Type": "application/pdf"})
            if r.status_code != 200:
                raise RuntimeError(f"POST /v1/ocr: HTTP {r.status_code}: {r.text[:200]}")
            out.append(pc() - t)
    return out


def latency_beside_job(svc: OurService, body: bytes, document: bytes, n: int) -> dict:
    """/v1/ocr latency with no job, then while a job runs (it must outlast both clients: cancelled after),
    for a client sending back to back and one pausing THINK_S between requests."""
    idle = latencies(svc, body, n)
    idle_paused = latencies(svc, body, n, THINK_S)
    with _svc_client(svc) as client:
        status_url = submit_job(client, document)
        busy = latencies(svc, body, n)
        job = client.get(status_url).json()
        throughout = job["status"] in ("queued", "running")
        # Then with think time: job pages start in the gaps, an interactive request meets them running.
        paused = latencies(svc, body, n, THINK_S)
        after = client.get(status_url).json()
        paused_throughout = after["status"] in ("queued", "running")
        client.delete(status_url).raise_for_status()  # the rest of its pages are not needed
    svc.process.check_alive()
    return {
        "n": n,
        "idle_p50_ms": 1000 * statistics.median(idle),
        "idle_p95_ms": 1000 * (percentile(idle, 95) or 0),
        "idle_think_p50_ms": 1000 * statistics.median(idle_paused),
        "job_p50_ms": 1000 * statistics.median(busy),
        "job_p95_ms": 1000 * (percentile(busy, 95) or 0),
        "ratio": statistics.median(busy) / statistics.median(idle),
        "job_ran_throughout": throughout,
        # Interactive requests come first: the job's pages read meanwhile (they run in the gaps only).
        "job_pages_meanwhile": job["pages"]["done"] + job["pages"]["failed"],
        "think_s": THINK_S,
        "think_p50_ms": 1000 * statistics.median(paused),
        "think_p95_ms": 1000 * (percentile(paused, 95) or 0),
        "think_ratio": statistics.median(paused) / statistics.median(idle_paused),
        "think_job_pages": after["pages"]["done"]
        + after["pages"]["failed"]
        - job["pages"]["done"]
        - job["pages"]["failed"],
        "think_ran_throughout": paused_throughout,
    }


def bench_jobs(workdir: Path, overrides: dict, cfg: Config) -> dict:
    """Measurement 8: the same pages as one bulk job and as synchronous requests, one service, rounds
    alternating which goes first."""
    cluster = Cluster().start()
    svc = None
    try:
        svc = OurService(workdir / "ours-jobs", {**overrides, "database_url": cluster.create_database("ocr")})
        subprocess.run(
            [*ocr_app_argv(), "db", "upgrade", "--config", str(svc.config_file)],
            check=True,
            capture_output=True,
            env=clean_env(),
        )
        svc.start()
        engine = resolve_engine_name(svc.settings)
        c = svc.settings.for_engine(engine).max_concurrency or 1
        pages = job_pages(cfg.job_pages)
        document = pdf(pages, dpi=200)
        singles = [pdf([p], dpi=200) for p in pages]
        client_c = 2 * c  # a saturating client: every slot busy and as many waiting
        if cfg.warmup:
            jobs_sync_pass(svc, singles[: 2 * c], client_c)
        sync_s: list[float] = []
        job_s: list[float] = []
        for r in range(cfg.rounds):
            order = ("sync", "job") if r % 2 == 0 else ("job", "sync")
            for side in order:
                log(f"measurement 8: round {r + 1}, {side}: {cfg.job_pages} pages")
                if side == "sync":
                    sync_s.append(jobs_sync_pass(svc, singles, client_c))
                else:
                    job_s.append(jobs_job_pass(svc, document, cfg.job_pages))
        sync_pps = cfg.job_pages / statistics.median(sync_s)
        job_pps = cfg.job_pages / statistics.median(job_s)
        log(f"measurement 8: /v1/ocr latency, {cfg.latency_requests} requests without a job, then beside one")
        # Twice the pages: the job must still run when the second client ends (job pages run beside it).
        latency = latency_beside_job(svc, singles[0], pdf(pages * 2, dpi=200), cfg.latency_requests)
        return {
            "latency": latency,
            "pages": cfg.job_pages,
            "rounds": cfg.rounds,
            "engine": engine,
            "max_concurrency": c,
            "client_concurrency": client_c,
            "sync_s": sync_s,
            "job_s": job_s,
            "sync_pages_per_s": sync_pps,
            "job_pages_per_s": job_pps,
            "ratio": job_pps / sync_pps,
        }
    finally:
        if svc is not None:
            svc.stop()
        cluster.stop()
