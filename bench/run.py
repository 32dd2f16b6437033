"""ocrfleet benchmark: the service against its own engine, against rapidocr-api, and its cheap paths.

Run from the repository root with `python -m bench.run` (or `python bench/run.py`, or `make bench`).
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
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import io
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
import numpy as np
import yaml
from PIL import Image, ImageFilter

from ocr_app.config import Settings, load_settings
from ocr_app.documents.decode import DecodePool, DecodeRequest
from ocr_app.documents.image import Limits
from ocr_app.documents.pages import load_pages
from ocr_app.engines import create_engine, resolve_engine_name
from ocr_app.metrics import Metrics
from ocr_app.ocr.pipeline import Job, Pipeline

ROOT = Path(__file__).resolve().parent.parent
RESULTS_FILE = Path(__file__).resolve().parent / "results.json"
BIN = Path(sys.executable).parent

GOAL_VS_DIRECT = 0.97
GOAL_VS_PEER = 1.3
GOAL_HEALTHZ_P99_MS = 50.0
GOAL_DECODE_MS = 40.0
GOAL_JOBS_RATIO = 0.95  # job pages/s / the same pages as synchronous requests: the queue costs nothing
GOAL_JOBS_LATENCY_RATIO = 1.25  # /v1/ocr latency beside a running job / without one
THINK_S = 1.0  # measurement 8's second interactive client: this long between requests (> job_yield_s)
GOAL_LAYOUT_RATIO = 1.2  # per page, orientation and layout on / both off, upright single-column pages
# Measurement 6: client A's upload pace (100 Mbit/s, a fast office link) and the nested PDF's first depth.
ATTACK_UPLOAD_BYTES_PER_S = 100e6 / 8
ATTACK_CHUNK = 64 * 1024
ATTACK_PDF_DEPTH = 5

pc = time.perf_counter


def tests_module(name: str):
    """tests/<name>.py, imported with the repo root on sys.path, whatever the cwd."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(f"tests.{name}")


def docs_module():
    """tests/docs.py: the renderer the contract tests use."""
    return tests_module("docs")


def hostile_module():
    """tests/hostile.py: issue #9's hostile documents (`multipart_parts`, `nested_xobject_pdf`)."""
    return tests_module("hostile")


# --------------------------------------------------------------------------------------------- documents


@dataclass
class Doc:
    name: str
    data: bytes
    ctype: str
    size: tuple[int, int]

    @property
    def filename(self) -> str:
        return f"{self.name}.{self.ctype.split('/')[1]}"

    def describe(self) -> str:
        fmt = self.ctype.split("/")[1].upper()
        return f"{self.name} {self.size[0]}x{self.size[1]} {fmt} {len(self.data) / 1024:.0f} KiB"


def _doc(name: str, image: Image.Image, fmt: str, d, **params) -> Doc:
    ctype = {"PNG": "image/png", "JPEG": "image/jpeg"}[fmt]
    return Doc(name, d.encode(image, fmt, **params), ctype, image.size)


def letter_page(d) -> Image.Image:
    """A 1700x2200 page (US letter at 200 dpi) with 25 lines of mixed English and Latin text."""
    pool = d.TEXTS["en"] + d.TEXTS["latin"]
    lines = [pool[i % len(pool)] for i in range(25)]
    body = d.render(lines, "en", size=36, width=1700, margin=90).image
    page = Image.new("RGB", (1700, 2200), "white")
    page.paste(body, (0, 0))
    return page


def photo_of_page(d) -> Image.Image:
    """A 4000x3000 (12 MP) camera-like shot of a page: a desk, uneven light, blur and sensor noise."""
    pool = d.TEXTS["en"] + d.TEXTS["latin"]
    lines = [pool[i % len(pool)] for i in range(15)]
    paper = d.render(lines, "en", size=80, width=3300, margin=120).image
    canvas = Image.new("RGB", (4000, 3000), (92, 78, 64))
    canvas.paste(paper, (350, (3000 - paper.height) // 2))
    canvas = canvas.filter(ImageFilter.GaussianBlur(1.2))
    px = np.asarray(canvas, dtype=np.float32)
    yy, xx = np.mgrid[0:3000, 0:4000].astype(np.float32)
    light = 0.78 + 0.22 * (1 - ((xx - 2600) ** 2 + (yy - 1200) ** 2) / (4000**2 + 3000**2))
    px *= light[..., None]
    px += np.random.default_rng(7).normal(0, 5, px.shape).astype(np.float32)
    return Image.fromarray(np.clip(px, 0, 255).astype(np.uint8))


def make_documents(d) -> tuple[list[Doc], Doc, bytes]:
    """(the throughput set, the letter page as a PDF, the 12 MP photo JPEG bytes)."""
    docs = []
    photo = photo_of_page(d)
    docs.append(_doc("photo-12mp", photo, "JPEG", d, quality=90))
    letter = letter_page(d)
    docs.append(_doc("letter", letter, "PNG", d))
    for lang, fmt in (("en", "PNG"), ("latin", "JPEG"), ("zh", "PNG"), ("ja", "JPEG")):
        params = {"quality": 90} if fmt == "JPEG" else {}
        docs.append(_doc(lang, d.render(d.TEXTS[lang], lang).image, fmt, d, **params))
    letter_pdf = Doc("letter-pdf", d.pdf([letter], dpi=200), "application/pdf", letter.size)
    return docs, letter_pdf, docs[0].data


# ----------------------------------------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_status_kb(pid: int, key: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("OCR_APP_")}


class Process:
    """A server process we started: log to a file, wait until it answers, always stopped."""

    def __init__(self, name: str, argv: list[str], workdir: Path, health_path: str, port: int):
        self.name = name
        self.argv = argv
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.health_path = health_path
        self.log_file = workdir / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 300) -> Process:
        with self.log_file.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=_clean_env())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.logs()[-3000:]}")
            try:
                r = httpx.get(self.url + self.health_path, timeout=5)
                if r.status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{self.name} not ready within {timeout}s:\n{self.logs()[-3000:]}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def logs(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def check_alive(self) -> None:
        """Raise, with the exit status and the log's tail, when the server has died under us."""
        if self.proc is not None and self.proc.poll() is not None:
            rc = self.proc.returncode
            how = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"
            raise RuntimeError(
                f"{self.name} (pid {self.proc.pid}) died: {how}; log tail:\n{self.logs()[-2000:]}"
            )

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def ocr_app_argv() -> list[str]:
    exe = shutil.which("ocr-app", path=str(BIN))
    return [exe] if exe else [sys.executable, "-m", "ocr_app.cli"]


def peer_argv(port: int) -> list[str]:
    exe = shutil.which("rapidocr_api", path=str(BIN))
    base = [exe] if exe else [sys.executable, "-m", "rapidocr_api.main"]
    return [*base, "--ip", "127.0.0.1", "-p", str(port)]


class OurService:
    """`ocr-app serve` with a fresh key, a YAML config, on a free loopback port."""

    def __init__(self, workdir: Path, overrides: dict):
        workdir.mkdir(parents=True, exist_ok=True)
        keys_file = workdir / "keys.txt"
        out = subprocess.run(
            [*ocr_app_argv(), "keys", "add", "bench", "--file", str(keys_file)],
            capture_output=True,
            text=True,
            check=True,
            env=_clean_env(),
        )
        self.key = out.stdout.strip().splitlines()[-1]
        self.port = free_port()
        config = {
            "port": self.port,
            "api_keys_file": str(keys_file),
            "drain_file": str(workdir / "drain"),
            "log_level": "warning",
            **overrides,
        }
        self.config_file = workdir / "config.yml"
        self.config_file.write_text(yaml.safe_dump(config))
        self.settings: Settings = load_settings(self.config_file)
        self.process = Process(
            "ocr-app",
            [*ocr_app_argv(), "serve", "--config", str(self.config_file)],
            workdir,
            "/healthz",
            self.port,
        )

    def start(self) -> OurService:
        self.process.start()
        return self

    def stop(self) -> None:
        self.process.stop()


# ---------------------------------------------------------------------------------------------- jobs


def job_pages(d, n: int) -> list[Image.Image]:
    """n pages of text (four distinct ones, repeated), each read by the engine in a fraction of a second."""
    pool = d.TEXTS["en"] + d.TEXTS["latin"]
    distinct = [d.render([pool[(i + k) % len(pool)] for k in range(12)], "en").image for i in range(4)]
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


def bench_jobs(workdir: Path, overrides: dict, cfg: Config, d) -> dict:
    """Measurement 8: the same pages as one bulk job and as synchronous requests, one service, rounds
    alternating which goes first."""
    cluster = tests_module("postgres").Cluster().start()
    svc = None
    try:
        svc = OurService(workdir / "ours-jobs", {**overrides, "database_url": cluster.create_database("ocr")})
        subprocess.run(
            [*ocr_app_argv(), "db", "upgrade", "--config", str(svc.config_file)],
            check=True,
            capture_output=True,
            env=_clean_env(),
        )
        svc.start()
        engine = resolve_engine_name(svc.settings)
        c = svc.settings.for_engine(engine).max_concurrency or 1
        pages = job_pages(d, cfg.job_pages)
        document = d.pdf(pages, dpi=200)
        singles = [d.pdf([p], dpi=200) for p in pages]
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
        latency = latency_beside_job(svc, singles[0], d.pdf(pages * 2, dpi=200), cfg.latency_requests)
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


# ---------------------------------------------------------------------------------------------- load


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


def _client(url: str, concurrency: int, headers: dict | None = None) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
    return httpx.AsyncClient(base_url=url, headers=headers or {}, timeout=600, limits=limits)


def ours_pass(svc: OurService, docs: list[Doc], concurrency: int, side: str = "service") -> PassResult:
    async def run() -> PassResult:
        async with _client(svc.process.url, concurrency, {"Authorization": f"Bearer {svc.key}"}) as client:

            async def one(doc: Doc) -> int:
                r = await client.post("/v1/ocr", content=doc.data, headers={"Content-Type": doc.ctype})
                if r.status_code != 200:
                    raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
                return sum(len(p["lines"]) for p in r.json()["pages"])

            return await drive(side, docs, concurrency, one)

    res = asyncio.run(run())
    svc.process.check_alive()
    return res


def peer_pass(peer: Process, docs: list[Doc], concurrency: int) -> PassResult:
    async def run() -> PassResult:
        async with _client(peer.url, concurrency) as client:

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


# ------------------------------------------------------------------------------------------ statistics


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


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -------------------------------------------------------------------------------------------- phases


@dataclass
class Config:
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

    d = docs_module()
    singles = [d.render(d.TEXTS[lang], lang).image for lang in ("en", "latin")] + [
        d.render([f"Line {k} of a plain letter, one column of text" for k in range(12)], size=32).image
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
        for name, doc in d.layout_pages().items():
            row = {"page": name}
            for variant in ("upright", "90", "180", "270", "photo"):
                image = doc.image
                if variant == "photo":
                    image = d.photo_like(image)
                elif variant != "upright":
                    image = image.rotate(int(variant), expand=True)
                got = on._run(image)
                flat = " ".join(doc.text.split()), " ".join(got.joined_text().split())
                row[variant] = {"cer": jiwer.cer(*flat), "rotation": got.rotation}
            cer_rows.append(row)
    finally:
        for eng in (on, off):
            asyncio.run(eng.close())
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
    }


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


class HealthzSampler:
    """/healthz requested one after another (`interval` apart, one keep-alive connection) in a thread, from
    the first answer that shows work in service (inflight + queued > 0) until stop(): measurements 3 and 6."""

    def __init__(self, svc: OurService, interval: float = 0.01):
        self.svc = svc
        self.interval = interval
        self.samples: list[float] = []
        self.statuses: dict[str, int] = {}
        self.seen = {"max_inflight": 0, "max_queued": 0, "max_in_service": 0, "non_200": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="healthz-sampler", daemon=True)

    def __enter__(self) -> HealthzSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(60)

    def _run(self) -> None:
        seen = self.seen
        try:
            started = False
            with httpx.Client(base_url=self.svc.process.url, timeout=30) as client:
                client.get("/healthz")  # connect outside the measured window
                while not self._stop.is_set():
                    if self.svc.process.proc.poll() is not None:
                        return
                    t = pc()
                    r = client.get("/healthz")
                    dt = pc() - t
                    body = r.json()
                    total = body.get("inflight", 0) + body.get("queued", 0)
                    started = started or total > 0  # the window opens with the first request in service
                    if started:
                        self.samples.append(dt)
                        code = str(r.status_code)
                        self.statuses[code] = self.statuses.get(code, 0) + 1
                        seen["non_200"] += r.status_code != 200
                        seen["max_inflight"] = max(seen["max_inflight"], body.get("inflight", 0))
                        seen["max_queued"] = max(seen["max_queued"], body.get("queued", 0))
                        seen["max_in_service"] = max(seen["max_in_service"], total)
                    time.sleep(self.interval)
        except httpx.TransportError:
            return  # the server went away: the load reports it

    def summary(self) -> dict:
        s = self.samples
        return {
            "p50_ms": (median(s) or 0) * 1000,
            "p99_ms": (percentile(s, 99) or 0) * 1000,
            "max_ms": max(s, default=0) * 1000,
            "n": len(s),
            "healthz_statuses": dict(self.statuses),
            **self.seen,
        }


def bench_healthz(svc: OurService, big: list[Doc], interval: float = 0.01) -> dict:
    """Measurement 3: sample /healthz one after another while every big document is in flight."""
    with HealthzSampler(svc, interval) as sampler:
        load = ours_pass(svc, big, len(big), side="healthz-load")
    return {
        **sampler.summary(),
        "documents_in_flight": len(big),
        "load_seconds": load.seconds,
        "load_errors": load.errors,
    }


def multipart_just_under(h, limit: int) -> tuple[bytes, str, int]:
    """tests/hostile.py's multipart body of tiny parts, with as many parts as fit in `limit` bytes (the
    server answers 413 to a declared length over max_upload_bytes): (body, Content-Type, parts)."""
    one = len(h.multipart_parts(2)[0]) - len(h.multipart_parts(1)[0])
    closing = len(h.multipart_parts(1)[0]) - one
    parts = (limit - closing) // one
    body, ctype = h.multipart_parts(parts)
    assert len(body) <= limit, (len(body), limit)
    return body, ctype, parts


@dataclass
class Attacker:
    """One attacking client: what it sent and what came back (status code -> count)."""

    name: str
    requests: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    timed_out: int = 0  # the client timeout (the measurement's bound) fired
    abandoned: int = 0  # still running at the bound: cancelled
    errors: list[str] = field(default_factory=list)

    async def send(self, request: Awaitable[httpx.Response]) -> tuple[int, float] | None:
        self.requests += 1
        t = pc()
        try:
            r = await request
        except httpx.TimeoutException:
            self.timed_out += 1
            return None
        except asyncio.CancelledError:
            self.abandoned += 1
            raise
        except httpx.TransportError as err:
            self.errors.append(f"{type(err).__name__}: {str(err)[:200]}")
            return None
        dt = pc() - t
        self.statuses[str(r.status_code)] = self.statuses.get(str(r.status_code), 0) + 1
        self.latencies.append(dt)
        return r.status_code, dt

    def summary(self) -> dict:
        return {
            "requests": self.requests,
            "statuses": dict(sorted(self.statuses.items())),
            "latency_p50_s": median(self.latencies),
            "latency_max_s": max(self.latencies, default=None),
            "timed_out": self.timed_out,
            "abandoned": self.abandoned,
            "errors": self.errors,
        }


def bench_attack(svc: OurService, h, window_s: float, interval: float = 0.01) -> dict:
    """Measurement 6: /healthz sampled (as in 3) for `window_s` while client A uploads a multipart body of
    tiny parts just under max_upload_bytes at ATTACK_UPLOAD_BYTES_PER_S, again and again, and client B sends
    the nested-XObject PDF again and again (each keeps a decode worker busy up to decode_cpu_s).

    Bounded: at the window's end no new request starts; one still running gets until its client timeout
    (3 x decode_cpu_s + 30 s, under request_timeout_s), then is cancelled. The server does not stop a
    request's work when its client goes away (the decode runs on to decode_cpu_s), so the measurement
    then waits, also bounded, until the service reports nothing in flight: what follows starts clean."""
    s = svc.settings
    body, ctype, parts = multipart_just_under(h, s.max_upload_bytes)
    client_timeout_s = min(s.request_timeout_s, 3 * s.decode_cpu_s + 30)
    auth = {"Authorization": f"Bearer {svc.key}"}
    a = Attacker("multipart")
    b = Attacker("nested_pdf")
    b_depths: dict[str, dict[str, int]] = {}  # depth -> status -> count
    pdfs: dict[int, bytes] = {}
    depth = ATTACK_PDF_DEPTH

    async def paced_body() -> AsyncIterator[bytes]:
        t0 = pc()
        for sent in range(0, len(body), ATTACK_CHUNK):
            yield body[sent : sent + ATTACK_CHUNK]
            ahead = (sent + ATTACK_CHUNK) / ATTACK_UPLOAD_BYTES_PER_S - (pc() - t0)
            if ahead > 0:
                await asyncio.sleep(ahead)

    async def client_a(client: httpx.AsyncClient, end: float) -> None:
        headers = {**auth, "Content-Type": ctype, "Content-Length": str(len(body))}  # as a browser sends it
        while pc() < end:
            await a.send(client.post("/v1/ocr", content=paced_body(), headers=headers))

    async def client_b(client: httpx.AsyncClient, end: float) -> None:
        nonlocal depth
        headers = {**auth, "Content-Type": "application/pdf"}
        while pc() < end:
            pdf = pdfs.setdefault(depth, h.nested_xobject_pdf(depth))
            out = await b.send(client.post("/v1/ocr", content=pdf, headers=headers))
            if out:
                per = b_depths.setdefault(str(depth), {})
                per[str(out[0])] = per.get(str(out[0]), 0) + 1
                if out[0] == 400 and out[1] < 2 and depth > 1:
                    depth -= 1  # refused early: the attack is the deepest depth served or refused late

    def in_service(client: httpx.Client) -> int:
        health = client.get("/healthz").json()
        return health.get("inflight", 0) + health.get("queued", 0)

    async def attack(sampler: HealthzSampler) -> dict:
        limits = httpx.Limits(max_connections=1)
        async with (
            httpx.AsyncClient(base_url=svc.process.url, timeout=client_timeout_s, limits=limits) as ca,
            httpx.AsyncClient(base_url=svc.process.url, timeout=client_timeout_s, limits=limits) as cb,
        ):
            t0 = pc()
            end = t0 + window_s
            tasks = [asyncio.create_task(client_a(ca, end)), asyncio.create_task(client_b(cb, end))]
            await asyncio.sleep(window_s)
            await asyncio.to_thread(sampler.stop)
            _, pending = await asyncio.wait(tasks, timeout=client_timeout_s + 5)
            for task in pending:
                task.cancel()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            for who, out in zip((a, b), outcomes, strict=True):
                if isinstance(out, Exception):  # not a cancellation (a BaseException): a bench bug, shown
                    who.errors.append(f"{type(out).__name__}: {str(out)[:200]}")
            return {"window_s": window_s, "tail_s": pc() - end}

    with HealthzSampler(svc, interval) as sampler:
        timing = asyncio.run(attack(sampler))
    # The service's own end of the attack: nothing in flight any more (bounded).
    t = pc()
    drained = False
    with httpx.Client(base_url=svc.process.url, timeout=30) as client:
        while pc() - t < client_timeout_s and svc.process.proc.poll() is None:
            if in_service(client) == 0:
                drained = True
                break
            time.sleep(0.2)
    svc.process.check_alive()
    return {
        **sampler.summary(),
        **timing,
        "drain_s": pc() - t,
        "drained": drained,
        "client_timeout_s": client_timeout_s,
        "multipart": {
            **a.summary(),
            "bytes": len(body),
            "parts": parts,
            "max_upload_bytes": s.max_upload_bytes,
            "upload_mbit_s": ATTACK_UPLOAD_BYTES_PER_S * 8 / 1e6,
        },
        "nested_pdf": {
            **b.summary(),
            "depths": b_depths,
            "depth": depth,  # the last one sent: the deepest not refused early
            "bytes": {str(d): len(p) for d, p in pdfs.items()},
            "decode_cpu_s": s.decode_cpu_s,
        },
    }


# ---------------------------------------------------------------------------------------------- report


def fmt(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("PASS" if ok else "MISS")


def healthz_p99_row(label: str, m: dict, notes: str) -> tuple[str, str, str, str, str, str, str]:
    """Measurements 3 and 6: /healthz p99 against its goal."""
    ok = m["p99_ms"] < GOAL_HEALTHZ_P99_MS if m["n"] else None
    return (label, fmt(m["p99_ms"], ".1f"), "", "", f"< {GOAL_HEALTHZ_P99_MS:g}", verdict(ok), notes)


def build_rows(res: dict) -> list[tuple[str, str, str, str, str, str, str]]:
    rows = []
    for c, m in (res.get("service_vs_direct") or {}).items():
        s, d, r = m["service"], m["direct"], m["ratio"]
        rows.append(
            (
                f"1 service / direct engine  {c}  docs/s",
                fmt(s["throughput_docs_per_s"]),
                fmt(d["throughput_docs_per_s"]),
                fmt(r),
                f">= {GOAL_VS_DIRECT}",
                verdict(None if r is None else r >= GOAL_VS_DIRECT),
                f"{s['passes']}+{d['passes']} passes x {s['docs_per_pass']} docs",
            )
        )
    for c, m in (res.get("service_vs_peer") or {}).items():
        s, p, r = m["service"], m["rapidocr_api"], m["ratio"]
        rows.append(
            (
                f"2 service / rapidocr-api   {c}  docs/s",
                fmt(s["throughput_docs_per_s"]),
                fmt(p["throughput_docs_per_s"]),
                fmt(r, ".2f"),
                f">= {GOAL_VS_PEER}",
                verdict(None if r is None else r >= GOAL_VS_PEER),
                f"{s['passes']}+{p['passes']} passes x {s['docs_per_pass']} docs",
            )
        )
    h = res.get("healthz")
    if h:
        rows.append(
            (
                f"3 /healthz p50, {h['documents_in_flight']} big docs in flight  ms",
                fmt(h["p50_ms"], ".1f"),
                "",
                "",
                "",
                "",
                f"n={h['n']}",
            )
        )
        rows.append(
            healthz_p99_row(
                "3 /healthz p99                              ms",
                h,
                f"max {h['max_ms']:.1f} ms, peak {h['max_in_service']} in service",
            )
        )
    j = res.get("jobs")
    if j:
        rows.append(
            (
                "8 bulk job / synchronous requests  pages/s",
                fmt(j["job_pages_per_s"]),
                fmt(j["sync_pages_per_s"]),
                fmt(j["ratio"]),
                f">= {GOAL_JOBS_RATIO}",
                verdict(j["ratio"] >= GOAL_JOBS_RATIO),
                f"{j['pages']} pages x {j['rounds']} rounds, medians; sync clients {j['client_concurrency']}",
            )
        )
        lat = j["latency"]
        rows.append(
            (
                "8 /v1/ocr p50 beside a job / without  ms",
                fmt(lat["job_p50_ms"], ".0f"),
                fmt(lat["idle_p50_ms"], ".0f"),
                fmt(lat["ratio"], ".2f"),
                f"<= {GOAL_JOBS_LATENCY_RATIO}",
                verdict(lat["ratio"] <= GOAL_JOBS_LATENCY_RATIO if lat["job_ran_throughout"] else None),
                f"n={lat['n']} each, one client; p95 {lat['job_p95_ms']:.0f} / {lat['idle_p95_ms']:.0f} ms"
                f"; job pages read meanwhile {lat['job_pages_meanwhile']}"
                + ("" if lat["job_ran_throughout"] else "; the job ended first: no verdict"),
            )
        )
        rows.append(
            (
                f"8 same, client pausing {lat['think_s']:g} s  ms",
                fmt(lat["think_p50_ms"], ".0f"),
                fmt(lat["idle_think_p50_ms"], ".0f"),
                fmt(lat["think_ratio"], ".2f"),
                f"<= {GOAL_JOBS_LATENCY_RATIO}",
                verdict(
                    lat["think_ratio"] <= GOAL_JOBS_LATENCY_RATIO if lat["think_ran_throughout"] else None
                ),
                f"job pages read meanwhile {lat['think_job_pages']}; p95 {lat['think_p95_ms']:.0f} ms"
                + ("" if lat["think_ran_throughout"] else "; the job ended first: no verdict"),
            )
        )
    rows += attack_rows(res.get("attack"))
    rows += layout_rows(res.get("layout"))
    dec = res.get("decode")
    if dec:
        rows.append(
            (
                "4 12 MP JPEG -> 1540 px: ours / full decode  ms",
                fmt(dec["ours_ms"], ".1f"),
                fmt(dec["full_decode_ms"], ".1f"),
                fmt(dec["ratio_ours_over_full"], ".2f"),
                f"ours <= {GOAL_DECODE_MS:g}",
                verdict(dec["ours_ms"] <= GOAL_DECODE_MS),
                f"n={dec['n']}, {dec['speedup']:.1f}x faster; "
                f"load_pages in-process {dec['in_process_ms']:.1f} ms; "
                f"half-scale decode alone {dec['decode_floor_ms']:.1f} ms",
            )
        )
    b = res.get("bomb")
    if b:
        rows.append(
            (
                "+ PNG bomb 40000x40000 refusal  ms",
                fmt(b["latency_ms"], ".1f"),
                "",
                "",
                "",
                "",
                f"n={b['n']}, HTTP {b['statuses']}",
            )
        )
        rows.append(
            (
                "+ server RSS growth (peak growth)  MiB",
                fmt(b["rss_growth_mb"], ".1f"),
                "",
                "",
                "",
                "",
                f"peak +{fmt(b['peak_rss_growth_mb'], '.1f')}, base {fmt(b['rss_before_mb'], '.0f')} MiB",
            )
        )
    return rows


def layout_rows(lay: dict | None) -> list[tuple[str, str, str, str, str, str, str]]:
    if not lay:
        return []
    rows = [
        (
            "7 page, orientation+layout on / off  ms",
            fmt(lay["orientation_on_ms"], ".1f"),
            fmt(lay["before_ms"], ".1f"),
            fmt(lay["ratio"], ".2f"),
            f"<= {GOAL_LAYOUT_RATIO}",
            verdict(lay["ratio"] <= GOAL_LAYOUT_RATIO),
            f"n={lay['n']} upright 1-column pages; layout {fmt(lay['layout_ms'], '.2f')} ms vs row sort "
            f"{fmt(lay['row_sort_ms'], '.2f')}; orientation off {fmt(lay['orientation_off_ms'], '.1f')}",
        )
    ]
    (small, ms_small), (large, ms_large) = sorted(lay["dense_ms"].items())
    rows.append(
        (
            f"7 layout of a dense page, {large} / {small} lines  ms",
            fmt(ms_large, ".1f"),
            fmt(ms_small, ".1f"),
            fmt(ms_large / ms_small, ".1f"),
            "",
            "",
            f"three shuffled columns; {large / small:.0f}x the lines: ~{large / small:.0f}-5x if n log n, "
            f"~{(large / small) ** 2:.0f}x if quadratic",
        )
    )
    for r in lay["cer"]:
        cells = [f"{v} {r[v]['cer']:.3f}" + ("" if r[v]["rotation"] == 0 else f" (turned {r[v]['rotation']})")
                 for v in ("upright", "90", "180", "270", "photo")]  # fmt: skip
        rows.append((f"7 CER {r['page']}", "", "", "", "", "", "; ".join(cells)))
    return rows


def _statuses(statuses: dict[str, int]) -> str:
    return ", ".join(f"{n}x {code}" for code, n in statuses.items()) or "none answered"


def attack_rows(at: dict | None) -> list[tuple[str, str, str, str, str, str, str]]:
    """Measurement 6's rows: /healthz p50 and p99 under attack, then what the attack was and got."""
    if not at:
        return []
    mp, pdf = at["multipart"], at["nested_pdf"]
    depths = "/".join(sorted(pdf["depths"], reverse=True)) or str(pdf["depth"])
    by_depth = len(pdf["depths"]) > 1  # a depth refused early, then a shallower one: each one's statuses
    what = f"{mp['bytes'] / 2**20:.0f} MiB multipart of {mp['parts']} parts + nested PDF depth {depths}"

    def attacker(a: dict, label: str) -> str:
        more = [f"{a[k]} {k.replace('_', ' ')}" for k in ("timed_out", "abandoned") if a[k]]
        took = f"p50 {fmt(a['latency_p50_s'], '.1f')} s"
        return f"{label} {_statuses(a['statuses'])} ({', '.join([took, *more])})"

    return [
        (f"6 /healthz p50 under attack ({what})  ms", fmt(at["p50_ms"], ".1f"), *[""] * 4, f"n={at['n']}"),
        healthz_p99_row(
            "6 /healthz p99 under attack  ms",
            at,
            f"max {at['max_ms']:.1f} ms, /healthz {_statuses(at['healthz_statuses'])}",
        ),
        (
            f"6 attack requests started in {at['window_s']:g} s (HTTP status)",
            "",
            "",
            "",
            "",
            "",
            attacker(mp, f"A multipart at {mp['upload_mbit_s']:g} Mbit/s:")
            + "; "
            + attacker(pdf, "B nested PDF:")
            + "".join(f"; depth {d}: {_statuses(st)}" for d, st in pdf["depths"].items() if by_depth)
            + f"; drained {fmt(at['drain_s'], '.1f')} s after",
        ),
    ]


def print_report(res: dict) -> None:
    header = ("measurement", "ours", "reference", "ratio", "goal", "result", "n / notes")
    rows = [header, *build_rows(res)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    print()
    print(f"ocrfleet bench ({res['mode']}), {res['machine']['cpus']} CPUs, load {res['machine']['loadavg']}")
    print(f"ours: {res['settings_text']}")
    print("documents: " + "; ".join(res["documents"]))
    print(line)
    for i, r in enumerate(rows):
        print(
            "  ".join(
                c.ljust(w) if j == 0 or j == 6 else c.rjust(w)
                for j, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
        if i == 0:
            print(line)
    print(line)
    for name, m in (res.get("service_vs_peer") or {}).items():
        lines_ours = m["service"]["lines"]
        lines_peer = m["rapidocr_api"]["lines"]
        print(
            f"lines recognised per doc ({name}) ours / rapidocr-api: "
            + ", ".join(f"{k} {lines_ours.get(k, '-')}/{lines_peer.get(k, '-')}" for k in lines_ours)
        )
        break
    for err in res["errors"]:
        print(f"ERROR: {err}")
    print()


# ------------------------------------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> tuple[Config, bool]:
    p = argparse.ArgumentParser(
        prog="bench.run", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="one round, fewer repetitions: for development")
    p.add_argument("--rounds", type=int, help="passes per side and concurrency (default 2, quick 1)")
    p.add_argument(
        "--only",
        default="direct,peer,healthz,decode,bomb,attack,layout,jobs",
        help="comma-separated subset of: direct,peer,healthz,decode,bomb,attack,layout,jobs",
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
    d = docs_module()
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
    docs, letter_pdf, photo = make_documents(d)
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
                res["bomb"] = bench_bomb(service(), d.png_bomb(), cfg.bomb_reps)

            def healthz() -> None:
                log(f"measurement 3: /healthz with {len(big_docs)} big documents in flight")
                res["healthz"] = bench_healthz(service(), big_docs)

            def attack() -> None:
                log(f"measurement 6: /healthz under attack for {cfg.attack_window_s:g} s")
                res["attack"] = bench_attack(service(), hostile_module(), cfg.attack_window_s)

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
        guarded("jobs", lambda: res.__setitem__("jobs", bench_jobs(workdir, overrides, cfg, d)))

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
