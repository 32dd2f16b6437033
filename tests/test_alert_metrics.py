"""The alert rules select series the app really exports (its /metrics, scraped), and every series they select
has a known exporter. HAProxy's are checked on the fleet's load balancer (tests/fleet), gpu_metrics' and
node-exporter's in gpu_metrics' Molecule scenario, PostgreSQL's exporter's in postgresql's: each against a
real scrape."""

from __future__ import annotations

import httpx

from .alert_metrics import missing, selectors, source_of


def test_every_selected_series_has_an_exporter():
    sels = selectors()
    assert {s.alert for s in sels} >= {"OcrHighErrorRate", "OcrQueueFull", "OcrLbNoServerUp"}  # parsed
    sources = {source_of(s.metric) for s in sels}
    assert sources >= {"app", "gpu_metrics", "haproxy", "node", "postgres"}
    assert [s for s in sels if source_of(s.metric) is None] == []


def test_the_apps_scrape_has_every_series_the_rules_select(server):
    assert server.ocr(b"", "image/png").status_code == 400  # one request, so ocr_requests_total has a code
    # Without a job database an instance has no ocr_job_store_up (tests/test_jobs.py), so that its alert never
    # fires for it; tests/test_jobs_db_away.py checks the series on one with a database.
    assert missing(httpx.get(server.url + "/metrics").text, "app") == [
        "OcrJobStoreUnreachable: ocr_job_store_up is not exported"
    ]
