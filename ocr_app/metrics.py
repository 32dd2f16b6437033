"""Prometheus metrics, in a registry per app so that several apps can live in one process (tests)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from .errors import NotReady, Overloaded, Timeout

# OCR takes from tens of milliseconds (a receipt on a GPU) to minutes (a 50-page PDF on a CPU).
_SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300)


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        # /v1/ocr and /v1/chat/completions; the latter also on its own.
        self.requests = Counter("ocr_requests", "OCR requests by HTTP status", ["code"], registry=r)
        self.chat_requests = Counter(
            "ocr_chat_requests", "OpenAI-style chat completion requests by HTTP status", ["code"], registry=r
        )
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
        # Capacity refusals exist at 0 from the start: rate() then sees an instance's very first one.
        for code in (Overloaded.code, NotReady.code, Timeout.code):
            self.rejected.labels(code)
        self.decode_killed = Counter(
            "ocr_decode_workers_killed",
            "Decode workers stopped (and replaced), by reason: "
            "deadline, client_gone, cpu_limit, memory_limit, crashed",
            ["reason"],
            registry=r,
        )
        # How late the event loop's periodic wake-up is (ocr_app/ocr/health.py), one sample every 0.25 s. A
        # histogram rather than a gauge of the recent max: a scrape cannot miss a spike between two scrapes,
        # rate(_sum) is the share of time requests waited on a busy loop, and the buckets above 0.1 s
        # count the blocks an operator alerts on (a healthy loop stays in the lowest buckets).
        self.loop_lag = Histogram(
            "ocr_event_loop_lag_seconds",
            "How late the event loop woke from a 0.25 s sleep",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        # Bulk jobs (ocr_app/jobs/). The first three are the job database's, fleet-wide, as this instance last
        # read them (every job_sweep_s): aggregate them with max(), not sum().
        self.jobs = Gauge(
            "ocr_jobs", "Jobs in the job database, by status (fleet-wide)", ["status"], registry=r
        )
        for status in ("queued", "running", "done", "failed", "cancelled"):
            self.jobs.labels(status)
        self.job_pages_queued = Gauge(
            "ocr_job_pages_queued", "Job pages waiting for a worker (fleet-wide)", registry=r
        )
        self.job_oldest_queued = Gauge(
            "ocr_job_oldest_queued_seconds",
            "Age of the longest-waiting job page range (fleet-wide)",
            registry=r,
        )
        self.job_lease_expiries = Counter(
            "ocr_job_lease_expiries",
            "Page ranges this instance claimed after their previous owner's lease expired (a dead worker)",
            registry=r,
        )
        self.job_pages = Counter(
            "ocr_job_pages", "Job pages this instance wrote, by outcome (ok, failed)", ["outcome"], registry=r
        )
        for outcome in ("ok", "failed"):
            self.job_pages.labels(outcome)
        # Each attempt this instance made to deliver a job's webhook: delivered (2xx), retried (a 5xx, a
        # time-out or no connection, with attempts left), failed (given up: 3xx/4xx, attempts spent, the URL
        # no longer allowed). failed is also logged at warning priority.
        self.job_webhooks = Counter(
            "ocr_job_webhooks",
            "Job webhook delivery attempts by outcome (delivered, retried, failed)",
            ["outcome"],
            registry=r,
        )
        for outcome in ("delivered", "retried", "failed"):
            self.job_webhooks.labels(outcome)
        # Registered by the job worker (JobWorker.start) only: an instance without a job database has none,
        # so that OcrJobStoreUnreachable never fires for it.
        self.job_store_up = Gauge(
            "ocr_job_store_up",
            "1 when this instance's last probe of the job database was answered in time (job_db_timeout_s)",
            registry=None,
        )
        # ocr_shadow_* (the canary replays) are ocr_app/fleet/shadow.py's, in this registry.
        self.inflight = Gauge("ocr_inflight_requests", "Interactive OCR requests being processed", registry=r)
        self.job_pages_inflight = Gauge(
            "ocr_job_pages_inflight", "Bulk-job pages this instance is reading", registry=r
        )
        self.queue_depth = Gauge("ocr_queue_depth", "OCR requests waiting for a slot", registry=r)
        self.model_loaded = Gauge("ocr_model_loaded", "1 once the engine passed its self-test", registry=r)
        self.info = Gauge(
            "ocr_build_info", "Version, engine and model", ["version", "engine", "model"], registry=r
        )

    def track(
        self,
        inflight: Callable[[], float],
        queued: Callable[[], float],
        job_pages_inflight: Callable[[], float],
        engine_pages: Callable[[], float],
        engine_retries: Callable[[], float] | None = None,
        engine_rotations: Callable[[], dict[int, int]] | None = None,
        engine_collector: Collector | None = None,
    ) -> None:
        self.inflight.set_function(inflight)
        self.queue_depth.set_function(queued)
        self.job_pages_inflight.set_function(job_pages_inflight)
        # Read from the engine itself: shows that abandoned work stops.
        pages_doc = "Pages the engine ran, including those of timed-out requests"
        self.registry.register(_EngineCounter("ocr_engine_pages", pages_doc, engine_pages))
        if engine_retries is not None:
            self.registry.register(
                _EngineCounter(
                    "ocr_engine_retries",
                    "Pages run again after a degenerate answer (max_tokens reached or a repetition loop)",
                    engine_retries,
                )
            )
        if engine_rotations is not None:
            self.registry.register(_RotationCounter(engine_rotations))
        if engine_collector is not None:  # the backend's own metrics (vLLM's), exported beside ours
            self.registry.register(engine_collector)


class _EngineCounter(Collector):
    def __init__(self, name: str, documentation: str, read: Callable[[], float]):
        self.name = name
        self.documentation = documentation
        self.read = read

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.name, self.documentation, value=self.read())


class _RotationCounter(Collector):
    """ocr_page_rotations_total{degrees}: pages by the rotation the engine applied to read them upright."""

    def __init__(self, read: Callable[[], dict[int, int]]):
        self.read = read

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "ocr_page_rotations",
            "Pages the engine ran, by the rotation (degrees clockwise) it applied to read them upright",
            labels=["degrees"],
        )
        for degrees, pages in sorted(self.read().items()):
            family.add_metric([str(degrees)], pages)
        yield family
