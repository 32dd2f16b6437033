"""A model directory's manifest: every file's path, size and sha256, as JSON (`{"files": [...]}`). The
ocr_model role stores one with each revision (`.manifest.json`); `ocr-app check` verifies the model against
it, `ocr-app manifest` writes one, `ocr-app verify` checks a directory against one."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from .config import ConfigError


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def build_manifest(root: Path) -> dict[str, Any]:
    files = []
    for p in sorted(q for q in root.rglob("*") if q.is_file() and not q.is_symlink()):
        files.append({"path": p.relative_to(root).as_posix(), "size": p.stat().st_size, "sha256": _sha256(p)})
    return {"files": files}


def verify_manifest(root: Path, manifest: dict[str, Any]) -> list[str]:
    """Problems found, one per file; empty when every listed file matches."""
    problems = []
    for entry in manifest["files"]:
        rel = entry["path"]
        p = root / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            problems.append(f"{rel}: path escapes the model directory")
        elif not p.is_file():
            problems.append(f"{rel}: missing")
        elif p.stat().st_size != entry["size"]:
            problems.append(f"{rel}: size {p.stat().st_size}, expected {entry['size']}")
        elif _sha256(p) != entry["sha256"]:
            problems.append(f"{rel}: sha256 mismatch")
    return problems


def read_manifest(path: Path | str) -> dict[str, Any]:
    try:
        manifest = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read manifest {path}: {err}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
        raise ConfigError(f"manifest {path} has no 'files' list")
    return manifest
