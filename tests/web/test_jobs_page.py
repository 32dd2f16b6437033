"""The web page's bulk jobs, in headless Chromium against the real app and a real PostgreSQL (make test-web):
POST /v1/jobs, each page shown as its event arrives ("N of M pages"), Cancel, the key's jobs listed with
their results, and a service without a job database. The app runs tests/stall_engine.py's engine (each page
0.3 s: pages arrive one by one)."""

from __future__ import annotations

import json

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from ..server import Server, add_key
from ..test_jobs import StallServer, doc, make_server, submit_ok, wait_status
from .test_page import results, severe, shown_error, submit, wait, write

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
    # The job was listed when it was sent, and shown done once it ended.
    assert row(job_page, job_id, "done")["cells"][2] == "3 of 3"
    # No script error and no Content-Security-Policy violation on the way.
    assert severe(job_page) == []


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
    # The page asked for the key's jobs when the key was typed: no job database, no list.
    assert not page.find_element(By.ID, "jobs").is_displayed()


# --- the key's jobs -------------------------------------------------------------------------------------

FINISHED = ("done", "failed", "cancelled")


def api_jobs(srv: Server, key: str = "default") -> list[dict]:
    """The key's jobs, newest first, as GET /v1/jobs lists them (all: fewer than 100 here)."""
    with srv.client(key) as c:
        r = c.get("/v1/jobs", params={"limit": 100})
    assert r.status_code == 200, r.text
    assert r.json()["next_cursor"] is None
    return r.json()["jobs"]


def api_job(srv: Server, pages: int, seed: str, key: str = "default", finished: bool = True) -> str:
    with srv.client(key) as c:
        job_id = submit_ok(c, doc(pages, seed)).json()["job_id"]
        if finished:
            wait_status(c, job_id, lambda b: b["status"] in FINISHED, 30)
    return job_id


def enter_key(driver: WebDriver, key: str) -> None:
    field = driver.find_element(By.ID, "api-key")
    field.clear()
    field.send_keys(key, Keys.TAB)  # leaving the field lists the key's jobs


def rows(driver: WebDriver) -> list[dict]:
    return driver.execute_script(
        """return [...document.querySelectorAll("#jobs-list tr")].map(tr => ({
          id: tr.dataset.jobId,
          cells: [...tr.cells].map(td => td.textContent),
          created: tr.querySelector("time")?.getAttribute("datetime"),
          buttons: [...tr.querySelectorAll("button")].map(b => b.textContent),
        }))"""
    )


def row(driver: WebDriver, job_id: str, status: str | None = None) -> dict:
    def found(d):
        match = [r for r in rows(d) if r["id"] == job_id]
        return match[0] if match and (status is None or match[0]["cells"][1] == status) else None

    return wait(driver, found, 30, f"job {job_id} not listed{f' as {status}' if status else ''}")


def test_the_key_s_jobs_are_listed_with_their_results(job_page, jobs_srv, tmp_path):
    other = add_key(jobs_srv.keys_file, "other-web", jobs_srv.command)
    theirs = api_job(jobs_srv, 1, "t", key=other, finished=False)
    mine = api_job(jobs_srv, 2, "m")
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    allow = {"behavior": "allow", "downloadPath": str(downloads)}
    job_page.execute_cdp_cmd("Browser.setDownloadBehavior", allow)

    enter_key(job_page, jobs_srv.key)
    wait(job_page, lambda d: d.find_element(By.ID, "jobs").is_displayed(), 30, "no jobs section")
    listed = row(job_page, mine, "done")
    api = api_jobs(jobs_srv)
    assert listed["cells"][0] == mine and listed["cells"][2] == "2 of 2"
    assert listed["created"] == next(j["created_at"] for j in api if j["job_id"] == mine)
    assert listed["buttons"] == ["Result"]
    # The key's jobs, newest first, as the API lists them; never another key's.
    assert [r["id"] for r in rows(job_page)] == [j["job_id"] for j in api][:20]
    assert theirs not in [r["id"] for r in rows(job_page)]

    # The result, fetched with the key and saved as <job_id>.jsonl: the API's JSON Lines, byte for byte.
    button = job_page.find_element(By.CSS_SELECTOR, f'#jobs-list tr[data-job-id="{mine}"] button.result')
    assert (
        button.get_attribute("aria-label")
        == f"Result of job {mine}, saved in the format chosen above the list"
    )
    assert job_page.find_element(By.ID, "jobs-format").get_attribute("value") == "jsonl"
    button.click()
    saved = downloads / f"{mine}.jsonl"
    wait(job_page, lambda d: saved.exists() and not list(downloads.glob("*.crdownload")), 30, "no download")
    with jobs_srv.client() as c:
        expected = c.get(f"/v1/jobs/{mine}/result", headers={"Accept": "application/x-ndjson"}).content
    assert saved.read_bytes() == expected
    assert [json.loads(x)["page"] for x in expected.splitlines()] == [1, 2]
    # Another format chosen above the list: the API's result in it, saved as <job_id> and its extension.
    Select(job_page.find_element(By.ID, "jobs-format")).select_by_value("markdown")
    button.click()
    saved = downloads / f"{mine}.md"
    wait(job_page, lambda d: saved.exists() and not list(downloads.glob("*.crdownload")), 30, "no download")
    with jobs_srv.client() as c:
        assert saved.read_bytes() == c.get(f"/v1/jobs/{mine}/result", params={"format": "markdown"}).content
    assert not job_page.find_element(By.ID, "error").is_displayed()
    assert severe(job_page) == []


def test_more_follows_the_next_cursor(job_page, jobs_srv):
    while len(api_jobs(jobs_srv)) < 5:
        api_job(jobs_srv, 1, "p")
    api = [j["job_id"] for j in api_jobs(jobs_srv)]
    enter_key(job_page, jobs_srv.key)
    wait(job_page, lambda d: d.find_element(By.ID, "jobs").is_displayed(), 30, "no jobs section")
    more = job_page.find_element(By.ID, "jobs-more")
    assert not more.is_displayed()  # the default page size (20) lists them all
    assert [r["id"] for r in rows(job_page)] == api

    job_page.execute_script('document.getElementById("jobs").dataset.pageSize = "2"')
    job_page.find_element(By.ID, "jobs-refresh").click()
    wait(job_page, lambda d: len(rows(d)) == 2, 30, "not 2 jobs after Refresh")
    shown = 2
    while shown < len(api):
        assert more.is_displayed()
        more.send_keys(Keys.ENTER)  # from the keyboard
        shown = min(shown + 2, len(api))
        wait(job_page, lambda d, n=shown: len(rows(d)) == n, 30, f"not {shown} jobs after More")
    assert [r["id"] for r in rows(job_page)] == api  # each once, in order
    wait(job_page, lambda d: not more.is_displayed(), 10, "More still shown after the last page")


def test_a_listed_job_can_be_followed_and_cancelled(job_page, jobs_srv):
    jobs_srv.drain_file.touch()  # a draining instance claims nothing: the job stays queued
    try:
        queued = api_job(jobs_srv, 2, "q", finished=False)
        enter_key(job_page, jobs_srv.key)
        assert row(job_page, queued, "queued")["buttons"] == ["Follow", "Cancel"]
        tr = f'#jobs-list tr[data-job-id="{queued}"]'
        job_page.find_element(By.CSS_SELECTOR, f"{tr} button.follow").click()
        wait(job_page, lambda d: text(d, "job-count") == "0 of 2 pages", 30, "not followed")
        assert text(job_page, "job-note") == "queued"
        job_page.find_element(By.CSS_SELECTOR, f"{tr} button.cancel").click()
        wait(job_page, lambda d: text(d, "status").startswith("Job cancelled"), 30, "not cancelled")
    finally:
        jobs_srv.drain_file.unlink(missing_ok=True)
    assert text(job_page, "status") == "Job cancelled: 0 of 2 pages shown."
    assert row(job_page, queued, "cancelled")["buttons"] == ["Result"]
    with jobs_srv.client() as c:
        assert c.get(f"/v1/jobs/{queued}").json()["status"] == "cancelled"
    assert severe(job_page) == []
