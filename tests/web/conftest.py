"""Debian's headless Chromium, driven through chromedriver by selenium, on loopback only."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ..server import Server

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    """One Chromium for the session; each test starts from a fresh page (the `page` fixture)."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not found: the web page is tested in Debian's chromium through "
            "chromium-driver; run `make browser-deps` (scripts/install-system-deps.sh browser) "
            "or `make test-web`",
            pytrace=False,
        )
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is not installed: run `make venv` (the dev extra pins it)", pytrace=False)

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--window-size=1280,1024",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--disable-sync",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-default-apps",
        "--disable-features=Translate,OptimizationHints,MediaRouter",
        # Nothing but loopback: every host name fails to resolve (the app is reached by its IP).
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
        "--no-proxy-server",
    ):
        opts.add_argument(arg)
    if os.geteuid() == 0:
        opts.add_argument("--no-sandbox")  # Chromium's sandbox refuses to run as root
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    logs = tmp_path_factory.mktemp("chromium")
    # The drivers' paths are given: selenium never starts Selenium Manager (no downloads, no network).
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(logs / "chromedriver.log"))
    driver = webdriver.Chrome(options=opts, service=service)
    driver.set_script_timeout(30)
    yield driver
    driver.quit()
    shutil.rmtree(logs, ignore_errors=True)


@pytest.fixture
def page(browser, server: Server):
    """The OCR page freshly loaded, with an empty sessionStorage and a clean console log."""
    browser.get(server.url + "/")
    browser.execute_script("sessionStorage.clear(); localStorage.clear();")
    browser.delete_all_cookies()
    browser.get_log("browser")  # drop what earlier tests logged; what this load logs stays
    browser.refresh()
    return browser
