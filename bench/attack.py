"""Measurement 6: /healthz p50/p99 under attack. Client A uploads a multipart body of tiny parts just under
max_upload_bytes at a fast office link's pace, client B sends the nested-XObject PDF (both tests/hostile.py's
documents), again and again, while /healthz is sampled as in measurement 3."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field

import httpx

from bench.harness import median, pc
from bench.healthz import HealthzSampler
from bench.servers import OurService
from tests.hostile import multipart_parts, nested_xobject_pdf

# Client A's upload pace (100 Mbit/s, a fast office link) and the nested PDF's first depth.
ATTACK_UPLOAD_BYTES_PER_S = 100e6 / 8
ATTACK_CHUNK = 64 * 1024
ATTACK_PDF_DEPTH = 5


def multipart_just_under(limit: int) -> tuple[bytes, str, int]:
    """tests/hostile.py's multipart body of tiny parts, with as many parts as fit in `limit` bytes (the
    server answers 413 to a declared length over max_upload_bytes): (body, Content-Type, parts)."""
    one = len(multipart_parts(2)[0]) - len(multipart_parts(1)[0])
    closing = len(multipart_parts(1)[0]) - one
    parts = (limit - closing) // one
    body, ctype = multipart_parts(parts)
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


def bench_attack(svc: OurService, window_s: float, interval: float = 0.01) -> dict:
    """Measurement 6: /healthz sampled (as in 3) for `window_s` while client A uploads a multipart body of
    tiny parts just under max_upload_bytes at ATTACK_UPLOAD_BYTES_PER_S, again and again, and client B sends
    the nested-XObject PDF again and again (each keeps a decode worker busy up to decode_cpu_s).

    Bounded: at the window's end no new request starts; one still running gets until its client timeout
    (3 x decode_cpu_s + 30 s, under request_timeout_s), then is cancelled. The server does not stop a
    request's work when its client goes away (the decode runs on to decode_cpu_s), so the measurement
    then waits, also bounded, until the service reports nothing in flight: what follows starts clean."""
    s = svc.settings
    body, ctype, parts = multipart_just_under(s.max_upload_bytes)
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
            pdf = pdfs.setdefault(depth, nested_xobject_pdf(depth))
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
