"""The tests' throw-away PostgreSQL cluster: `make demo-local`'s (scripts/pg_cluster.py), one owner; and a way
to make it stop answering without going away (its processes stopped, its socket still there)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from scripts.pg_cluster import Cluster

__all__ = ["Cluster", "frozen"]


def _processes(cluster: Cluster) -> list[int]:
    """The postmaster (postmaster.pid's first line) and every process it started."""
    postmaster = int((Path(cluster.data) / "postmaster.pid").read_text().split()[0])
    found = [postmaster]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(fields[1]) == postmaster:  # the field after the state: the parent's pid
            found.append(int(stat.parent.name))
    return found


@contextmanager
def frozen(cluster: Cluster) -> Iterator[None]:
    """The cluster unreachable as a hung or cut-off database host is: connections open (the kernel queues
    them) but nothing answers, statements in flight never end. Thawed on the way out, whatever happened."""
    pids = _processes(cluster)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
