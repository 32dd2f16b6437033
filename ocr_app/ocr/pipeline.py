"""The OCR pipeline: admission -> decode (in a worker process) -> engine -> the response, without HTTP.

The route (ocr_app/http/routes/ocr.py) validates the request, hands the pipeline a way to read the body, and
returns its answer; its error (ocr_app/errors.py: what went wrong, said without HTTP) becomes HTTP in
ocr_app/http/errors.py. bench/run.py drives this same Pipeline in-process, so the benchmark's "direct" side is
the service's own path with its own settings, minus HTTP.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..config import Settings
from ..documents.decode import DecodePool, DecodeRequest
from ..documents.image import PageImage
from ..engines.base import Engine, EngineBlock, EngineError, EngineLine, EnginePage, TextSink
from ..errors import JobPageTimeout, NotReady, RequestTimeout
from ..metrics import Metrics
from ..schemas import Block, Cell, Line, OcrResponse, Page, Timings, Usage, Word
from .admission import Admission
from .formats.slots import Renders
from .health import HealthMonitor

# The cancel message when a request's client has gone: the label its killed decode worker is counted under.
CLIENT_GONE = "client_gone"


@dataclass(frozen=True)
class Job:
    """What the client asked of its document, besides the document itself."""

    content_type: str  # the header as sent (a multipart body's boundary is in it)
    selection: list[int] | None = None  # 1-based pages; None: every page
    preview: bool = False
    max_tokens: int | None = None  # vllm engine: per page


@dataclass
class Trace:
    """What the access log says of a request, filled in as far as the pipeline got."""

    bytes: int | None = None
    pages: int | None = None


class Pipeline:
    def __init__(self, settings: Settings, engine: Engine, metrics: Metrics):
        self.settings = settings = settings.for_engine(engine.name)
        assert settings.max_concurrency is not None
        self.engine = engine
        self.metrics = metrics
        assert settings.job_max_inflight is not None
        assert settings.job_max_interactive is not None
        self.admission = Admission(
            settings.max_concurrency,
            settings.max_queue,
            settings.drain_file,
            background_max=settings.job_max_inflight,
            background_max_interactive=settings.job_max_interactive,
            yield_s=settings.job_yield_s,
        )
        on_killed = lambda reason: metrics.decode_killed.labels(reason).inc()  # noqa: E731
        self.decode_pool = DecodePool.from_settings(settings, on_killed)
        # Bulk-job pages decode in workers of their own at nice 19: never ahead of a request's decode,
        # nor taking the CPU from engine threads at nice 19 on equal terms (those wait for each other).
        self.job_decode_pool = (
            DecodePool.from_settings(settings, on_killed, max(1, settings.preprocess_workers // 2), idle=True)
            if settings.job_pages_idle
            else None
        )
        self.health = HealthMonitor(settings, metrics, self.decode_pool, engine)
        self.renders = Renders(settings.render_workers, metrics.registry)
        metrics.track(
            lambda: self.admission.inflight,
            lambda: self.admission.queued,
            lambda: self.admission.background,
            lambda: engine.pages_done,
            engine_retries=lambda: engine.retries,
            engine_rotations=(lambda: engine.rotations or {}) if engine.rotations is not None else None,
            engine_collector=engine.metrics_collector(),
        )

    async def start(self) -> None:
        """The decode workers (seconds of interpreter start-up: off the event loop), then the engine."""
        await asyncio.to_thread(self.decode_pool.start)
        if self.job_decode_pool is not None:
            await asyncio.to_thread(self.job_decode_pool.start)
        await self.engine.load()
        await self.engine.self_test()

    async def close(self) -> None:
        await self.engine.close()
        self.decode_pool.close()
        if self.job_decode_pool is not None:
            self.job_decode_pool.close()

    async def run(
        self,
        read_body: Callable[[], Awaitable[bytes]],
        job: Job,
        request_id: str,
        trace: Trace | None = None,
        stream: TextSink | None = None,
    ) -> OcrResponse:
        """One document through admission, decode and the engine, within request_timeout_s.

        The body is read only once the request holds a slot: a queued client's upload waits in its socket.
        `stream`: given to the engine (Engine.recognize), for the pages' text as it is written.
        Raises Overloaded, NotReady (the engine died), RequestTimeout at the deadline, the decoder's."""
        trace = trace or Trace()
        started = time.perf_counter()
        timeout_s = self.settings.request_timeout_s
        deadline = time.monotonic() + timeout_s
        try:
            async with asyncio.timeout(timeout_s), self.admission.slot() as queued_s:
                t_pre = time.perf_counter()
                body = await read_body()
                trace.bytes = len(body)
                images = await self._decode(body, job, deadline, trace)
                del body
                pages, t_inf, t_done = await self._recognize(images, job, stream=stream)
        except TimeoutError:
            raise RequestTimeout(timeout_s) from None
        except EngineError:  # the engine died under this request; its on_fatal has been called
            raise NotReady("unhealthy") from None

        ms = 1000.0
        return OcrResponse(
            request_id=request_id,
            engine=self.engine.name,
            model=self.engine.model,
            pages=pages,
            timings_ms=Timings(
                queue=round(queued_s * ms, 2),
                preprocess=round((t_inf - t_pre) * ms, 2),
                inference=round((t_done - t_inf) * ms, 2),
                total=round((time.perf_counter() - started) * ms, 2),
            ),
        )

    async def run_background(self, body: bytes, job: Job) -> list[Page]:
        """A bulk job's pages (ocr_app/jobs/worker.py), read exactly as run() reads them, once
        Admission.background_may_start() said yes (never queued), within job_page_timeout_s (interactive
        work goes first at each step). Raises as run() does, JobPageTimeout at its deadline."""
        timeout_s = self.settings.job_page_timeout_s
        try:
            async with asyncio.timeout(timeout_s), self.admission.background_slot():
                deadline = time.monotonic() + timeout_s
                images = await self._decode(body, job, deadline, Trace(), self.job_decode_pool)
                pages, _, _ = await self._recognize(images, job, background=True)
        except TimeoutError:
            raise JobPageTimeout(timeout_s) from None
        except EngineError:
            raise NotReady("unhealthy") from None
        return pages

    async def _decode(
        self, body: bytes, job: Job, deadline: float, trace: Trace, pool: DecodePool | None = None
    ) -> list[PageImage]:
        # Multipart parsing included: a worker that passes the deadline is killed with its work.
        images = await (pool or self.decode_pool).decode(
            DecodeRequest(body, job.content_type, job.selection, job.preview), deadline
        )
        trace.pages = len(images)
        return images

    async def _recognize(
        self, images: list[PageImage], job: Job, background: bool = False, stream: TextSink | None = None
    ) -> tuple[list[Page], float, float]:
        """The engine on decoded pages -> the response's pages, with the times it started and finished."""
        t_inf = time.perf_counter()
        with self.health.engine_work():
            engine_pages = await self.engine.recognize(
                images, max_tokens=job.max_tokens, background=background, stream=stream
            )
        t_done = time.perf_counter()
        self.metrics.pages.inc(len(images))
        self.metrics.inference.observe(t_done - t_inf)
        return [_page(img, ep) for img, ep in zip(images, engine_pages, strict=True)], t_inf, t_done


def _page(img: PageImage, ep: EnginePage) -> Page:
    return Page(
        page=img.number,
        width=img.width,
        height=img.height,
        text=ep.joined_text(),
        rotation=ep.rotation,
        lines=[_line(ln) for ln in ep.lines],
        blocks=[_block(ep, b) for b in ep.blocks],
        warnings=ep.warnings,
        usage=None if ep.usage is None else Usage(prompt_tokens=ep.usage[0], completion_tokens=ep.usage[1]),
        preview=img.preview,
    )


def _line(ln: EngineLine) -> Line:
    words = None
    if ln.words is not None:
        words = [Word(text=w.text, bbox=w.bbox, confidence=w.confidence) for w in ln.words]
    return Line(text=ln.text, bbox=ln.bbox, confidence=ln.confidence, words=words)


def _block(ep: EnginePage, b: EngineBlock) -> Block:
    if b.table is None:
        return Block(type=b.type, bbox=b.bbox, lines=b.lines)
    cells = [
        Cell(
            row=c.row,
            column=c.column,
            row_span=c.row_span,
            column_span=c.column_span,
            text=ep.cell_text(c),
            bbox=c.bbox,
            lines=c.lines,
        )
        for c in b.table.cells
    ]
    return Block(
        type=b.type, bbox=b.bbox, lines=b.lines, rows=b.table.rows, columns=b.table.columns, cells=cells
    )
