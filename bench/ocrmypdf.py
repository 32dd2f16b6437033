"""Measurement 10 (#42): pages per second of a searchable PDF made from a 20-page scanned PDF, the service
beside OCRmyPDF, on this machine's cores and the same pages.

- service: `POST /v1/ocr?format=pdf` of the whole document, one request (what `ocr-app ocr --format pdf`
  sends), to `ocr-app serve` in the shipped configuration (bench/run.py service_overrides).
- OCRmyPDF 17 + Tesseract: Debian's `tesseract` 5 (`-l eng`), `ocrmypdf -j <CPUs>`.
- OCRmyPDF 17 + `ocrmypdf-rapidocr` (PyPI, the same engine family, ONNX Runtime), where it is installed:
  it loads rapidocr's models by name and downloads what it lacks at run time, so its log is read for the
  model files it used and for any download; a run that fails (air-gapped, a model missing) is reported
  as such, with no figure.
- OCRmyPDF 17 + this package's plugin (ocr_app/fleet/ocrmypdf_plugin.py): the service as its engine.

Every OCRmyPDF run writes a plain PDF with no optimisation (`--output-type pdf --optimize 0`), what the
service's answer is: no PDF/A conversion, no image recompression, so the figures compare the reading and
the text layer, not OCRmyPDF's extras. Each output is read back with poppler's pdftotext against the text
the pages were rendered from (CER, whitespace runs made one space), and its pages counted.

The pages: US letter at 300 dpi (2550 x 3300), 34 lines of English prose (DejaVu Sans at 10 pt), each
degraded like a scan by the development set's `degrade` (bench/devset.py: skew, blur, noise, JPEG 75) and
embedded as a greyscale JPEG at 300 dpi by img2pdf (no re-encoding). Seeded: the same pages every run.
The sides run one after another, in reverse order every other round; the ratio is of medians.
"""

from __future__ import annotations

import importlib.util
import io
import os
import random
import re
import shutil
import statistics
import subprocess
import textwrap
from pathlib import Path

import httpx
import img2pdf
import jiwer
import pikepdf
from PIL import Image, ImageDraw

from bench.devset import degrade
from bench.harness import log, pc
from bench.servers import BIN, OurService, clean_env
from ocr_app.config import load_settings
from tests.docs import ARTICLE, LETTER, TEXTS, font_for

PAGES = 20
DPI = 300
SIZE = (int(8.5 * DPI), 11 * DPI)
FONT_PX = round(10 * DPI / 72)  # 10 pt
LINES_PER_PAGE = 34
OCRMYPDF = shutil.which("ocrmypdf", path=str(BIN)) or "ocrmypdf"
REQUEST_TIMEOUT_S = 1800.0
PLAIN = ["--output-type", "pdf", "--optimize", "0", "-l", "eng"]

_WORDS = sorted(
    {
        w.strip(".,:")
        for text in (
            TEXTS["en"],
            *ARTICLE["columns"],
            *LETTER["paragraphs"],
            [ARTICLE["title"], LETTER["header"]],
        )
        for line in text
        for w in line.split()
        if w.strip(".,:").isalpha()
    }
)


def page_text(n: int) -> list[str]:
    """Page n's lines: seeded sentences of the test documents' words, wrapped to the page, in paragraphs."""
    rnd = random.Random(f"ocrmypdf-bench-{n}")
    lines: list[str] = [f"Report {n + 1} of {PAGES}: harbour and ferry services"]
    while len(lines) < LINES_PER_PAGE:
        sentences = []
        for _ in range(rnd.randint(3, 5)):
            words = rnd.choices(_WORDS, k=rnd.randint(6, 14))
            sentences.append(" ".join(words).capitalize() + rnd.choice([".", ".", ",", ";"]))
        lines.append("")
        lines += textwrap.wrap(" ".join(sentences), 72)
    return lines[:LINES_PER_PAGE]


def scan_page(n: int) -> tuple[bytes, str]:
    """Page n as a scanner's greyscale JPEG, and its text (flat)."""
    lines = page_text(n)
    image = Image.new("L", SIZE, 255)
    draw = ImageDraw.Draw(image)
    font = font_for("en", FONT_PX)
    y = DPI  # an inch of margin
    for line in lines:
        draw.text((DPI, y), line, fill=0, font=font)
        y += FONT_PX * 3 // 2
    scanned = degrade(image, f"ocrmypdf-bench-{n}").convert("L")
    buf = io.BytesIO()
    scanned.save(buf, "JPEG", quality=75, dpi=(DPI, DPI))
    return buf.getvalue(), " ".join(" ".join(lines).split())


def scanned_pdf() -> tuple[bytes, str]:
    """The 20-page scan as a PDF (JPEGs as they are, at 300 dpi) and its text."""
    pages = [scan_page(n) for n in range(PAGES)]
    layout = img2pdf.get_fixed_dpi_layout_fun((DPI, DPI))
    return img2pdf.convert([data for data, _ in pages], layout_fun=layout), " ".join(t for _, t in pages)


def read_back(path: Path, truth: str) -> dict:
    """The output's pages and its text's CER against the pages' (pdftotext, whitespace runs as one space)."""
    text = subprocess.run(["pdftotext", str(path), "-"], capture_output=True, text=True, check=True).stdout
    with pikepdf.open(path) as pdf:
        pages = len(pdf.pages)
    return {"pages": pages, "cer": jiwer.cer(truth, " ".join(text.split())), "bytes": path.stat().st_size}


def run_ocrmypdf(
    args: list[str], src: Path, out: Path, env: dict[str, str] | None = None
) -> tuple[float, str]:
    """Seconds of one `ocrmypdf` run and its stderr; RuntimeError with its tail when it fails."""
    argv = [OCRMYPDF, "-j", str(os.cpu_count() or 1), *PLAIN, *args, str(src), str(out)]
    t0 = pc()
    r = subprocess.run(argv, capture_output=True, text=True, env=env or clean_env(), timeout=1800)
    seconds = pc() - t0
    if r.returncode != 0:
        tail = " | ".join(r.stderr.strip().splitlines()[-4:])
        raise RuntimeError(f"ocrmypdf exit {r.returncode}: {tail[-600:]}")
    return seconds, r.stderr


_MODEL = re.compile(r"Using (\S+\.onnx)")
_DOWNLOAD = re.compile(r"(?i)download(?:ing)? (?:from|to|model)|Downloading")


def rapidocr_models(stderr: str) -> dict:
    """What ocrmypdf-rapidocr's log says it loaded, and whether it downloaded anything."""
    models = sorted({Path(m).name for m in _MODEL.findall(stderr)})
    downloads = [line.strip() for line in stderr.splitlines() if _DOWNLOAD.search(line)]
    return {"models": models, "downloads": downloads[:3]}


def bench_ocrmypdf(workdir: Path, overrides: dict, rounds: int) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    log(f"measurement 10: rendering {PAGES} scanned pages at {DPI} dpi")
    document, truth = scanned_pdf()
    src = workdir / "scan.pdf"
    src.write_bytes(document)
    res: dict = {
        "pages": PAGES,
        "dpi": DPI,
        "document_bytes": len(document),
        "cpus": os.cpu_count(),
        "rounds": rounds,
        "sides": {},
        "notes": [],
    }
    tess = shutil.which("tesseract")
    if tess:
        v = subprocess.run([tess, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
        res["tesseract"] = v.strip()
    has_rapidocr_plugin = importlib.util.find_spec("ocrmypdf_rapidocr") is not None
    if not has_rapidocr_plugin:
        res["notes"].append("ocrmypdf-rapidocr is not installed (pip install -e '.[bench]'): no figure")

    # A 300 dpi scan of 20 pages is larger than the shipped max_upload_bytes (20 MiB), and one request of
    # 20 pages may outlast request_timeout_s on a busy machine: both raised, which changes no speed, and said.
    settings = load_settings(None, auth_disabled=True, **overrides)
    if len(document) > settings.max_upload_bytes:
        overrides = overrides | {"max_upload_bytes": len(document) + 2**20}
        res["notes"].append(
            f"max_upload_bytes raised to {overrides['max_upload_bytes']} for the {len(document)}-byte scan"
        )
    if settings.request_timeout_s < REQUEST_TIMEOUT_S:
        overrides = overrides | {"request_timeout_s": REQUEST_TIMEOUT_S}
        res["notes"].append(f"request_timeout_s raised to {REQUEST_TIMEOUT_S:g} for one 20-page request")
    svc = OurService(workdir / "service", overrides)
    log(f"starting ocr-app serve on :{svc.port}")
    svc.start()
    try:
        fleet_env = clean_env() | {"OCR_APP_URL": svc.process.url, "OCR_APP_KEY": svc.key}

        def service(out: Path) -> float:
            with httpx.Client(
                base_url=svc.process.url, headers={"Authorization": f"Bearer {svc.key}"}, timeout=1800
            ) as client:
                t0 = pc()
                r = client.post(
                    "/v1/ocr",
                    params={"format": "pdf"},
                    content=document,
                    headers={"Content-Type": "application/pdf"},
                )
                seconds = pc() - t0
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
            out.write_bytes(r.content)
            svc.process.check_alive()
            return seconds

        def tesseract(out: Path) -> float:
            return run_ocrmypdf([], src, out)[0]

        def rapidocr(out: Path) -> float:
            seconds, stderr = run_ocrmypdf(["--plugin", "ocrmypdf_rapidocr"], src, out)
            res["rapidocr_plugin"] = rapidocr_models(stderr)
            return seconds

        def fleet_plugin(out: Path) -> float:
            args = ["--plugin", "ocr_app.fleet.ocrmypdf_plugin"]
            return run_ocrmypdf(args, src, out, fleet_env)[0]

        sides = {"service": service, "ocrmypdf_tesseract": tesseract}
        if has_rapidocr_plugin:
            sides["ocrmypdf_rapidocr"] = rapidocr
        sides["ocrmypdf_fleet_plugin"] = fleet_plugin
        times: dict[str, list[float]] = {name: [] for name in sides}
        failed: dict[str, str] = {}
        for r in range(rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                if name in failed:
                    continue
                out = workdir / f"{name}-{r}.pdf"
                log(f"measurement 10: {name}, round {r + 1}")
                try:
                    times[name].append(sides[name](out))
                except Exception as err:  # a side that cannot run is reported, the others go on
                    failed[name] = f"{type(err).__name__}: {str(err)[:600]}"
                    continue
                res["sides"].setdefault(name, {}).update(read_back(out, truth))
        for name in sides:
            side = res["sides"].setdefault(name, {})
            if name in failed:
                side["error"] = failed[name]
            if times[name]:
                med = statistics.median(times[name])
                side |= {"seconds": [round(t, 2) for t in times[name]], "pages_per_s": PAGES / med}
    finally:
        svc.stop()

    def ratio(a: str, b: str) -> float | None:
        x, y = res["sides"].get(a, {}).get("pages_per_s"), res["sides"].get(b, {}).get("pages_per_s")
        return x / y if x and y else None

    res["ratio_service_vs_tesseract"] = ratio("service", "ocrmypdf_tesseract")
    res["ratio_service_vs_rapidocr"] = ratio("service", "ocrmypdf_rapidocr")
    res["ratio_fleet_plugin_vs_tesseract"] = ratio("ocrmypdf_fleet_plugin", "ocrmypdf_tesseract")
    return res
