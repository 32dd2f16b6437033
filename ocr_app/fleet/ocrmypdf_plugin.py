"""An OCRmyPDF 17 OCR-engine plugin: the fleet reads each page, OCRmyPDF does the rest.

    ocrmypdf --plugin ocr_app.fleet.ocrmypdf_plugin --ocr-app-url https://ocr.example.com in.pdf out.pdf

OCRmyPDF keeps its whole workflow (rasterising, `--pages`, `--output-type pdfa`, `--optimize`, `--sidecar`,
`--jobs`); where it would run Tesseract on a page image, this engine sends the image (OCRmyPDF's PNG) to
the fleet's `POST /v1/ocr?format=hocr` and hands OCRmyPDF the hOCR it answers, which OCRmyPDF's own
renderer (fpdf2, `--pdf-renderer auto`) turns into the invisible text layer.

Placement: the fleet's hOCR counts pixels of the image as sent (`ocr_page` `bbox 0 0 width height`).
OCRmyPDF's renderer divides them by the hOCR's `scan_res` (else the page's resolution as it found it) into
points of a text page, which it then scales onto the page whatever its size; the plugin adds `scan_res`,
the image's resolution scaled by the hOCR page's width over the image's (the same number unless the fleet
read the image at another size), as Tesseract's hOCR carries it, so that the text page is the page's size.

The fleet and its key: `--ocr-app-url` (env OCR_APP_URL, default http://127.0.0.1:8000), the key from env
OCR_APP_KEY (or `--ocr-app-key`, which other users of the machine can see in the process list),
`--ocr-app-ca-file` (env OCR_APP_CA_FILE) and `--ocr-app-insecure`: the names `ocr-app ocr` uses. Before any
page, one `GET /v1/models` checks that the fleet answers and takes the key; a page answered 502, 503 or
504 (an instance loading, draining or full; no instance behind the load balancer) or not answered at all
is sent again, after the answer's Retry-After or a doubling pause, `--ocr-app-retries` times (5); any other
error stops OCRmyPDF with the server's message and request id.

What Tesseract would do besides reading is not done: `--rotate-pages` and `--deskew` find nothing (the
fleet turns a page it finds on its side to read it, and places the words on the page as sent), and `-l` is
not checked or sent (the fleet's engine reads the scripts it reads). `--pdf-renderer sandwich` is refused.
OCRmyPDF 17 itself insists on the `tesseract` program at its start whatever the engine (its built-in
plugin checks it, `--ocr-engine none` too): install Debian's `tesseract-ocr` beside it.
"""

from __future__ import annotations

import argparse
import os
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Set
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ocrmypdf import hookimpl
from ocrmypdf.exceptions import BadArgsError, ExitCode, ExitCodeException
from ocrmypdf.pluginspec import OcrEngine, OrientationConfidence
from PIL import Image

from .. import __version__
from ..documents.upload import sniff
from .jobclient import RETRYABLE, retry_after_s, server_error

if TYPE_CHECKING:
    import httpx
    from ocrmypdf._options import OcrOptions

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_RETRIES = 5
MAX_WAIT_S = 30.0  # the longest pause between two tries, whatever Retry-After says
XHTML = "{http://www.w3.org/1999/xhtml}"
# The page's title as the fleet writes it (ocr_app/ocr/formats/hocr.py): `bbox 0 0 W H; ppageno N`.
_PAGE_TITLE = re.compile(r'(class="ocr_page"[^>]*?title="bbox 0 0 (\d+) (\d+)(?:; ppageno \d+)?)"')


class FleetError(ExitCodeException):
    """The fleet did not read a page: unreachable, an error answer, or busy through every retry."""

    exit_code = ExitCode.child_process_error


class FleetKeyError(BadArgsError):
    """The fleet refused the key (401) or its scope (403)."""


# --- options --------------------------------------------------------------------------------------------


@hookimpl
def add_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("ocrfleet", "The fleet as OCR engine (ocr_app.fleet.ocrmypdf_plugin)")
    group.add_argument(
        "--ocr-app-url",
        default=os.environ.get("OCR_APP_URL", DEFAULT_URL),
        help=f"the fleet's address (env OCR_APP_URL; default {DEFAULT_URL})",
    )
    group.add_argument("--ocr-app-key", help="API key (default: env OCR_APP_KEY)")
    group.add_argument(
        "--ocr-app-ca-file",
        default=os.environ.get("OCR_APP_CA_FILE"),
        help="CA bundle to verify the fleet's certificate (env OCR_APP_CA_FILE)",
    )
    group.add_argument("--ocr-app-insecure", action="store_true", help="do not verify TLS certificates")
    group.add_argument(
        "--ocr-app-timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds per request ({DEFAULT_TIMEOUT_S:g})",
    )
    group.add_argument(
        "--ocr-app-retries",
        type=int,
        default=DEFAULT_RETRIES,
        help=f"times a page is sent again after 502/503/504 or no answer ({DEFAULT_RETRIES})",
    )


def _opt(options: Any, name: str, default: Any) -> Any:
    """A plugin option; its default where OCRmyPDF was called through its API without it."""
    value = getattr(options, name, None)
    return default if value is None else value


def _client(options: Any) -> httpx.Client:
    import httpx

    key = _opt(options, "ocr_app_key", None) or os.environ.get("OCR_APP_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    ca_file = _opt(options, "ocr_app_ca_file", os.environ.get("OCR_APP_CA_FILE"))
    verify: bool | str = ca_file or not _opt(options, "ocr_app_insecure", False)
    return httpx.Client(
        base_url=_opt(options, "ocr_app_url", os.environ.get("OCR_APP_URL", DEFAULT_URL)),
        headers=headers,
        verify=verify,
        timeout=float(_opt(options, "ocr_app_timeout", DEFAULT_TIMEOUT_S)),
    )


def _selected(options: OcrOptions | None) -> bool:
    """This engine reads unless another was asked for (`--ocr-engine tesseract` or `none`)."""
    return options is None or getattr(options, "ocr_engine", "auto") == "auto"


@hookimpl
def check_options(options: OcrOptions) -> None:
    if not _selected(options):
        return
    if options.pdf_renderer == "sandwich":
        raise BadArgsError("the fleet's engine gives hOCR: use --pdf-renderer auto (fpdf2), not sandwich")
    if int(_opt(options, "ocr_app_retries", DEFAULT_RETRIES)) < 0:
        raise BadArgsError("--ocr-app-retries: 0 or more")
    if float(_opt(options, "ocr_app_timeout", DEFAULT_TIMEOUT_S)) <= 0:
        raise BadArgsError("--ocr-app-timeout: more than 0 seconds")
    import httpx

    with _client(options) as client:
        try:
            r = client.get("/v1/models")
        except httpx.TransportError as err:
            raise FleetError(f"cannot reach the fleet at {client.base_url}: {_why(err)}") from None
    _check(r)


@hookimpl
def get_ocr_engine(options: OcrOptions | None) -> OcrEngine | None:
    return FleetEngine() if _selected(options) else None


# --- one page -------------------------------------------------------------------------------------------


def _why(err: Exception) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def _check(r: httpx.Response) -> None:
    """Raise the server's error answer as the plugin's exception."""
    if r.status_code == 200:
        return
    err = server_error(r)
    if r.status_code in (401, 403):
        raise FleetKeyError(f"the fleet refused the key: {err}; set OCR_APP_KEY or --ocr-app-key")
    raise FleetError(f"the fleet answered {err}")


def read_page(
    client: httpx.Client,
    image: bytes,
    retries: int = DEFAULT_RETRIES,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """The fleet's hOCR of one page image: sent again after 502/503/504 or a transport failure, up to
    `retries` times, each pause the answer's Retry-After (at most MAX_WAIT_S) or else doubling from 0.5 s."""
    import httpx

    headers = {"Content-Type": sniff(image) or "application/octet-stream"}
    delay = 0.5
    for attempt in range(retries + 1):
        try:
            r = client.post("/v1/ocr", params={"format": "hocr"}, content=image, headers=headers)
        except httpx.TransportError as err:
            reason = f"no answer from {client.base_url} ({_why(err)})"
            wait = delay
        else:
            if r.status_code not in RETRYABLE:
                _check(r)
                return r.text
            reason = str(server_error(r))
            after = retry_after_s(r, MAX_WAIT_S)
            wait = delay if after is None else after
        if attempt == retries:
            break
        sleep(wait)
        delay = min(delay * 2, MAX_WAIT_S)
    raise FleetError(f"the fleet did not read the page after {retries + 1} tries: {reason}")


def place(hocr: str, image_size: tuple[int, int], dpi: float | None) -> str:
    """The hOCR with `scan_res` on its page: the image's resolution, scaled by the hOCR page's width over
    the image's, so that OCRmyPDF divides its boxes into points of the page. Without a resolution of the
    image the hOCR stays as it is (OCRmyPDF then takes the page's)."""
    m = _PAGE_TITLE.search(hocr)
    if m is None:
        raise FleetError("the fleet's hOCR has no ocr_page with a bbox")
    if not dpi:
        return hocr
    res = dpi * int(m.group(2)) / image_size[0]
    return f'{hocr[: m.end(1)]}; scan_res {res:.4f} {res:.4f}"{hocr[m.end() :]}'


def page_text(hocr: str) -> str:
    """The page's text for OCRmyPDF's --sidecar: a paragraph's lines a line each, paragraphs apart by a
    blank line (hOCR's reading order, the fleet's)."""
    root = ET.fromstring(hocr.encode("utf-8"))  # noqa: S314 (our fleet's answer, no entities)
    paragraphs = []
    for par in root.iter(f"{XHTML}p"):
        lines = ["".join(span.itertext()).strip() for span in par.findall(f"{XHTML}span")]
        if text := "\n".join(line for line in lines if line):
            paragraphs.append(text)
    return "\n\n".join(paragraphs) + "\n" if paragraphs else ""


class FleetEngine(OcrEngine):
    """OCRmyPDF's OCR engine with each page read by the fleet (module docstring)."""

    @staticmethod
    def version() -> str:
        return __version__

    @staticmethod
    def creator_tag(options: OcrOptions) -> str:
        return f"ocrfleet {__version__} (ocr_app.fleet.ocrmypdf_plugin)"

    def __str__(self) -> str:
        return f"ocrfleet {__version__}"

    @staticmethod
    def languages(options: OcrOptions) -> Set[str]:
        return set()  # none named: OCRmyPDF then checks no -l (the fleet is not told one)

    @staticmethod
    def get_orientation(input_file: Path, options: OcrOptions) -> OrientationConfidence:
        return OrientationConfidence(angle=0, confidence=0.0)

    @staticmethod
    def generate_hocr(input_file: Path, output_hocr: Path, output_text: Path, options: OcrOptions) -> None:
        image = Path(input_file).read_bytes()
        with Image.open(input_file) as im:
            size = im.size
            dpi = im.info.get("dpi")
        retries = int(_opt(options, "ocr_app_retries", DEFAULT_RETRIES))
        with _client(options) as client:
            hocr = read_page(client, image, retries)
        hocr = place(hocr, size, float(dpi[0]) if dpi else None)
        Path(output_hocr).write_text(hocr, encoding="utf-8")
        Path(output_text).write_text(page_text(hocr), encoding="utf-8")

    @staticmethod
    def generate_pdf(input_file: Path, output_pdf: Path, output_text: Path, options: OcrOptions) -> None:
        raise BadArgsError("the fleet's engine gives hOCR: use --pdf-renderer auto (fpdf2), not sandwich")


__all__ = ["FleetEngine", "FleetError", "FleetKeyError", "page_text", "place", "read_page"]
