"""The OCRmyPDF plugin (ocr_app/fleet/ocrmypdf_plugin.py): `ocrmypdf --plugin ...` with the session's server
as its engine, on a two-page scan rendered from known text. Read back by tools no one here wrote: poppler's
pdftotext (the text, by jiwer's CER; -bbox: where each word lies on its page), qpdf --check, pikepdf (the
page count). The retries and the error answers against httpx's mock transport."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx
import jiwer
import pikepdf
import pytest

from ocr_app.fleet import ocrmypdf_plugin as plugin

from .docs import pdf, photo_like, render
from .server import free_port

OCRMYPDF = shutil.which("ocrmypdf", path=str(Path(sys.executable).parent)) or "ocrmypdf"
PLUGIN = "ocr_app.fleet.ocrmypdf_plugin"
DPI = 200
PAGES = [
    ["Harbour Road 42 ferry timetable", "The morning boat leaves at seven", "Tickets are sold on board"],
    ["Northwind Traders annual report", "Sales rose in every region this year"],
]


def ocrmypdf(tmp_path: Path, *args: str, key: str | None, url: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OCR_APP_")}
    env |= {"OCR_APP_URL": url, **({"OCR_APP_KEY": key} if key else {})}
    argv = [OCRMYPDF, "--plugin", PLUGIN, *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240)


@pytest.fixture(scope="module")
def scan(tmp_path_factory) -> tuple[Path, list]:
    """Two scanned pages (page 1 a noisy photo-like JPEG) at 200 dpi, no text in the PDF."""
    rendered = [render(lines) for lines in PAGES]
    path = tmp_path_factory.mktemp("scan") / "scan.pdf"
    path.write_bytes(pdf([photo_like(rendered[0].image), rendered[1].image], dpi=DPI))
    return path, rendered


@pytest.fixture(scope="module")
def searchable(server, scan, tmp_path_factory) -> Path:
    path, _ = scan
    out = tmp_path_factory.mktemp("out") / "out.pdf"
    before = server.metrics().get("ocr_pages_total", 0)
    r = ocrmypdf(out.parent, "-j", "2", str(path), str(out), key=server.key, url=server.url)
    assert r.returncode == 0, r.stdout + r.stderr
    # The fleet read the pages, one request a page, not OCRmyPDF's own Tesseract.
    assert server.metrics()["ocr_pages_total"] - before == len(PAGES)
    with pikepdf.open(out) as doc:
        assert "ocrfleet" in str(doc.docinfo["/Creator"])
    return out


def test_ocrmypdf_with_the_fleet_gives_the_text_on_its_pages(searchable, scan):
    _, rendered = scan
    check = subprocess.run(["qpdf", "--check", str(searchable)], capture_output=True, text=True)
    assert check.returncode == 0 and "No syntax or stream encoding errors" in check.stdout, check.stdout
    with pikepdf.open(searchable) as doc:
        assert len(doc.pages) == len(PAGES)
    text = subprocess.run(["pdftotext", str(searchable), "-"], capture_output=True, text=True, check=True)
    for page, want in zip(text.stdout.split("\f"), PAGES, strict=False):
        assert jiwer.cer(" ".join(want), " ".join(page.split())) <= 0.02, (want, page)

    # Each word where its line was drawn: pdftotext -bbox gives points from the page's top left; the
    # rendered line boxes are pixels at DPI.
    xml = subprocess.run(
        ["pdftotext", "-bbox", str(searchable), "-"], capture_output=True, text=True, check=True
    ).stdout
    ns = {"x": "http://www.w3.org/1999/xhtml"}
    pages = ET.fromstring(xml).findall(".//x:page", ns)  # noqa: S314 (poppler's output)
    assert len(pages) == len(PAGES)
    slack = 6.0  # points: the engine's boxes hug the ink, Pillow's include the font's ascent
    for page, doc_page in zip(pages, rendered, strict=True):
        words = page.findall("x:word", ns)
        assert words, "the page has words"
        lines = [[v * 72 / DPI for v in box] for box in doc_page.boxes]
        for word in words:
            x0, y0, x1, y1 = (float(word.get(k)) for k in ("xMin", "yMin", "xMax", "yMax"))
            assert 0 <= x0 < x1 <= float(page.get("width")) and 0 <= y0 < y1 <= float(page.get("height"))
            owners = [i for i, line in enumerate(doc_page.lines) if word.text in line.split()]
            assert owners, f"{word.text!r} is none of the page's words"
            assert any(
                lines[i][0] - slack <= x0
                and x1 <= lines[i][2] + slack
                and lines[i][1] - slack <= y0
                and y1 <= lines[i][3] + slack
                for i in owners
            ), (word.text, (x0, y0, x1, y1), [lines[i] for i in owners])


def test_a_bad_key_and_an_unreachable_fleet_are_said_plainly(server, scan, tmp_path):
    path, _ = scan
    r = ocrmypdf(tmp_path, str(path), str(tmp_path / "out.pdf"), key="not-a-key", url=server.url)
    assert r.returncode != 0 and "the fleet refused the key" in r.stderr, r.stderr
    nowhere = f"http://127.0.0.1:{free_port()}"
    r = ocrmypdf(tmp_path, str(path), str(tmp_path / "out.pdf"), key=server.key, url=nowhere)
    assert r.returncode != 0 and f"cannot reach the fleet at {nowhere}" in r.stderr, r.stderr
    assert not (tmp_path / "out.pdf").exists()


def mock_fleet(answers: list[httpx.Response]) -> tuple[httpx.Client, list[httpx.Request]]:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return answers[len(sent) - 1]

    return httpx.Client(base_url="http://fleet", transport=httpx.MockTransport(handler)), sent


HOCR = '<div class="ocr_page" id="page_1" title="bbox 0 0 500 300; ppageno 0">'
BUSY = httpx.Response(
    503, headers={"Retry-After": "2"}, json={"error": {"code": "overloaded", "message": "full"}}
)


@pytest.mark.parametrize("busy", [0, 1, 3])
def test_busy_answers_are_tried_again_up_to_retries(busy):
    client, sent = mock_fleet([BUSY] * busy + [httpx.Response(200, text=HOCR)])
    slept: list[float] = []
    assert plugin.read_page(client, b"\x89PNG\r\n\x1a\n", retries=3, sleep=slept.append) == HOCR
    assert len(sent) == busy + 1 and slept == [2.0] * busy
    assert sent[0].url.params["format"] == "hocr" and sent[0].headers["content-type"] == "image/png"


def test_one_busy_answer_past_the_retries_is_an_error():
    client, sent = mock_fleet([BUSY] * 4 + [httpx.Response(200, text=HOCR)])
    with pytest.raises(plugin.FleetError, match="after 4 tries: HTTP 503 overloaded: full"):
        plugin.read_page(client, b"page", retries=3, sleep=lambda s: None)
    assert len(sent) == 4


def test_a_refused_key_is_not_tried_again():
    refused = httpx.Response(401, json={"error": {"code": "unauthorized", "message": "bad key"}})
    client, sent = mock_fleet([refused, httpx.Response(200, text=HOCR)])
    with pytest.raises(plugin.FleetKeyError, match="refused the key"):
        plugin.read_page(client, b"page", retries=3, sleep=lambda s: None)
    assert len(sent) == 1


def test_scan_res_places_the_boxes_at_the_images_resolution():
    # The fleet counted 500 px across an image 1000 px wide at 200 dpi: its pixels are 100 to the inch.
    placed = plugin.place(HOCR + "</div>", (1000, 600), 200.0)
    assert 'title="bbox 0 0 500 300; ppageno 0; scan_res 100.0000 100.0000"' in placed
    assert plugin.place(HOCR + "</div>", (1000, 600), None) == HOCR + "</div>"
