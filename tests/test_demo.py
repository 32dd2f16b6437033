"""`make demo-local` keeps working: the script it runs, end to end, stopping after the first OCR and job."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_demo_prints_ocr_text_url_and_key(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "demo_local.py"),
            "--once",
            "--port",
            "0",
            "--state",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "invoice No. 2048" in r.stdout
    assert "Ada Lovelace" in r.stdout
    assert "http://127.0.0.1:" in r.stdout
    assert "API key:   ocr_" in r.stdout
    # Bulk jobs on the demo's own throw-away cluster, removed when it stops.
    assert re.search(r"the same page as a bulk job: job [0-9a-f-]{36} done, 1 of 1 pages read", r.stdout), (
        r.stdout
    )
    assert not (tmp_path / "pg").exists()
