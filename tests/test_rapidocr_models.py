"""The CPU engine's models from a model revision directory (`model_path`), as the ocr_model role installs it.

A revision whose dictionary has its letters rotated reads rotated text: the files loaded are the revision's,
not the wheel's. A revision that is missing, incomplete, damaged or carries its dictionary inside its rec
model fails `ocr-app check` (and `serve`) naming the problem.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from .docs import encode, render
from .models import misreading_revision, wheel_revision
from .server import OCR_APP, Server

LINES = ["Invoice number 4711", "Delivered to Ada Lovelace"]


@pytest.fixture(scope="module")
def revisions(tmp_path_factory) -> Path:
    """<root>/pp-ocrv6-small/{good,rot13} with manifests, and `current` -> good (the ocr_model layout)."""
    root = tmp_path_factory.mktemp("models") / "pp-ocrv6-small"
    good = wheel_revision(root / "good", root / "good.json")
    (good / ".manifest.json").write_text((root / "good.json").read_text())
    misreading_revision(good, root / "rot13")
    (root / "current").symlink_to("good")
    return root


def flat(text: str) -> str:
    return "".join(text.split()).lower()


def read(srv: Server) -> tuple[str, str]:
    r = srv.ocr(encode(render(LINES, size=32, width=900).image, "PNG"), "image/png")
    assert r.status_code == 200, r.text
    return r.json()["model"], r.json()["pages"][0]["text"]


def check(tmp_path: Path, model_path: Path) -> subprocess.CompletedProcess:
    srv = Server(tmp_path / f"check-{model_path.name}", model_path=str(model_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OCR_APP_")}
    return subprocess.run(
        [OCR_APP, "check", "--config", str(srv.config_file)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_a_revision_behind_current_is_served_and_named(revisions, tmp_path):
    srv = Server(tmp_path / "srv", model_path=str(revisions / "current")).start()
    try:
        assert srv.health().json()["model"].startswith("pp-ocrv6-small@good (rapidocr ")
        model, text = read(srv)
        assert model.startswith("pp-ocrv6-small@good ")
        assert "invoicenumber4711" in flat(text) and "adalovelace" in flat(text), text
    finally:
        assert srv.stop() == 0, srv.logs()[-2000:]

    r = check(tmp_path, revisions / "current")
    assert r.returncode == 0, r.stderr
    assert f"matches {revisions / 'current' / '.manifest.json'}" in r.stdout
    files = r"cls.onnx, det.onnx, rec.onnx, rec_keys.txt \(\d+ dictionary entries\)"
    assert re.search(files, r.stdout), r.stdout


def test_the_revisions_dictionary_is_the_one_loaded(revisions, tmp_path):
    # Letters rotated, digits kept: the self-test (digits) passes, the text comes back rotated.
    srv = Server(tmp_path / "srv", model_path=str(revisions / "rot13")).start()
    try:
        model, text = read(srv)
        assert model.startswith("rot13 (rapidocr ")
        assert "4711" in flat(text), text
        assert "vaibvprahzore4711" in flat(text) and "nqnybirynpr" in flat(text), text
    finally:
        assert srv.stop() == 0, srv.logs()[-2000:]


def test_a_missing_or_incomplete_revision_fails_check_and_start(revisions, tmp_path):
    r = check(tmp_path, revisions / "absent")
    assert r.returncode == 1 and f"model_path {revisions / 'absent'} is not a directory" in r.stderr, r.stderr

    partial = tmp_path / "partial"
    partial.mkdir()
    for name in ("det.onnx", "rec.onnx"):
        (partial / name).write_bytes((revisions / "good" / name).read_bytes())
    r = check(tmp_path, partial)
    assert r.returncode == 1, r.stdout
    assert f"model_path {partial} lacks rec_keys.txt: a rapidocr model revision holds" in r.stderr, r.stderr

    srv = Server(tmp_path / "srv", model_path=str(partial)).start(wait_ready=False)
    assert srv.proc.wait(60) != 0
    assert f"model_path {partial} lacks rec_keys.txt" in srv.logs()


def test_a_damaged_revision_fails_check(revisions, tmp_path):
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for f in (revisions / "good").iterdir():
        (damaged / f.name).write_bytes(f.read_bytes())
    det = bytearray((damaged / "det.onnx").read_bytes())
    det[len(det) // 2] ^= 0xFF
    (damaged / "det.onnx").write_bytes(bytes(det))
    r = check(tmp_path, damaged)
    assert r.returncode == 1, r.stdout
    assert f"model files do not match {damaged / '.manifest.json'}: det.onnx: sha256 mismatch" in r.stderr


def test_a_rec_model_carrying_its_own_dictionary_is_refused(revisions, tmp_path):
    # The wheel's rec model as is: rapidocr would read its embedded dictionary and ignore rec_keys.txt.
    import rapidocr

    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for f in (revisions / "good").iterdir():
        if not f.name.startswith("."):
            (mixed / f.name).write_bytes(f.read_bytes())
    wheel_rec = Path(rapidocr.__file__).parent / "models" / "PP-OCRv6_rec_small.onnx"
    (mixed / "rec.onnx").write_bytes(wheel_rec.read_bytes())
    r = check(tmp_path, mixed)
    assert r.returncode == 1, r.stdout
    assert f"{mixed / 'rec.onnx'} carries its own dictionary (ONNX metadata 'character')" in r.stderr, (
        r.stderr
    )
