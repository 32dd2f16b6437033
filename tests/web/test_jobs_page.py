"""The web page's bulk jobs, in headless Chromium against the real app and a real PostgreSQL (make test-web):
POST /v1/jobs, each page shown as its event arrives ("N of M pages"), Cancel, and a service without a job
database. The app runs tests/stall_engine.py's engine (each page 0.3 s: pages arrive one by one)."""

from __future__ import annotations

import json

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from ..server import Server
from ..test_jobs import StallServer, doc, make_server
from .test_page import results, shown_error, submit, wait, write

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def jobs_srv(tmp_path_factory, postgres):
    control = tmp_path_factory.mktemp("stall-control")
    (control / "trickle").write_text("0.3")
    srv = make_server(
        StallServer, tmp_path_factory, postgres, "web_jobs", engine="rapidocr", job_range_pages=1
    ).start(env={"STALL_CONTROL": str(control)})
    yield srv
    assert srv.stop() == 0, srv.logs()[-2000:]


def load(browser: WebDriver, srv: Server) -> WebDriver:
    browser.get(srv.url + "/")
    browser.execute_script("sessionStorage.clear(); localStorage.clear();")
    browser.get_log("browser")  # what earlier tests logged
    browser.refresh()
    return browser


@pytest.fixture
def job_page(browser, jobs_srv):
    return load(browser, jobs_srv)


def text(driver: WebDriver, element_id: str) -> str:
    return driver.find_element(By.ID, element_id).get_attribute("textContent")


def test_a_pdf_sent_as_a_job_shows_each_page_as_it_is_read(job_page, jobs_srv, tmp_path):
    path = write(tmp_path, "three pages.pdf", doc(3, "w"))
    # Every state of the progress line, with the pages shown at that moment.
    job_page.execute_script(
        """
        window.seen = [];
        new MutationObserver(() => window.seen.push([
          document.getElementById("job-count").textContent,
          document.querySelectorAll("article.page").length,
        ])).observe(document.getElementById("job-progress"), { subtree: true, childList: true });
        """
    )
    job_page.find_element(By.ID, "as-job").click()
    submit(job_page, jobs_srv.key, path)
    wait(job_page, lambda d: d.find_element(By.ID, "cancel-job").is_displayed(), 30, "no Cancel button")
    articles = results(job_page, 3)
    wait(job_page, lambda d: text(d, "status").startswith("Done"), 30, "the job did not end")
    assert text(job_page, "job-count") == "3 of 3 pages"
    assert text(job_page, "status") == "Done: 3 of 3 pages, 3 lines."
    assert not job_page.find_element(By.ID, "cancel-job").is_displayed()
    seen = job_page.execute_script("return window.seen")
    # Each page appeared with its own event, before the next was read.
    assert ["1 of 3 pages", 1] in seen and ["2 of 3 pages", 2] in seen and seen[-1] == ["3 of 3 pages", 3]

    job_id = text(job_page, "summary").rsplit("job ", 1)[1]
    with jobs_srv.client() as c:
        api = c.get(f"/v1/jobs/{job_id}/result", headers={"Accept": "application/x-ndjson"}).text
    pages = [json.loads(x) for x in api.splitlines()]
    for article, page in zip(articles, pages, strict=True):
        assert article.get_attribute("data-page") == str(page["page"])
        assert article.find_element(By.TAG_NAME, "img").get_attribute("src") == page["preview"]
        assert article.find_element(By.CSS_SELECTOR, "pre.text").get_attribute("textContent") == page["text"]
    # No script error and no Content-Security-Policy violation on the way.
    assert [e for e in job_page.get_log("browser") if e["level"] == "SEVERE"] == []


def test_cancel_stops_the_job(job_page, jobs_srv, tmp_path):
    path = write(tmp_path, "two pages.pdf", doc(2, "x"))
    jobs_srv.drain_file.touch()  # a draining instance claims nothing: the job stays queued
    try:
        job_page.find_element(By.ID, "as-job").click()
        submit(job_page, jobs_srv.key, path)
        wait(job_page, lambda d: text(d, "job-count") == "0 of 2 pages", 30, "no progress line")
        assert text(job_page, "job-note") == "queued"
        job_page.find_element(By.ID, "cancel-job").click()
        wait(job_page, lambda d: text(d, "status").startswith("Job cancelled"), 30, "not cancelled")
    finally:
        jobs_srv.drain_file.unlink(missing_ok=True)
    assert text(job_page, "status") == "Job cancelled: 0 of 2 pages shown."
    assert text(job_page, "job-note") == "cancelled"
    assert not job_page.find_elements(By.CSS_SELECTOR, "article.page")
    assert not job_page.find_element(By.ID, "error").is_displayed()


def test_a_large_pdf_is_sent_as_a_job(job_page, tmp_path):
    big = write(tmp_path, "big.pdf", b"%PDF-1.4\n" + b"0" * (5 * 1024 * 1024))
    box = job_page.find_element(By.ID, "as-job")
    assert not box.is_selected()
    job_page.find_element(By.ID, "file").send_keys(str(big))
    wait(job_page, lambda d: box.is_selected(), 10, "a PDF over 5 MB did not tick the bulk-job box")


def test_without_a_job_database_the_service_s_message_is_shown(browser, server: Server, tmp_path):
    page = load(browser, server)
    page.find_element(By.ID, "as-job").click()
    submit(page, server.key, write(tmp_path, "one.pdf", doc(1, "n")))
    err = shown_error(page)
    assert (err["status"], err["code"]) == ("503", "jobs_unavailable")
    assert "database_url" in err["message"] and err["request_id"] in server.logs()
    hint = page.find_element(By.CSS_SELECTOR, ".error-hint").text
    assert "Run as a bulk job" in hint and "Retry after" in hint
    assert not page.find_element(By.ID, "job-progress").is_displayed()
