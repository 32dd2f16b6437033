"""The tests' throw-away PostgreSQL cluster: `make demo-local`'s (scripts/pg_cluster.py), one owner."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "pg_cluster", Path(__file__).resolve().parents[1] / "scripts" / "pg_cluster.py"
)
assert _spec is not None and _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
Cluster = _module.Cluster
