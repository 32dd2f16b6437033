"""A bulk job through the fleet's load balancer, and what the fleet's job database says of it: a generated PDF
whose every page names its own number, so a page lost, repeated or swapped for another shows in the result."""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass

import httpx
from httpx_sse import SSEError, connect_sse

from lab import fleet as F
from lab.base import wait_until
from ocr_app.fleet.jobclient import retry_after_s
from tests.docs import pdf, render
from tests.fleet.conftest import say

DATABASE = "ocr"  # the postgresql role's postgresql_database
SEND_TRIES = 5  # a job's POST, asked again on 503 jobs_unavailable (FleetJob.send)
SEND_PAUSE_MAX_S = 10.0


def db_leader(fleet: F.Fleet, timeout: float = 120) -> str:
    """The job database host taking writes now, waiting out a failover."""
    return wait_until(fleet.db_leader, timeout, "a job database leader", 1.0)


# Lines that make a page cost more OCR without a digit to misread: letters OCR does not take for digits.
FILLER = ["we never hurry anywhere", "a wren can carry a new fern", "every crew may wave ahead"]


def document(pages: int, filler: int = 0) -> bytes:
    """A PDF of `pages` small pages, page i reading `JOB PAGE i / pages` (a few tenths of a second of OCR),
    then `filler` lines without digits (each about as much OCR again)."""
    lines = [FILLER[k % len(FILLER)] for k in range(filler)]
    images = [
        render([f"JOB PAGE {i} / {pages}", *lines], size=36, width=620, margin=30).image
        for i in range(1, pages + 1)
    ]
    return pdf(images, dpi=200)


@dataclass
class FleetJob:
    fleet: F.Fleet
    job_id: str
    pages: int

    @classmethod
    def submit(cls, fleet: F.Fleet, pages: int, key: str, filler: int = 0) -> FleetJob:
        return cls.send(fleet, document(pages, filler), pages, key)

    @classmethod
    def send(cls, fleet: F.Fleet, body: bytes, pages: int, key: str) -> FleetJob:
        """POST the job as the API asks a client to: a 503 jobs_unavailable (the database slower than
        job_db_timeout_s, as a 16 MB document can make it on a loaded 2-core lab) is asked again after its
        Retry-After with the same Idempotency-Key, which finds the job if the first write ended after all;
        at most SEND_TRIES times. Anything else fails the test at once."""
        for attempt in range(1, SEND_TRIES + 1):
            with fleet.client() as c:
                r = c.post(
                    "/v1/jobs",
                    content=body,
                    headers={"Content-Type": "application/pdf", "Idempotency-Key": key},
                )
            if r.status_code != 503 or attempt == SEND_TRIES:
                break
            assert r.json()["error"]["code"] == "jobs_unavailable", r.text
            wait = retry_after_s(r, SEND_PAUSE_MAX_S) or 1.0
            say(f"job {key}: 503 jobs_unavailable, asked again in {wait:g} s: {r.json()['error']['message']}")
            time.sleep(wait)  # the server's Retry-After: a client's pause, not a timing assumption
        assert r.status_code == 202, r.text
        if attempt > 1:
            replayed = r.headers.get("idempotent-replayed") == "true"
            say(f"job {key}: accepted on try {attempt}{' (the first write had ended)' if replayed else ''}")
        return cls(fleet, r.json()["job_id"], pages)

    def status(self) -> dict | None:
        """The job's status through the load balancer; None while no answer comes (a database restarting)."""
        try:
            with self.fleet.client(timeout=10) as c:
                r = c.get(f"/v1/jobs/{self.job_id}")
        except httpx.TransportError:
            return None
        return r.json() if r.status_code == 200 else None

    def wait_pages(self, at_least: int, timeout: float) -> dict:
        """Poll (bounded) until at least this many pages are read or the job has ended."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = self.status() or last
            if last and (last["pages"]["done"] >= at_least or last["status"] not in ("queued", "running")):
                return last
            time.sleep(0.5)
        raise AssertionError(f"job {self.job_id}: fewer than {at_least} pages within {timeout:.0f} s: {last}")

    def wait_done(self, timeout: float) -> dict:
        st = self.wait_pages(self.pages + 1, timeout)  # returns only once the job has ended
        assert st["status"] == "done", st
        return st

    def result_pages(self) -> list[dict]:
        """The result as JSON Lines, streamed through the load balancer: one page per line, in order."""
        # A 503 with Retry-After (the job database away from the instance that took it) is retried as the
        # API says, a few times: the answer after that counts.
        for _ in range(5):
            with self.fleet.client(timeout=300) as c:
                r = c.get(f"/v1/jobs/{self.job_id}/result", headers={"Accept": "application/x-ndjson"})
            if r.status_code != 503 or not r.headers.get("retry-after", "").isdigit():
                break
            say(f"result: 503 {r.json()['error']['message']}; again in {r.headers['retry-after']} s")
            time.sleep(int(r.headers["retry-after"]))  # the server's Retry-After
        assert r.status_code == 200, r.text[:500]
        return [json.loads(line) for line in r.text.splitlines() if line.strip()]

    def check(self) -> dict[str, int]:
        """Every page once, in order, reading its own number: lost (missing or wrong), duplicated (more than
        once), and how many pages the result holds."""
        got = self.result_pages()
        numbers = [p["page"] for p in got]
        duplicated = sum(n - 1 for n in Counter(numbers).values() if n > 1)
        right = {
            p["page"]
            for p in got
            if [int(x) for x in re.findall(r"\d+", p.get("text", ""))] == [p["page"], self.pages]
        }
        lost = self.pages - len(right & set(range(1, self.pages + 1)))
        assert numbers == sorted(numbers), "pages out of order"
        return {"job_pages_lost": lost, "job_pages_duplicated": duplicated, "pages": len(got)}

    def sql(self, query: str) -> list[list[str]]:
        """Rows of a query about this job (`:'job'` in it), run by psql on the database host that takes writes
        (Patroni's leader: a standby may not have replayed the last commits yet)."""
        argv = ["runuser", "-u", "postgres", "--", "psql", "-d", DATABASE, "-AtF", "\t"]
        argv += ["-v", f"job={self.job_id}"]
        out = self.fleet.lab.exec(db_leader(self.fleet), argv, input=query).stdout
        return [line.split("\t") for line in out.splitlines() if line]

    def shares(self) -> dict[str, int]:
        """Pages written per app host (the worker column names host:port:pid)."""
        rows = self.sql(
            "SELECT split_part(worker, ':', 1), count(*) FROM ocr_job_pages WHERE job_id = :'job' GROUP BY 1"
        )
        return {host: int(n) for host, n in rows}

    def written(self) -> list[tuple[str, float]]:
        """(app host, Unix time) of each page written, in time order (the lab's hosts share one clock)."""
        rows = self.sql(
            "SELECT split_part(worker, ':', 1), extract(epoch FROM finished_at) FROM ocr_job_pages "
            "WHERE job_id = :'job' ORDER BY 2"
        )
        return [(host, float(t)) for host, t in rows]

    def pace(self) -> float:
        """Pages read per second so far: the pages written over the time from the job's creation to the last
        one written (the database's clock both; 0.0 before a page is written). From the first page written
        instead, a small job's ranges, read side by side and ending together, showed twice the fleet's
        pace."""
        (row,) = self.sql(
            "SELECT count(p.*), extract(epoch FROM max(p.finished_at) - j.created_at) FROM ocr_jobs j "
            "LEFT JOIN ocr_job_pages p ON p.job_id = j.id WHERE j.id = :'job' GROUP BY j.created_at"
        )
        pages, seconds = int(row[0]), float(row[1] or 0)
        return pages / seconds if pages and seconds > 0 else 0.0

    def sized(self, seconds: float, least: int, most: int, base: int = 0) -> int:
        """A job size from this job's pace: `base` pages plus what the fleet reads in `seconds` at it, within
        least..most (a fixed count is read too soon on a fast machine or too slowly on a slow one)."""
        rate = self.pace()
        pages = min(most, max(least, base + math.ceil(rate * seconds)))
        say(f"job pace: {rate:.2f} pages/s (a job of {self.pages} pages): {pages} pages")
        return pages

    def windows(self, since: float) -> dict[str, str]:
        """When each app host wrote its pages, first to last, in seconds after `since` (Unix time)."""
        at: dict[str, list[float]] = {}
        for host, t in self.written():
            at.setdefault(host, []).append(t - since)
        return {h: f"{min(ts):.0f}-{max(ts):.0f} s" for h, ts in sorted(at.items())}

    def reclaimed_ranges(self) -> int:
        """Page ranges claimed more than once (a lease that expired or was let go)."""
        rows = self.sql("SELECT count(*) FROM ocr_job_ranges WHERE job_id = :'job' AND claims > 1")
        return int(rows[0][0])


FINISHED = ("done", "failed", "cancelled", "expired")


class EventReader:
    """A client of a job's event stream through the load balancer, read with httpx-sse (an SSE client no one
    here wrote) in a thread. It drops its connection once, after `drop_after` pages (a reconnect mid-job),
    resumes with Last-Event-ID whenever a stream ends or fails (an instance killed, PostgreSQL restarting),
    and stops at the first event that says the job is finished, as a client that takes it at its word:
    `pages` is what it held then."""

    def __init__(self, fleet: F.Fleet, job_id: str, drop_after: int, timeout: float = 1500):
        self.fleet, self.job_id, self.drop_after = fleet, job_id, drop_after
        self.pages: list[int] = []
        self.finished: dict | None = None  # the first event that said the job is finished
        self.connections = 0
        self.interruptions: list[str] = []  # why a stream ended before that event, each time
        self.deadline = time.monotonic() + timeout
        self.thread = threading.Thread(target=self._run, name=f"events-{job_id}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        last: str | None = None
        dropped = False
        while self.finished is None and time.monotonic() < self.deadline:
            headers = {"Last-Event-ID": last} if last else {}
            self.connections += 1
            try:
                with (
                    self.fleet.client(timeout=60) as c,
                    connect_sse(c, "GET", f"/v1/jobs/{self.job_id}/events", headers=headers) as source,
                ):
                    if source.response.status_code != 200:
                        self.interruptions.append(f"HTTP {source.response.status_code}")
                        time.sleep(1)  # a retry interval (the database restarting: 503)
                        continue
                    for sse in source.iter_sse():
                        if sse.event in ("page", "page_error"):
                            self.pages.append(int(sse.id))
                            last = sse.id
                            if not dropped and len(self.pages) >= self.drop_after:
                                dropped = True
                                self.interruptions.append("dropped by the client")
                                break
                        elif sse.event == "done" or (
                            sse.event == "progress" and json.loads(sse.data)["status"] in FINISHED
                        ):
                            self.finished = {"event": sse.event, **json.loads(sse.data)}
                            return
                        elif sse.event == "unavailable":  # the job database away: the stream's last event
                            self.interruptions.append("unavailable: " + json.loads(sse.data)["code"])
                            break
                    else:
                        self.interruptions.append("the stream ended")
            except (httpx.HTTPError, SSEError) as err:
                self.interruptions.append(type(err).__name__)
                time.sleep(0.5)  # a retry interval

    def wait(self, timeout: float) -> EventReader:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the event reader never saw the job finish: {self.interruptions}"
        return self
