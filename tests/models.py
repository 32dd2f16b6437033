"""rapidocr model revisions for tests: the wheel's own (`ocr-app rapidocr-models`) and a broken copy of it."""

from __future__ import annotations

import codecs
import shutil
import subprocess
from pathlib import Path

from .server import OCR_APP


def wheel_revision(out: Path, manifest: Path | None = None) -> Path:
    """`ocr-app rapidocr-models out [-m manifest]`: the installed wheel's models as a revision."""
    cmd = [OCR_APP, "rapidocr-models", str(out)] + (["--manifest", str(manifest)] if manifest else [])
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def misreading_revision(good: Path, out: Path, manifest: Path | None = None, letters: str = "") -> Path:
    """A copy of `good` whose dictionary reads letters as others. It loads, reads digits (the self-test
    passes) and its manifest matches. Without `letters`, every letter comes back as another one (ROT13);
    with them, only those, each as the next of them: a revision that still reads a page without them (the
    golden document, if they are capitals it lacks) but reads other pages worse."""
    shutil.copytree(good, out)
    keys = out / "rec_keys.txt"
    lines = keys.read_text(encoding="utf-8").split("\n")
    if letters:
        table = str.maketrans(letters, letters[1:] + letters[0])
        misread = [c.translate(table) for c in lines]
    else:
        misread = [codecs.encode(c, "rot13") if c.isascii() else c for c in lines]
    keys.write_text("\n".join(misread), encoding="utf-8")
    if manifest:
        subprocess.run([OCR_APP, "manifest", str(out), "-o", str(manifest)], check=True)
    return out
