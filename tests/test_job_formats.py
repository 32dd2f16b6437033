"""A bulk job's result in every format (GET /v1/jobs/{id}/result?format=...): one small job on the real
rapidocr engine and a real PostgreSQL, fetched in each format and read back by tools no one here wrote, as
tests/test_formats.py and tests/test_pdf_format.py read /v1/ocr's: hocr-spec, alto-tools, poppler's
pdftotext (jiwer's CER), qpdf --check, pikepdf. Each format equals /v1/ocr's for the same pages. Page 3 of
the document cannot be read (over the PDF page-size bound): it has no part in the text formats, stays in the
PDF without text, and is listed in OCR-Failed-Pages."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import jiwer
import pikepdf
import pypdfium2 as pdfium
import pytest
from hocr_spec import HocrValidator
from lxml import etree
from prometheus_client import CollectorRegistry

from ocr_app.errors import JobResultTimeout
from ocr_app.jobs import results
from ocr_app.jobs.store import PageRow
from ocr_app.ocr import formats
from ocr_app.ocr.formats.slots import Renders
from ocr_app.schemas import OcrResponse, Page

from .docs import TEXTS, encode, pdf, render
from .server import Server
from .test_errors import assert_error
from .test_formats import ALTO_NS, ALTO_TOOLS, FORMAT_NAMES
from .test_jobs import make_server, submit_ok, wait_status
from .test_pdf_format import multipart, pdftotext, qpdf_check

PDF = "application/pdf"
TEXT_FORMATS = ("text", "markdown", "hocr", "alto")
READ = [1, 2, 4]  # the pages that can be read; 3 cannot
# Asked of /v1/ocr over HTTP (each is an OCR of the pages: the test's time); /v1/ocr's text, markdown and
# alto are rendered here from its JSON answer by the code /v1/ocr renders them with (formats.render).
ASKED = ("json", "hocr", "pdf")


def document() -> bytes:
    """Four pages, the third over the PDF page-size bound (/v1/ocr refuses it: invalid_image)."""
    images = [render([f"Page {n}", TEXTS["en"][i]], size=28, width=700).image for i, n in enumerate(READ)]
    wide = pdfium.PdfDocument.new()
    wide.new_page(15_000, 800)  # over MAX_PDF_PAGE_PT
    buf = io.BytesIO()
    wide.save(buf)
    with pikepdf.open(io.BytesIO(pdf(images))) as doc, pikepdf.open(buf) as blank:
        doc.pages.insert(2, blank.pages[0])
        out = io.BytesIO()
        doc.save(out)
        return out.getvalue()


@pytest.fixture(scope="module")
def srv(tmp_path_factory, postgres):
    s = make_server(
        Server,
        tmp_path_factory,
        postgres,
        "job_formats",
        engine="rapidocr",
        rapidocr_workers=2,
        max_concurrency=2,
        job_range_pages=2,
        max_job_pages=8,
    )
    s.start()
    yield s
    assert s.stop() == 0, s.logs()[-2000:]


@pytest.fixture(scope="module")
def job(srv) -> dict:
    """The job, finished, and its result in every format; /v1/ocr's answers for its read pages."""
    data = document()
    with srv.client() as c:
        job_id = submit_ok(c, data).json()["job_id"]
        ask = {n: (lambda n=n: srv.ocr(data, PDF, params={"format": n, "pages": "1-2,4"})) for n in ASKED}
        with ThreadPoolExecutor(2) as pool:  # the server reads two at a time
            ocr = {n: pool.submit(f) for n, f in ask.items()}
            status = wait_status(c, job_id, lambda s: s["status"] not in ("queued", "running"))
            out = {
                "id": job_id,
                "status": status,
                "data": data,
                "ocr": {n: f.result() for n, f in ocr.items()},
            }
        for n in FORMAT_NAMES.split(", "):
            out[n] = c.get(f"/v1/jobs/{job_id}/result", params={"format": n})
    for r in [*out["ocr"].values(), *(out[n] for n in FORMAT_NAMES.split(", "))]:
        assert r.status_code == 200, r.text
    return out


def test_the_job_is_done_with_page_3_failed(job):
    assert job["status"]["status"] == "done"
    assert job["status"]["pages"] == {"total": 4, "done": 3, "failed": 1}
    body = job["json"].json()
    assert [p["page"] for p in body["pages"]] == READ and [e["page"] for e in body["errors"]] == [3]
    assert job["json"].headers["content-type"] == "application/json"
    for name in FORMAT_NAMES.split(", "):
        assert job[name].headers["ocr-failed-pages"] == "3", name
        assert job[name].headers["vary"] == "Accept", name


def test_each_format_equals_v1_ocrs_for_the_same_pages(job, tmp_path):
    """The pages' JSON is /v1/ocr's; the text formats are byte for byte /v1/ocr's (the same engine and
    model, the same pages: hOCR asked of /v1/ocr, the others rendered from its JSON as /v1/ocr renders
    them). The PDFs differ by the failed page (in the job's, without text) and are not byte for byte the
    same (the layer's font carries its creation time): their pages' text is compared."""
    mine, theirs = job["json"].json(), job["ocr"]["json"].json()
    assert mine["pages"] == theirs["pages"]
    answer = OcrResponse.model_validate(theirs)
    for name in TEXT_FORMATS:
        fmt = formats.FORMATS[name]
        if name in ASKED:
            assert job[name].headers["content-type"] == job["ocr"][name].headers["content-type"], name
            assert job[name].content == job["ocr"][name].content, name
        else:
            assert job[name].headers["content-type"] == fmt.content_type(fmt.media_type), name
            assert job[name].content == formats.render(fmt, answer), name
    assert job["pdf"].headers["content-type"] == PDF
    job_pages = pdftotext(job["pdf"].content, tmp_path)
    assert job_pages[:2] + job_pages[3:] == pdftotext(job["ocr"]["pdf"].content, tmp_path)


def test_text_is_the_json_pages_text(job):
    pages = job["json"].json()["pages"]
    assert job["text"].headers["content-type"] == "text/plain; charset=utf-8"
    assert job["text"].text == "\f".join(p["text"] for p in pages)
    assert all(p["text"].strip() for p in pages)


def test_markdown_numbers_titles_across_pages():
    """The first title of the document is `#`, the later ones `##`, on whichever page (the writer carries
    the count from part to part)."""
    from ocr_app.schemas import Block, Line

    def titled(n: int) -> Page:
        return Page(
            page=n,
            width=100,
            height=100,
            text=f"T{n}",
            lines=[Line(text=f"T{n}", bbox=(0.1, 0.1, 0.5, 0.2), confidence=1.0)],
            blocks=[Block(type="title", lines=[0], bbox=(0.1, 0.1, 0.5, 0.2))],
        )

    w = formats.FORMATS["markdown"].writer("rapidocr", "m", 2)
    parts = [w.head(), w.page(titled(1)), w.page(titled(2)), w.tail()]
    assert b"".join(parts).decode() == "# T1\n\n---\n\n## T2"


def test_hocr_validates_with_a_page_per_read_page(job, tmp_path):
    path = tmp_path / "job.hocr"
    path.write_bytes(job["hocr"].content)
    report = HocrValidator("standard").validate(str(path))
    assert report.is_valid(), report.format("text")
    root = etree.fromstring(job["hocr"].content)
    ns = {"h": "http://www.w3.org/1999/xhtml"}
    assert root.xpath("//h:meta[@name='ocr-number-of-pages']/@content", namespaces=ns) == ["3"]
    assert root.xpath("//h:div[@class='ocr_page']/@id", namespaces=ns) == [f"page_{n}" for n in READ]


def test_alto_reads_back_with_the_jsons_words(job, tmp_path):
    body = job["json"].json()
    path = tmp_path / "job.xml"
    path.write_bytes(job["alto"].content)
    text = subprocess.run([ALTO_TOOLS, str(path), "-t"], capture_output=True, text=True, check=True).stdout
    lines = [ln for page in body["pages"] for ln in page["lines"] if ln["text"].strip()]
    # The engine's located words where the JSON has them, else the line's text split on blanks.
    words = [[w["text"] for w in ln["words"]] if "words" in ln else ln["text"].split() for ln in lines]
    assert [ln.split() for ln in text.split("\n")[1:]] == words
    pages = etree.fromstring(job["alto"].content).findall("a:Layout/a:Page", ALTO_NS)
    assert [int(p.get("PHYSICAL_IMG_NR")) for p in pages] == READ


def test_pdf_has_every_page_and_the_read_pages_text(job, tmp_path):
    out = job["pdf"].content
    qpdf_check(out, tmp_path)
    with pikepdf.open(io.BytesIO(out)) as doc, pikepdf.open(io.BytesIO(job["data"])) as original:
        assert len(doc.pages) == len(original.pages) == 4
        assert float(doc.pages[2].mediabox[2]) == 15_000  # the failed page, kept
    got = pdftotext(out, tmp_path, "-raw")
    assert got[2] == ""  # the failed page: no text
    expected = [" ".join(p["text"].split()) for p in job["json"].json()["pages"]]
    assert jiwer.cer(" ".join(expected), " ".join(got[:2] + got[3:])) <= 0.005
    assert int(job["pdf"].headers["content-length"]) == len(out)


def test_format_errors_and_ndjson(srv, job):
    with srv.client() as c:
        url = f"/v1/jobs/{job['id']}/result"
        err = assert_error(c.get(url, params={"format": "docx"}), 422, "invalid_parameter")
        assert FORMAT_NAMES in err["message"]
        assert_error(c.get(url, headers={"Accept": "image/png"}), 406, "not_acceptable")
        # Checked before the job: an unknown format on an unknown job is the format's error.
        assert_error(
            c.get(f"/v1/jobs/{uuid.uuid4()}/result", params={"format": "docx"}), 422, "invalid_parameter"
        )
        assert_error(c.get(f"/v1/jobs/{uuid.uuid4()}/result", params={"format": "pdf"}), 404, "not_found")
        r = c.get(url, headers={"Accept": "application/x-ndjson"})
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
        lines = [json.loads(line) for line in r.text.splitlines()]
        assert [line["page"] for line in lines] == [1, 2, 3, 4] and "error" in lines[2]
        # Accept chooses as on /v1/ocr; format= wins over Accept.
        r = c.get(url, headers={"Accept": "text/markdown"})
        assert (
            r.headers["content-type"] == "text/markdown; charset=utf-8"
            and r.content == job["markdown"].content
        )
        r = c.get(url, params={"format": "json"}, headers={"Accept": "application/x-ndjson"})
        assert r.headers["content-type"] == "application/json" and r.json() == job["json"].json()


def test_a_cancelled_jobs_pdf_is_gone_its_text_is_not(srv):
    """A cancel deletes the document at once: format=pdf is 410 document_gone; the text formats still
    answer from the pages read."""
    data = document()
    with srv.client() as c:
        job_id = submit_ok(c, data).json()["job_id"]
        assert c.delete(f"/v1/jobs/{job_id}").status_code == 200
        wait_status(c, job_id, lambda s: s["status"] == "cancelled")
        assert_error(c.get(f"/v1/jobs/{job_id}/result", params={"format": "pdf"}), 410, "document_gone")
        assert c.get(f"/v1/jobs/{job_id}/result", params={"format": "text"}).status_code == 200


# --- streamed in bounded memory (in-process, a store that counts what it hands out) --------------------


class CountingStore:
    """The job store's reads that results.py makes, over pages in memory; counts the pages handed out and
    the batch sizes asked for."""

    def __init__(self, rows: list[PageRow], body: bytes = b"", content_type: str = PDF):
        self.rows, self.body, self.content_type = rows, body, content_type
        self.handed = 0
        self.batches: list[int] = []
        self.chunks = 0

    async def bounded(self, work):
        return await work

    async def stream_pages(self, job_id, batch=32):
        self.batches.append(batch)
        for row in self.rows:
            self.handed += 1
            yield row

    async def document_info(self, job_id):
        return self.content_type, len(self.body)

    async def document_chunks(self, job_id, length, chunk):
        for i in range(0, length, chunk):
            self.chunks += 1
            yield self.body[i : i + chunk]


def rows_of(pages: list[dict], failed: list[int]) -> list[PageRow]:
    rows = [PageRow(p["page"], json.dumps(p), None) for p in pages]
    rows += [PageRow(n, None, {"code": "invalid_image", "message": "x"}) for n in failed]
    return sorted(rows, key=lambda r: r.page)


def test_text_formats_are_written_as_the_pages_are_read(job):
    """The head and the first page's part are out before the second page is read from the store; the whole
    equals the job's answer over HTTP."""
    body = job["json"].json()
    ocr = job["ocr"]["json"].json()
    for name in TEXT_FORMATS:
        store = CountingStore(rows_of(body["pages"], [3]))
        fmt = formats.FORMATS[name]

        async def read(store=store, fmt=fmt):
            stream = results.text_format(store, uuid.uuid4(), fmt, ocr["engine"], ocr["model"], 3, batch=2)
            parts = [await anext(stream)]  # the head
            parts.append(await anext(stream))  # page 1
            assert store.handed == 1, "read ahead of what is written"
            return b"".join(parts + [p async for p in stream])

        assert asyncio.run(read()) == job[name].content, name
        assert store.batches == [2]


def test_a_jobs_pdf_is_built_a_batch_of_pages_at_a_time(job, tmp_path, monkeypatch):
    """More pages than a batch, the document copied in many chunks: the same text in the same pages, and
    no call to the PDF builder holds more than a batch of pages."""
    sizes: list[int] = []
    add = results.FileDocument.add
    monkeypatch.setattr(
        results.FileDocument, "add", lambda self, pages: (sizes.append(len(pages)), add(self, pages))
    )
    monkeypatch.setattr(results, "CHUNK", 4096)
    store = CountingStore(rows_of(job["json"].json()["pages"], [3]), job["data"])

    async def build() -> bytes:
        path = await results.build_pdf(store, renders, uuid.uuid4(), [1, 2, 3, 4], batch=2)
        out = b"".join([c async for c in results.stream_file(path)])
        assert not path.parent.exists()  # deleted once sent
        return out

    renders = Renders(1, registry := CollectorRegistry())
    out = asyncio.run(build())
    # Each step of CPU work took a render slot: the document opened, each batch's layers, the save.
    assert registry.get_sample_value("ocr_render_seconds_count", {"format": "pdf"}) == 1 + 2 + 1
    assert sizes == [2, 1] and store.chunks == -(-len(job["data"]) // 4096) > 1
    assert pdftotext(out, tmp_path, "-raw") == pdftotext(job["pdf"].content, tmp_path, "-raw")


def test_a_job_sent_as_multipart_gets_its_file_as_the_pdf(job, tmp_path):
    """A job's document stored as the multipart body it came in (an image here, which no reader finds
    inside the form's framing): the PDF is of the file inside, with the page's text."""
    page = job["json"].json()["pages"][0]
    image = encode(render(["Page 1", TEXTS["en"][0]], size=28, width=700).image, "PNG")
    body, content_type = multipart(image, "image/png")
    store = CountingStore([PageRow(1, json.dumps(page), None)], body, content_type)

    async def build() -> bytes:
        path = await results.build_pdf(store, Renders(1, None), uuid.uuid4(), [1])
        return b"".join([c async for c in results.stream_file(path)])

    out = asyncio.run(build())
    qpdf_check(out, tmp_path)
    assert pdftotext(out, tmp_path, "-raw") == [" ".join(page["text"].split())]


# --- built within job_result_timeout_s (results.pdf_within) ----------------------------------------------


class HeldStep:
    """One of FileDocument's steps (`name`: add or save) held in its thread until released; counts the
    steps run and notes, at each close, whether the held step had returned."""

    def __init__(self, monkeypatch, name: str) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.steps: list[str] = []
        self.closed: list[bool] = []
        for step in ("add", "save", "close"):
            real = getattr(results.FileDocument, step)
            monkeypatch.setattr(results.FileDocument, step, self._wrap(step, real, held=step == name))

    def _wrap(self, step, real, held):
        def run(doc, *args):
            self.steps.append(step)
            if step == "close":
                self.closed.append(self.release.is_set())
            if held:
                self.entered.set()
                self.release.wait(30)
            return real(doc, *args)

        return run


async def _until_gone(tmp_path) -> None:
    """The build ends on its own time once released; its directory goes with it (30 s bound)."""
    deadline = time.monotonic() + 30
    while any(tmp_path.glob("ocr-job-pdf-*")):
        assert time.monotonic() < deadline, "the build's directory was left behind"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("held", ["add", "save"])
def test_a_pdf_whose_caller_gives_up_is_not_closed_under_its_render(job, tmp_path, monkeypatch, held):
    """The request is cancelled while a render thread is in the document (a batch's layers, or the save):
    the caller goes at once; the document is closed only after the thread returns, no step starts after,
    and nothing is left on disk (what the save wrote is deleted too)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    hold = HeldStep(monkeypatch, held)
    store = CountingStore(rows_of(job["json"].json()["pages"], [3]), job["data"])

    async def main() -> None:
        renders = Renders(1, None)
        request = asyncio.create_task(results.pdf_within(store, renders, uuid.uuid4(), [1, 2, 3, 4], 60))
        await asyncio.to_thread(hold.entered.wait, 30)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        assert hold.closed == []  # not under the thread
        hold.release.set()
        await _until_gone(tmp_path)
        assert hold.closed == [True]
        assert hold.steps == ([held, "close"] if held == "add" else ["add", held, "close"])
        assert (renders.running, renders.waiting) == (0, 0)

    asyncio.run(main())


def test_a_pdf_not_built_in_time_is_a_timeout(job, tmp_path, monkeypatch):
    """Past job_result_timeout_s: JobResultTimeout (the route's 504) while the layers are still held; the
    build does not save, and leaves nothing on disk."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    hold = HeldStep(monkeypatch, "add")
    store = CountingStore(rows_of(job["json"].json()["pages"], [3]), job["data"])

    async def main() -> None:
        with pytest.raises(JobResultTimeout, match=r"within 0.2 s \(job_result_timeout_s\)"):
            await results.pdf_within(store, Renders(1, None), uuid.uuid4(), [1, 2, 3, 4], 0.2)
        hold.release.set()
        await _until_gone(tmp_path)
        assert "save" not in hold.steps and hold.steps[-1] == "close"

    asyncio.run(main())


def test_a_pdf_built_in_time_is_the_callers(job, tmp_path, monkeypatch):
    """Within the bound the path is the caller's, whole (nothing deletes it under the stream)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    store = CountingStore(rows_of(job["json"].json()["pages"], [3]), job["data"])

    async def main() -> bytes:
        path = await results.pdf_within(store, Renders(1, None), uuid.uuid4(), [1, 2, 3, 4], 60)
        await asyncio.sleep(0)  # callbacks of the build's end have run
        assert path.exists()
        return b"".join([c async for c in results.stream_file(path)])

    assert pdftotext(asyncio.run(main()), tmp_path, "-raw") == pdftotext(job["pdf"].content, tmp_path, "-raw")
