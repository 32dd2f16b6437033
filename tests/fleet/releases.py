"""New app versions for rollouts: a wheelhouse like `make wheelhouse`'s, with another version of the app.

The dependencies are the built wheelhouse's own wheels; only the app wheel is rebuilt, from a copy of the
sources with the version changed (and, for a deliberately bad release, the copy patched).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from wheelhouse_index import write_index  # noqa: E402


def _extras(wheelhouse: Path) -> str:
    m = re.search(r"^ocr-app\[([^\]]+)\]==", (wheelhouse / "requirements.txt").read_text(), re.M)
    return m.group(1) if m else ""


def derive_wheelhouse(
    base: Path, out: Path, version: str, patch: Callable[[Path], None] | None = None
) -> Path:
    """Write `out`: `base`'s dependency wheels plus ocr-app `version` built from (patched) sources."""
    work = out.parent / f".src-{version}"
    shutil.rmtree(work, ignore_errors=True)
    src = work / "src"
    src.mkdir(parents=True)
    for f in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / f, src / f)
    shutil.copytree(ROOT / "ocr_app", src / "ocr_app", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    pyproject = src / "pyproject.toml"
    text, n = re.subn(r'^version = "[^"]*"$', f'version = "{version}"', pyproject.read_text(), flags=re.M)
    assert n == 1, "pyproject.toml: no single `version = ...` line"
    pyproject.write_text(text)
    if patch:
        patch(src)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--wheel-dir", str(work / "dist"), str(src)],
        check=True,
    )  # fmt: skip
    [wheel] = (work / "dist").glob("ocr_app-*.whl")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for whl in base.glob("*.whl"):
        if not whl.name.startswith("ocr_app-"):
            shutil.copy2(whl, out / whl.name)
    shutil.copy2(wheel, out / wheel.name)
    write_index(out, _extras(base))
    shutil.rmtree(work)
    return out


def break_reading(src: Path) -> None:
    """A release that starts and passes its self-test (digits survive) but misreads every letter as 'x'."""
    base = src / "ocr_app" / "engines" / "base.py"
    base.write_text(
        base.read_text()
        + """

# --- deliberately broken release (tests/fleet) ---
import re as _re  # noqa: E402

_engine_line_init = EngineLine.__init__


def _misreading_init(self, *args, **kwargs):
    _engine_line_init(self, *args, **kwargs)
    self.text = _re.sub("[A-Za-z]", "x", self.text)


EngineLine.__init__ = _misreading_init
"""
    )
