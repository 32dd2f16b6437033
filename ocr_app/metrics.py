"""Prometheus metrics, in a registry per app so that several apps can live in one process (tests)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

# OCR takes from tens of milliseconds (a receipt on a GPU) to minutes (a 50-page PDF on a CPU).
_SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300)


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self.requests = Counter("ocr_requests", "OCR requests by HTTP status", ["code"], registry=r)
        self.request_duration = Histogram(
            "ocr_request_duration_seconds",
            "OCR request latency, queue included",
            buckets=_SECONDS,
            registry=r,
        )
        self.pages = Counter("ocr_pages", "Pages recognised", registry=r)
        self.inference = Histogram(
            "ocr_inference_seconds", "Engine time per request", buckets=_SECONDS, registry=r
        )
        self.rejected = Counter("ocr_rejected", "Requests refused, by error code", ["reason"], registry=r)
        self.inflight = Gauge("ocr_inflight_requests", "OCR requests being processed", registry=r)
        self.queue_depth = Gauge("ocr_queue_depth", "OCR requests waiting for a slot", registry=r)
        self.model_loaded = Gauge("ocr_model_loaded", "1 once the engine passed its self-test", registry=r)
        self.info = Gauge(
            "ocr_build_info", "Version, engine and model", ["version", "engine", "model"], registry=r
        )

    def track(
        self, inflight: Callable[[], float], queued: Callable[[], float], engine_pages: Callable[[], float]
    ) -> None:
        self.inflight.set_function(inflight)
        self.queue_depth.set_function(queued)
        self.registry.register(_EnginePages(engine_pages))


class _EnginePages(Collector):
    """Pages the engine ran, read from the engine itself: shows that abandoned work stops."""

    def __init__(self, read: Callable[[], float]):
        self.read = read

    def collect(self):
        yield CounterMetricFamily(
            "ocr_engine_pages",
            "Pages the engine ran, including those of timed-out requests",
            value=self.read(),
        )
