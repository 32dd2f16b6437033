"""`ocr-app jobs list` (the key's jobs, newest first) and `ocr-app jobs wait JOB...` (until each finished)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..config import ConfigError
from .jobclient import _expect

if TYPE_CHECKING:
    import httpx

STATES = ("queued", "running", "done", "failed", "cancelled")
MAX_LIMIT = 100  # the server's per page


def list_jobs(client: httpx.Client, args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= MAX_LIMIT:
        raise ConfigError(f"--limit: 1 to {MAX_LIMIT}")
    params: dict[str, str | list[str]] = {"limit": str(args.limit), "status": list(args.status or ())}
    jobs: list[dict[str, Any]] = []
    cursor = None
    while True:
        if cursor:
            params["cursor"] = cursor
        body = _expect(client.get("/v1/jobs", params=params), 200)
        jobs += body["jobs"]
        cursor = body.get("next_cursor")
        if not (args.all and cursor):
            break
    if args.json:
        print(json.dumps({"jobs": jobs, "next_cursor": cursor}, indent=2))
    else:
        print(f"{'JOB':36}  {'STATUS':9}  {'PAGES':>9}  CREATED")
        for job in jobs:
            pages = job.get("pages", {})
            done = f"{pages.get('done', 0)}/{pages.get('total', '?')}"
            print(f"{job['job_id']:36}  {job['status']:9}  {done:>9}  {job.get('created_at', '')}")
    if cursor:
        print(f"more jobs than these {len(jobs)}: --all lists them all", file=sys.stderr)
    return 0


def wait(client: httpx.Client, args: argparse.Namespace, sleep: Callable[[float], None] = time.sleep) -> int:
    """Poll each job until it is finished; print `JOB<TAB>STATUS<TAB>DONE/TOTAL` as each one ends. Exit 0 when
    every job is done with every page read, 1 otherwise or on --timeout."""
    if args.timeout_s is not None and args.timeout_s <= 0:
        raise ConfigError("--timeout: more than 0 seconds")
    deadline = None if args.timeout_s is None else time.monotonic() + args.timeout_s
    waiting = list(dict.fromkeys(args.job_ids))
    rc, delay = 0, 0.2
    while True:
        for job_id in list(waiting):
            body = _expect(client.get(f"/v1/jobs/{job_id}"), 200)
            if body["status"] in ("queued", "running"):
                continue
            waiting.remove(job_id)
            pages = body.get("pages", {})
            total, done = pages.get("total"), pages.get("done", 0)
            print(f"{job_id}\t{body['status']}\t{done}/{total}", flush=True)
            if body["status"] != "done" or done != total:
                print(f"job {job_id} ended {body['status']}: {done} of {total} page(s) read", file=sys.stderr)
                rc = 1
        if not waiting:
            return rc
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            print(
                f"ocr-app: --timeout {args.timeout_s:g} s passed; not finished yet: {', '.join(waiting)}",
                file=sys.stderr,
            )
            return 1
        sleep(delay if left is None else min(delay, left))
        delay = min(delay * 1.5, 2.0)
