"""The tests' throw-away PostgreSQL cluster: `make demo-local`'s (scripts/pg_cluster.py), one owner."""

from __future__ import annotations

from scripts.pg_cluster import Cluster

__all__ = ["Cluster"]
