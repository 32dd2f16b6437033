"""A finished job's result in a format other than JSON (format=, or Accept), read from the job store as it is
written out: the pages a batch at a time (a server-side cursor: store.stream_pages), never all of them in
memory. The text formats (text, markdown, hocr, alto) are the same writers as /v1/ocr's
(ocr_app/ocr/formats/parts.py): the head, a part per page read, the tail. A failed page has no part.

pdf needs the document: it is copied from the store to a temporary file in chunks, opened from there, given
each read page's layer a batch at a time, saved to a second temporary file, and that file is streamed back
and deleted (memory bounded, the disk used instead: about twice the document, in the server's temporary
directory, while the request lasts). A failed page stays in the PDF without text. It is built whole before
the first byte, within job_result_timeout_s (pdf_within); the proxies wait that long on this route only."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

from starlette.concurrency import run_in_threadpool

from ..errors import DocumentGone, JobResultTimeout
from ..ocr.formats import Format
from ..ocr.formats.pdf import FileDocument
from ..ocr.formats.slots import Renders
from ..schemas import Page
from .store import JobStore

T = TypeVar("T")

# Pages read from the store at once (and, for pdf, given their layers at once).
BATCH = 32
# The document is copied to the temporary file this many bytes at a time; the PDF streamed back so too.
CHUNK = 1 << 20


async def text_format(
    store: JobStore, job_id: uuid.UUID, fmt: Format, engine: str, model: str, count: int, batch: int = BATCH
) -> AsyncIterator[bytes]:
    """The job's read pages (`count` of them) as `fmt`, part by part."""
    assert fmt.writer is not None
    writer = fmt.writer(engine, model, count)
    yield writer.head()
    async for row in store.stream_pages(job_id, batch):
        if row.result is not None:
            yield writer.page(Page.model_validate_json(row.result))
    yield writer.tail()


class Abandoned(Exception):
    """pdf_within's caller has gone: the build stops before its next step."""


async def pdf_within(
    store: JobStore, renders: Renders, job_id: uuid.UUID, numbers: list[int], seconds: float
) -> Path:
    """build_pdf within `seconds` (job_result_timeout_s), else JobResultTimeout. The build runs as a task of
    its own that is never cancelled: a render thread cannot be stopped, and the document must not be closed
    under it. A caller that gives up (the deadline, or cancelled itself) tells the build to stop before its
    next step; whatever it leaves is deleted when it ends."""
    gone = asyncio.Event()
    build = asyncio.ensure_future(build_pdf(store, renders, job_id, numbers, stop=gone.is_set))
    try:
        return await asyncio.wait_for(asyncio.shield(build), seconds)
    except TimeoutError:
        raise JobResultTimeout(seconds) from None
    finally:
        if not build.done():
            gone.set()
            build.add_done_callback(_discard)


def _discard(build: asyncio.Future[Path]) -> None:
    """A build nobody waits for any more: its file, if it got that far, is deleted."""
    if build.cancelled() or build.exception() is not None:
        return  # build_pdf deleted its directory
    shutil.rmtree(build.result().parent, ignore_errors=True)


async def build_pdf(
    store: JobStore,
    renders: Renders,
    job_id: uuid.UUID,
    numbers: list[int],
    batch: int = BATCH,
    stop: Callable[[], bool] = lambda: False,
) -> Path:
    """The job's PDF, in a temporary directory of its own (the caller streams and deletes it: stream_file).
    `numbers`: the job's pages; each is in the PDF, with a layer where it was read. Its CPU work (opening the
    document, each batch's layers, the save) takes the instance's render slots one step at a time; when
    `stop()` says so, it raises Abandoned before the next one."""

    async def step(fn: Callable[..., T], *args: object) -> T:
        if stop():
            raise Abandoned()
        return await renders.run("pdf", fn, *args)

    tmp = Path(tempfile.mkdtemp(prefix="ocr-job-pdf-"))
    try:
        info = await store.bounded(store.document_info(job_id))
        if info is None:
            raise DocumentGone()
        content_type, length = info
        source = tmp / "document"
        with source.open("wb") as f:
            async for chunk in store.document_chunks(job_id, length, CHUNK):
                f.write(chunk)
        if source.stat().st_size != length:
            raise DocumentGone()  # purged while it was read
        doc = await step(FileDocument, source, content_type, numbers)
        try:
            pages: list[Page] = []
            async for row in store.stream_pages(job_id, batch):
                if row.result is not None:
                    pages.append(Page.model_validate_json(row.result))
                if len(pages) >= batch:
                    await step(doc.add, pages)
                    pages = []
            if pages:
                await step(doc.add, pages)
            out = tmp / "result.pdf"
            await step(doc.save, out)
        finally:
            doc.close()
        source.unlink()
        return out
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


async def stream_file(path: Path) -> AsyncIterator[bytes]:
    """The file, CHUNK bytes at a time; its directory is deleted at the end (or when the client goes)."""
    try:
        with path.open("rb") as f:
            while chunk := await run_in_threadpool(f.read, CHUNK):
                yield chunk
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)
