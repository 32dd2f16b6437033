"""/docs (Swagger UI) and /redoc (ReDoc) render in headless Chromium from the app's own files, under the
page's Content-Security-Policy, with the browser cut off from every other host (make test-web)."""

from __future__ import annotations

import pytest
from selenium.webdriver.common.by import By

from ..server import Server
from .test_page import wait

pytestmark = pytest.mark.browser

REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


def fresh(browser, url: str):
    browser.get("about:blank")
    browser.get_log("browser")  # drop what earlier tests logged
    browser.get(url)


def test_swagger_ui_shows_the_ocr_operation(browser, server: Server):
    fresh(browser, server.url + "/docs")
    ops = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".opblock-summary-path"), 30, "no ops")
    assert "/v1/ocr" in [o.text.strip() for o in ops]
    assert "ocrfleet OCR service" in browser.find_element(By.CSS_SELECTOR, ".info .title").text
    # A CSP violation, a failed load (a CDN) or a script error is logged as SEVERE.
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_redoc_shows_the_ocr_operation(browser, server: Server):
    fresh(browser, server.url + "/redoc")
    wait(browser, lambda d: "/v1/ocr" in d.find_element(By.TAG_NAME, "body").text, 30, "no /v1/ocr in ReDoc")
    severe = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    # ReDoc's sidebar always asks its CDN for a logo: the CSP blocking it is the policy at work.
    assert [m for m in severe if not (REDOC_LOGO in m and "violates" in m)] == []
