"""format=pdf on POST /v1/ocr: the searchable PDF, read back by tools no one here wrote: poppler's pdftotext
(the text layer, against the JSON's text by jiwer's CER), qpdf --check (the file's structure), pikepdf (pages,
/Rotate, the JPEG's stream, metadata and links)."""

from __future__ import annotations

import io
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jiwer
import pikepdf
import pytest

from ocr_app.errors import InvalidDocument
from ocr_app.ocr.formats import pdf as pdf_format
from ocr_app.schemas import Line, OcrResponse, Page, Timings

from .docs import TEXTS, encode, multipage_tiff, pdf, photo_like, render

PDF = "application/pdf"


def pdftotext(data: bytes, tmp_path: Path, *options: str) -> list[str]:
    """Each page's text as poppler extracts it (-raw: in the order the content shows it, duplicates kept,
    where the default orders it by position and drops text drawn twice in place), whitespace collapsed."""
    path = tmp_path / "answer.pdf"
    path.write_bytes(data)
    argv = ["pdftotext", *options, str(path), "-"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return [" ".join(page.split()) for page in out.split("\f")[: len(pikepdf.open(path).pages)]]


def qpdf_check(data: bytes, tmp_path: Path) -> None:
    path = tmp_path / "check.pdf"
    path.write_bytes(data)
    r = subprocess.run(["qpdf", "--check", str(path)], capture_output=True, text=True)
    assert r.returncode == 0 and "No syntax or stream encoding errors" in r.stdout, r.stdout + r.stderr


def json_texts(answer: dict) -> list[str]:
    return [" ".join(p["text"].split()) for p in answer["pages"]]


def ask(server, data: bytes, content_type: str, **params):
    r = server.ocr(data, content_type, params={"format": "pdf", **params})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == PDF
    return r.content


def json_and_pdf(server, data: bytes, content_type: str) -> tuple[dict, bytes]:
    """The document's JSON and its PDF, asked at once (the server reads two at a time)."""
    with ThreadPoolExecutor(2) as pool:
        answer = pool.submit(server.ocr, data, content_type)
        out = pool.submit(ask, server, data, content_type)
        r = answer.result()
        assert r.status_code == 200, r.text
        return r.json(), out.result()


@pytest.fixture(scope="module")
def scanned() -> bytes:
    """A two-page scan (no text in it, page 1 a noisy photo of a page) with a title in its document info and
    a link on page 1."""
    pages = [
        photo_like(render(TEXTS["en"][:3]).image),
        render(["Harbour Road 42", "Zażółć gęślą jaźń"]).image,
    ]
    with pikepdf.open(io.BytesIO(pdf(pages, dpi=200))) as doc:
        doc.docinfo["/Title"] = "Harbour report"
        link = pikepdf.Dictionary(
            Type=pikepdf.Name.Annot,
            Subtype=pikepdf.Name.Link,
            Rect=[10, 10, 100, 40],
            A=pikepdf.Dictionary(S=pikepdf.Name.URI, URI=pikepdf.String("https://example.org/harbour")),
        )
        doc.pages[0].obj.Annots = doc.make_indirect(pikepdf.Array([doc.make_indirect(link)]))
        out = io.BytesIO()
        doc.save(out)
        return out.getvalue()


@pytest.fixture(scope="module")
def scanned_answers(server, scanned) -> tuple[dict, bytes]:
    return json_and_pdf(server, scanned, PDF)


def test_scanned_pdf_gets_a_text_layer_with_the_jsons_text(scanned_answers, scanned, tmp_path):
    answer, out = scanned_answers
    qpdf_check(out, tmp_path)
    with pikepdf.open(io.BytesIO(out)) as doc:
        assert len(doc.pages) == 2
        # The pages kept: their title and link survive.
        assert str(doc.docinfo["/Title"]) == "Harbour report"
        (annot,) = doc.pages[0].obj.Annots
        assert str(annot.A.URI) == "https://example.org/harbour"
    # In reading order, as the layer draws it (-raw), and as poppler orders it on the page.
    for options in (("-raw",), ()):
        texts = pdftotext(out, tmp_path, *options)
        for got, want in zip(texts, json_texts(answer), strict=True):
            assert want, "the JSON read text"
            assert jiwer.cer(want, got) <= 0.005, (options, want, got)
    # The layer costs little: the scan's images are kept as they were, not re-encoded.
    assert len(out) <= 1.1 * len(scanned) + 64_000, (len(out), len(scanned))


def test_a_pdf_that_has_text_is_not_overlaid_again(server, scanned_answers, tmp_path):
    _, searchable = scanned_answers
    again = ask(server, searchable, PDF)
    qpdf_check(again, tmp_path)
    # -raw: poppler's default drops text drawn twice in place, and would hide a second layer.
    first, second = pdftotext(searchable, tmp_path, "-raw"), pdftotext(again, tmp_path, "-raw")
    assert second == first  # once: the page's own layer, not a second one over it
    assert second[0].count("Harbour") == first[0].count("Harbour") >= 1


def test_pages_selects_the_output_pages(server, scanned, scanned_answers, tmp_path):
    answer, _ = scanned_answers
    out = ask(server, scanned, PDF, pages="2")
    qpdf_check(out, tmp_path)
    with pikepdf.open(io.BytesIO(out)) as doc:
        assert len(doc.pages) == 1
        assert "/Annots" not in doc.pages[0].obj  # page 2, not page 1 (its link)
    (text,) = pdftotext(out, tmp_path)
    assert jiwer.cer(json_texts(answer)[1], text) <= 0.005, text


def test_jpeg_is_embedded_as_it_came_and_accept_chooses_pdf(server, tmp_path):
    jpeg = encode(render(TEXTS["en"][:2]).image, "JPEG", quality=85)
    r = server.ocr(jpeg, "image/jpeg", headers={"Accept": PDF})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == PDF
    qpdf_check(r.content, tmp_path)
    with pikepdf.open(io.BytesIO(r.content)) as doc:
        (page,) = doc.pages
        (image,) = page.get_images().values()
        assert image.Filter == pikepdf.Name.DCTDecode
        assert image.read_raw_bytes() == jpeg
    answer = server.ocr(jpeg, "image/jpeg").json()
    (text,) = pdftotext(r.content, tmp_path)
    assert jiwer.cer(json_texts(answer)[0], text) <= 0.005, text


def test_a_turned_page_comes_back_upright(server, tmp_path):
    doc = render(TEXTS["en"][:3])
    turned = doc.image.rotate(90, expand=True)  # counterclockwise: the engine turns it 90 clockwise
    png = encode(turned, "PNG")
    answer, out = json_and_pdf(server, png, "image/png")
    assert answer["pages"][0]["rotation"] == 90
    qpdf_check(out, tmp_path)
    with pikepdf.open(io.BytesIO(out)) as pdf_doc:
        page = pdf_doc.pages[0]
        assert int(page.obj.get("/Rotate", 0)) == 90
        # The page as shown (turned by /Rotate) is as wide and high as the upright page.
        w, h = float(page.mediabox[2]), float(page.mediabox[3])
        assert (h > w) == (doc.image.width > doc.image.height)
    (text,) = pdftotext(out, tmp_path)
    assert jiwer.cer(json_texts(answer)[0], text) <= 0.005, text
    # pdftotext reads the lines upright and in order, as the page was written.
    assert jiwer.cer(" ".join(" ".join(doc.lines).split()), text) <= 0.05, text


def test_a_document_that_cannot_be_read_is_a_json_error(server):
    r = server.ocr(b"%PDF-1.7 not really", PDF, params={"format": "pdf"})
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"]["code"] == "invalid_image"


def test_a_document_the_pdf_tools_refuse_is_invalid_not_a_crash():
    # The engine read it (PDFium is lenient); should qpdf refuse it, the answer is invalid_image (400).
    with pytest.raises(InvalidDocument, match="cannot make a PDF"):
        pdf_format.render(answer_for([(1, "x")]), pdf_format.Source(b"%PDF-1.7 not really", PDF))


# --- the renderer on hand-built answers (no engine): the inputs the app's tests above do not send ----------


DRAWN = render(["Harbour Road ferry", "second line here"], size=40, width=900)


def answer_for(pages: list[tuple[int, str]], drawn=DRAWN) -> OcrResponse:
    """An answer whose page `n` reads `text` where `drawn` drew its first line."""
    w, h = drawn.image.size
    x0, y0, x1, y1 = drawn.boxes[0]
    box = (x0 / w, y0 / h, x1 / w, y1 / h)
    return OcrResponse(
        request_id="r",
        engine="test",
        model="test",
        pages=[
            Page(page=n, width=w, height=h, text=text, lines=[Line(text=text, bbox=box, confidence=0.9)])
            for n, text in pages
        ],
        timings_ms=Timings(queue=0, preprocess=0, inference=0, total=0),
    )


def multipart(data: bytes, content_type: str) -> tuple[bytes, str]:
    disposition = 'Content-Disposition: form-data; name="file"; filename="x"'
    head = f"--b0undary\r\n{disposition}\r\nContent-Type: {content_type}"
    return (
        f"{head}\r\n\r\n".encode() + data + b"\r\n--b0undary--\r\n",
        "multipart/form-data; boundary=b0undary",
    )


@pytest.mark.parametrize("kind", ["webp", "bmp", "multipart"])
def test_other_images_are_embedded_losslessly(kind, tmp_path):
    image = DRAWN.image
    if kind == "multipart":
        body, content_type = multipart(encode(image, "PNG"), "image/png")
    else:
        body, content_type = encode(image, kind.upper(), **({"lossless": True} if kind == "webp" else {})), ""
    out = pdf_format.render(answer_for([(1, "Harbour Road ferry")]), pdf_format.Source(body, content_type))
    qpdf_check(out, tmp_path)
    with pikepdf.open(io.BytesIO(out)) as doc:
        (image_obj,) = doc.pages[0].get_images().values()
        assert pikepdf.PdfImage(image_obj).as_pil_image().convert("RGB").tobytes() == image.tobytes()
    assert pdftotext(out, tmp_path, "-raw") == ["Harbour Road ferry"]


def test_tiff_frames_selected_and_a_sane_page_size(tmp_path):
    frames = [render([f"frame {n}"]).image for n in ("one", "two", "three")]
    answer = answer_for([(2, "frame two"), (3, "frame three")], render(["frame two"]))
    out = pdf_format.render(answer, pdf_format.Source(multipage_tiff(frames), "image/tiff"))
    with pikepdf.open(io.BytesIO(out)) as doc:
        assert len(doc.pages) == 2
        for page, frame in zip(doc.pages, frames[1:], strict=True):  # frames 2 and 3, as they were
            (image_obj,) = page.get_images().values()
            assert pikepdf.PdfImage(image_obj).as_pil_image().convert("RGB").tobytes() == frame.tobytes()
        # Pillow's TIFF says 1 dpi: the page is the pixels at 96 dpi, not metres wide.
        assert float(doc.pages[0].mediabox[2]) == pytest.approx(frames[0].width * 72 / 96, abs=1)
    assert pdftotext(out, tmp_path, "-raw") == ["frame two", "frame three"]


def test_a_pdf_pages_own_rotate_is_kept_and_the_layer_follows(tmp_path):
    # Stored turned counterclockwise, shown upright by /Rotate 90: the engine saw it upright (rotation 0).
    with pikepdf.open(io.BytesIO(pdf([DRAWN.image.rotate(90, expand=True)]))) as doc:
        doc.pages[0].obj.Rotate = 90
        buf = io.BytesIO()
        doc.save(buf)
    out = pdf_format.render(answer_for([(1, "Harbour Road ferry")]), pdf_format.Source(buf.getvalue(), PDF))
    with pikepdf.open(io.BytesIO(out)) as doc:
        assert int(doc.pages[0].obj.Rotate) == 90
    assert pdftotext(out, tmp_path, "-raw") == ["Harbour Road ferry"]
    # Where the line was drawn, on the page as shown (pdftotext -bbox counts points of the shown page).
    path = tmp_path / "answer.pdf"
    words = subprocess.run(["pdftotext", "-bbox", str(path), "-"], capture_output=True, text=True).stdout
    x0 = float(re.search(r'xMin="([0-9.]+)"[^>]*>Harbour<', words).group(1))
    assert x0 == pytest.approx(DRAWN.boxes[0][0] * 72 / 150, abs=2)


def test_frames_img2pdf_refuses_go_through_png(tmp_path):
    # A multi-frame TIFF's frames go through Pillow's PNG, which has no CMYK: as RGB.
    image = DRAWN.image.convert("CMYK")
    pages = [(1, "Harbour Road ferry"), (2, "Harbour Road ferry")]
    out = pdf_format.render(
        answer_for(pages), pdf_format.Source(multipage_tiff([image, image]), "image/tiff")
    )
    qpdf_check(out, tmp_path)
    assert pdftotext(out, tmp_path, "-raw") == ["Harbour Road ferry"] * 2
