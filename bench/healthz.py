"""Measurement 3: /healthz p50/p99 while large documents are in flight, sampled by the HealthzSampler that
measurement 6 (bench/attack.py) samples with too."""

from __future__ import annotations

import threading
import time

import httpx

from bench.documents import Doc
from bench.harness import median, ours_pass, pc, percentile
from bench.servers import OurService


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
