"""A finished job's result in a format other than JSON (format=, or Accept), read from the job store as it is
written out: the pages a batch at a time (a server-side cursor: store.stream_pages), never all of them in
memory. The text formats (text, markdown, hocr, alto) are the same writers as /v1/ocr's
(ocr_app/ocr/formats/parts.py): the head, a part per page read, the tail. A failed page has no part.

pdf needs the document: it is copied from the store to a temporary file in chunks, opened from there, given
each read page's layer a batch at a time, saved to a second temporary file, and that file is streamed back
and deleted (memory bounded, the disk used instead: about twice the document, in the server's temporary
directory, while the request lasts). A failed page stays in the PDF without text."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.concurrency import run_in_threadpool

from ..errors import DocumentGone
from ..ocr.formats import Format
from ..ocr.formats.pdf import FileDocument
from ..ocr.formats.slots import Renders
from ..schemas import Page
from .store import JobStore

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


async def build_pdf(
    store: JobStore, renders: Renders, job_id: uuid.UUID, numbers: list[int], batch: int = BATCH
) -> Path:
    """The job's PDF, in a temporary directory of its own (the caller streams and deletes it: stream_file).
    `numbers`: the job's pages; each is in the PDF, with a layer where it was read. Its CPU work (opening the
    document, each batch's layers, the save) takes the instance's render slots one step at a time."""
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
        doc = await renders.run("pdf", FileDocument, source, content_type, numbers)
        try:
            pages: list[Page] = []
            async for row in store.stream_pages(job_id, batch):
                if row.result is not None:
                    pages.append(Page.model_validate_json(row.result))
                if len(pages) >= batch:
                    await renders.run("pdf", doc.add, pages)
                    pages = []
            if pages:
                await renders.run("pdf", doc.add, pages)
            out = tmp / "result.pdf"
            await renders.run("pdf", doc.save, out)
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
