"""README.md's `openai` client code, run as it stands so that it cannot drift from what works: the block after
"Scripts written for LightOnOCR's own OpenAI-compatible server", its `https://LB_ADDRESS` replaced by the
address under test, in a directory laid out as `make demo` leaves it (`.demo/fleet/api-key`,
`.demo/fleet/ca/ca.crt`) with the page as `page.png`."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "Scripts written for LightOnOCR's own OpenAI-compatible server"
PLACEHOLDER = "https://LB_ADDRESS"


def chat_snippet() -> str:
    text = README.read_text(encoding="utf-8")
    block = re.search(r"```python\n(.*?)```", text[text.index(SECTION) :], re.DOTALL)
    assert block is not None, f"README.md: no python block after {SECTION!r}"
    code = block.group(1)
    assert PLACEHOLDER in code, f"README.md's snippet no longer names {PLACEHOLDER}"
    return code


def run_chat_snippet(url: str, key: str, ca_file: Path, png: bytes, workdir: Path) -> str:
    """What the snippet prints, run by this interpreter (its venv has `openai`) against `url`
    (scheme://host[:port], no path)."""
    fleet = workdir / ".demo" / "fleet"
    (fleet / "ca").mkdir(parents=True)
    (fleet / "api-key").write_text(key + "\n")
    shutil.copyfile(ca_file, fleet / "ca" / "ca.crt")
    (workdir / "page.png").write_bytes(png)
    code = chat_snippet().replace(PLACEHOLDER, url)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=workdir, capture_output=True, text=True, timeout=600, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout
