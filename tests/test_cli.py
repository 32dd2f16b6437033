from __future__ import annotations

import json
import subprocess

from .server import OCR_APP


def run(*args, **kw):
    return subprocess.run([OCR_APP, *map(str, args)], capture_output=True, text=True, timeout=300, **kw)


def test_manifest_and_verify(tmp_path):
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text('{"a": 1}')
    (model / "sub" / "weights.bin").write_bytes(b"\x01" * 4096)
    r = run("manifest", model, "-o", tmp_path / "m.json")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "m.json").read_text())
    assert [f["path"] for f in manifest["files"]] == ["config.json", "sub/weights.bin"]
    assert manifest["files"][1]["size"] == 4096 and len(manifest["files"][1]["sha256"]) == 64
    assert run("verify", model, tmp_path / "m.json").returncode == 0

    (model / "sub" / "weights.bin").write_bytes(b"\x02" * 4096)  # same size, other bytes
    (model / "config.json").unlink()
    r = run("verify", model, tmp_path / "m.json")
    assert r.returncode == 1
    assert "config.json: missing" in r.stderr and "sub/weights.bin: sha256 mismatch" in r.stderr


def test_check_loads_engine_and_passes_self_test(tmp_path):
    cfg = tmp_path / "c.yml"
    cfg.write_text("auth_disabled: true\nrapidocr_workers: 1\n")
    r = run("check", "--config", cfg)
    assert r.returncode == 0, r.stderr
    assert "passed its self-test" in r.stdout


def test_check_fails_clearly_on_bad_keys_file(tmp_path):
    cfg = tmp_path / "c.yml"
    (tmp_path / "keys").write_text("not a key line\n")
    cfg.write_text(f"api_keys_file: {tmp_path / 'keys'}\n")
    r = run("check", "--config", cfg)
    assert r.returncode != 0 and "expected 'name:sha256hex'" in r.stderr


def test_ocr_client_prints_text_and_reports_errors(server, tmp_path):
    from .docs import encode, render

    doc = tmp_path / "doc.png"
    doc.write_bytes(encode(render(["Client side check 314"]).image, "PNG"))
    r = run("ocr", doc, "--url", server.url, "--key", server.key)
    assert r.returncode == 0 and "314" in r.stdout
    r = run("ocr", doc, "--url", server.url, "--json", env={"OCR_APP_KEY": server.key, "PATH": "/usr/bin"})
    assert json.loads(r.stdout)["pages"][0]["page"] == 1
    r = run("ocr", doc, "--url", server.url, "--key", "wrong")
    assert r.returncode == 1 and "unauthorized" in r.stderr


def test_verify_refuses_a_malformed_manifest(tmp_path):
    (tmp_path / "m.json").write_text("[]")
    r = run("verify", tmp_path, tmp_path / "m.json")
    assert r.returncode == 2
    assert "has no 'files' list" in r.stderr


def test_ocr_client_format_for_a_file_and_a_folder(server, tmp_path):
    """--format: the service's answer in that format, for a file (stdout or -o) and for each document of a
    folder into -o DIR (<path><extension>); what is not a document is skipped."""
    from .docs import encode, render

    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    one = encode(render(["Format check 271"]).image, "PNG")
    (folder / "one.png").write_bytes(one)
    (folder / "sub" / "two.png").write_bytes(encode(render(["Second 828"]).image, "PNG"))
    (folder / "notes.txt").write_text("not a document")
    key = ("--url", server.url, "--key", server.key)
    r = subprocess.run([OCR_APP, "ocr", folder / "one.png", "--format", "hocr", *key], capture_output=True)
    assert r.returncode == 0 and r.stdout == server.ocr(one, "image/png", params={"format": "hocr"}).content
    r = run("ocr", folder / "one.png", "--format", "pdf", "-o", tmp_path / "one.pdf", *key)
    assert r.returncode == 0 and (tmp_path / "one.pdf").read_bytes().startswith(b"%PDF-")
    r = run("ocr", folder, "--format", "markdown", "-o", tmp_path / "out", *key)
    assert r.returncode == 0, r.stderr
    written = sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*"))
    assert written == ["one.png.md", "sub", "sub/two.png.md"] and "skipped" in r.stderr
    assert "271" in (tmp_path / "out" / "one.png.md").read_text()
    r = run("ocr", folder, *key)  # a folder needs -o
    assert r.returncode == 2 and "-o DIR" in r.stderr
