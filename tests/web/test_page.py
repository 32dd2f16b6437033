"""The web page at `/`, driven in headless Chromium against the real app and engine (make test-web)."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

from ..docs import ARTICLE, TEXTS, encode, pdf, render, render_columns
from ..server import Server

pytestmark = pytest.mark.browser

OCR_WAIT_S = 120  # a PDF on two busy cores; the waits end as soon as the page shows the answer


def wait(driver: WebDriver, condition, timeout: float = OCR_WAIT_S, message: str = ""):
    return WebDriverWait(driver, timeout).until(lambda d: condition(d) or None, message)


def choose(driver: WebDriver, path: Path) -> None:
    driver.find_element(By.ID, "file").send_keys(str(path))
    wait(driver, lambda d: path.name in d.find_element(By.ID, "file-name").text, 10, "file not chosen")


def submit(driver: WebDriver, key: str | None, path: Path | None = None) -> None:
    field = driver.find_element(By.ID, "api-key")
    field.clear()
    if key:
        field.send_keys(key)
    if path is not None:
        choose(driver, path)
    driver.find_element(By.ID, "submit").click()


def results(driver: WebDriver, pages: int) -> list[WebElement]:
    """The rendered pages, once all `pages` are shown with their images decoded."""

    def ready(d: WebDriver):
        if d.find_element(By.ID, "error").is_displayed():
            raise AssertionError("the page shows an error: " + d.find_element(By.ID, "error").text)
        shown = d.find_elements(By.CSS_SELECTOR, "#results:not([hidden]) article.page")
        loaded = d.execute_script(
            "return [...document.querySelectorAll('article.page img')]"
            ".every(i => i.complete && i.naturalWidth > 0)"
        )
        return shown if len(shown) == pages and loaded else None

    return wait(driver, ready, message=f"{pages} page(s) not shown")


def shown_error(driver: WebDriver) -> dict[str, str]:
    box = wait(driver, lambda d: d.find_element(By.ID, "error"), message="no error shown")
    wait(driver, lambda d: box.is_displayed(), message="no error shown")
    fields = {
        "title": "#error-title",
        "status": ".error-status",
        "code": ".error-code",
        "message": ".error-message",
        "request_id": ".error-request-id",
    }
    return {
        k: box.find_element(By.CSS_SELECTOR, sel).get_attribute("textContent") for k, sel in fields.items()
    }


def severe(driver: WebDriver) -> list[dict]:
    """The browser's errors (script errors, CSP violations, failed loads) since the last call, but for the
    page's GET /v1/jobs on a service without a job database: 503, and the jobs section stays hidden."""
    return [
        e
        for e in driver.get_log("browser")
        if e["level"] == "SEVERE"
        and not re.search(r"/v1/jobs(\?\S*)? - Failed to load resource: .* status of 503\b", e["message"])
    ]


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def invoice(tmp_path_factory) -> tuple[Path, list[str]]:
    doc = render(TEXTS["en"])
    return write(tmp_path_factory.mktemp("docs"), "invoice.png", encode(doc.image, "PNG")), doc.lines


def test_image_page_shows_boxes_over_the_image_and_the_text(page, server: Server, invoice):
    path, lines = invoice
    api = server.ocr(path.read_bytes(), "image/png").json()["pages"][0]
    assert len(api["lines"]) == len(lines)

    submit(page, server.key, path)
    [article] = results(page, 1)
    rects = article.find_elements(By.CSS_SELECTOR, "svg.boxes rect.box")
    assert len(rects) == len(api["lines"])
    for rect, line in zip(rects, api["lines"], strict=True):
        x0, y0, x1, y1 = line["bbox"]
        drawn = [float(rect.get_attribute(a)) for a in ("x", "y", "width", "height")]
        assert drawn == pytest.approx([x0, y0, x1 - x0, y1 - y0], abs=1e-6)
    # The overlay covers the image exactly, and the image has the page's shape.
    img, svg = article.find_element(By.TAG_NAME, "img"), article.find_element(By.CSS_SELECTOR, "svg.boxes")
    assert img.rect == pytest.approx(svg.rect, abs=1)
    natural = page.execute_script("return [arguments[0].naturalWidth, arguments[0].naturalHeight]", img)
    assert natural[0] / natural[1] == pytest.approx(api["width"] / api["height"], rel=0.01)
    text = article.find_element(By.CSS_SELECTOR, "pre.text").get_attribute("textContent")
    assert text == api["text"]
    for word in ("Invoice", "Northwind", "Portsmouth", "thirty"):
        assert word in text
    assert "1 page, 4 lines" in page.find_element(By.ID, "summary").text
    assert page.find_element(By.ID, "status").text == "Done: 1 page, 4 lines."
    # No script error and no Content-Security-Policy violation on the way.
    assert severe(page) == []


def test_a_document_downloads_in_another_format(page, server: Server, invoice, tmp_path):
    """Download as: the document sent again with format=, saved as <its name> and the format's extension."""
    path, _ = invoice
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    page.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    submit(page, server.key, path)
    results(page, 1)
    Select(page.find_element(By.ID, "download-format")).select_by_value("hocr")
    page.find_element(By.ID, "download").click()
    saved = downloads / "invoice.hocr"
    wait(page, lambda d: saved.exists() and not list(downloads.glob("*.crdownload")), message="no download")
    assert saved.read_bytes() == server.ocr(path.read_bytes(), "image/png", params={"format": "hocr"}).content
    assert severe(page) == []


def test_block_outlines_show_with_the_toggle(page, server: Server, tmp_path):
    doc = render_columns(ARTICLE["title"], ARTICLE["columns"])
    path = write(tmp_path, "article.png", encode(doc.image, "PNG"))
    api = server.ocr(path.read_bytes(), "image/png").json()["pages"][0]
    assert [b["type"] for b in api["blocks"]] == ["title", "text", "text"]

    submit(page, server.key, path)
    [article] = results(page, 1)
    rects = article.find_elements(By.CSS_SELECTOR, "svg.boxes rect.block")
    assert len(rects) == len(api["blocks"])
    assert not any(r.is_displayed() for r in rects)  # lines only, until asked
    page.find_element(By.ID, "show-blocks").click()
    wait(page, lambda d: all(r.is_displayed() for r in rects), 10, "block outlines not shown")
    for rect, block in zip(rects, api["blocks"], strict=True):
        x0, y0, x1, y1 = block["bbox"]
        drawn = [float(rect.get_attribute(a)) for a in ("x", "y", "width", "height")]
        assert drawn == pytest.approx([x0, y0, x1 - x0, y1 - y0], abs=1e-6)
        assert rect.get_attribute("class") == f"block block-{block['type']}"
    page.find_element(By.ID, "show-blocks").click()
    wait(page, lambda d: not any(r.is_displayed() for r in rects), 10, "block outlines still shown")
    # The text keeps its blank lines between blocks, and one span per line (hover links them to boxes).
    pre = article.find_element(By.CSS_SELECTOR, "pre.text")
    assert pre.get_attribute("textContent") == api["text"] and "\n\n" in api["text"]
    assert len(pre.find_elements(By.CSS_SELECTOR, "span.line")) == len(api["lines"])


def test_two_page_pdf_shows_both_pages_with_previews(page, server: Server, tmp_path):
    docs = [render([TEXTS["en"][0], "This is the first page"]), render(["Second page of the PDF"])]
    path = write(tmp_path, "two pages.pdf", pdf([d.image for d in docs]))
    api = server.ocr(path.read_bytes(), "application/pdf").json()["pages"]

    submit(page, server.key, path)
    articles = results(page, 2)
    for article, expected, doc in zip(articles, api, docs, strict=True):
        assert article.get_attribute("data-page") == str(expected["page"])
        assert article.find_element(By.TAG_NAME, "h2").text == f"Page {expected['page']}"
        src = article.find_element(By.TAG_NAME, "img").get_attribute("src")
        assert src.startswith("data:image/jpeg;base64,")
        assert len(article.find_elements(By.CSS_SELECTOR, "rect.box")) == len(expected["lines"]) > 0
        text = article.find_element(By.CSS_SELECTOR, "pre.text").get_attribute("textContent")
        assert text == expected["text"]
        assert doc.lines[-1].split()[0] in text
    assert "Second page" in articles[1].text and "Second page" not in articles[0].text


@pytest.mark.parametrize(
    ("key", "message"),
    [("ocr_not-a-valid-key", "invalid API key"), (None, "missing API key")],
    ids=["wrong-key", "no-key"],
)
def test_unauthorized_is_shown_as_the_api_states_it(page, server: Server, invoice, key, message):
    submit(page, key, invoice[0])
    err = shown_error(page)
    assert (err["status"], err["code"]) == ("401", "unauthorized")
    assert err["message"].startswith(message)
    assert re.fullmatch(r"[0-9a-f]{32}", err["request_id"])
    assert err["request_id"] in server.logs()  # the id the API gave this very request
    assert not page.find_elements(By.CSS_SELECTOR, "article.page")


def test_unsupported_file_is_shown_as_415(page, server: Server, tmp_path):
    submit(page, server.key, write(tmp_path, "notes.txt", b"just some text, not a document\n"))
    err = shown_error(page)
    assert (err["status"], err["code"]) == ("415", "unsupported_media_type")
    assert "text/plain" in err["message"]
    assert err["request_id"] in server.logs()


def test_bad_pages_selection_is_shown_as_422(page, server: Server, invoice):
    page.find_element(By.ID, "pages").send_keys("0-")
    submit(page, server.key, invoice[0])
    err = shown_error(page)
    assert (err["status"], err["code"]) == ("422", "invalid_parameter")
    assert err["message"].startswith("pages must look like")


def test_network_error_is_shown(page, server: Server, invoice):
    page.execute_cdp_cmd("Network.enable", {})
    offline = {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1}
    page.execute_cdp_cmd("Network.emulateNetworkConditions", offline)
    try:
        submit(page, server.key, invoice[0])
        err = shown_error(page)
    finally:
        page.execute_cdp_cmd("Network.emulateNetworkConditions", offline | {"offline": False})
        page.execute_cdp_cmd("Network.disable", {})
    assert err["title"] == "Could not reach the OCR service"
    assert (err["status"], err["code"], err["request_id"]) == ("", "", "")
    assert page.find_element(By.ID, "error").get_attribute("data-kind") == "network"


def test_busy_while_the_request_is_in_flight(page, server: Server, invoice):
    # Slow network (the request cannot be answered within 1.5 s), so the busy state is there to see.
    slow = {"offline": False, "latency": 1500, "downloadThroughput": -1, "uploadThroughput": -1}
    page.execute_cdp_cmd("Network.enable", {})
    page.execute_cdp_cmd("Network.emulateNetworkConditions", slow)
    try:
        submit(page, server.key, invoice[0])
        button, form = page.find_element(By.ID, "submit"), page.find_element(By.ID, "ocr-form")
        assert not button.is_enabled()
        assert form.get_attribute("aria-busy") == "true"
        assert page.find_element(By.ID, "status").text.startswith("Recognising invoice.png")
        results(page, 1)
    finally:
        page.execute_cdp_cmd("Network.emulateNetworkConditions", slow | {"latency": 0})
        page.execute_cdp_cmd("Network.disable", {})
    assert button.is_enabled() and form.get_attribute("aria-busy") == "false"


def test_key_is_kept_in_the_tab_session_only(page, server: Server):
    page.find_element(By.ID, "api-key").send_keys(server.key)
    page.refresh()
    field = wait(page, lambda d: d.find_element(By.ID, "api-key"), 10)
    assert field.get_attribute("value") == server.key
    assert field.get_attribute("type") == "password"
    assert page.execute_script("return Object.values(sessionStorage)") == [server.key]
    assert page.execute_script("return localStorage.length") == 0
    assert page.get_cookies() == []
    assert page.execute_script("return document.cookie") == ""

    first = page.current_window_handle
    page.switch_to.new_window("tab")  # another tab: another session
    try:
        page.get(server.url + "/")
        assert page.find_element(By.ID, "api-key").get_attribute("value") == ""
    finally:
        page.close()
        page.switch_to.window(first)

    page.find_element(By.ID, "forget-key").click()
    assert page.execute_script("return sessionStorage.length") == 0
    page.refresh()
    assert page.find_element(By.ID, "api-key").get_attribute("value") == ""


def test_copy_puts_the_page_text_in_the_clipboard(page, server: Server, invoice):
    page.execute_cdp_cmd(
        "Browser.grantPermissions",
        {"origin": server.url, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]},
    )
    page.execute_script("return navigator.clipboard.writeText('before')")
    submit(page, server.key, invoice[0])
    [article] = results(page, 1)
    expected = article.find_element(By.CSS_SELECTOR, "pre.text").get_attribute("textContent")
    assert "Northwind" in expected

    button = article.find_element(By.CSS_SELECTOR, "button.copy")
    assert button.text == "Copy"
    button.click()
    wait(page, lambda d: button.text == "Copied", 10, "the Copy button did not report success")
    clipboard = page.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "navigator.clipboard.readText().then(done, (e) => done('ERROR ' + e));"
    )
    assert clipboard == expected


def test_dropped_file_is_sent(page, server: Server, invoice):
    path, _ = invoice
    page.find_element(By.ID, "api-key").send_keys(server.key)
    page.execute_script(
        """
        const [b64, name] = arguments;
        const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
        const data = new DataTransfer();
        data.items.add(new File([bytes], name, { type: "image/png" }));
        const zone = document.getElementById("drop-zone");
        for (const type of ["dragenter", "dragover", "drop"]) {
          zone.dispatchEvent(new DragEvent(type, { bubbles: true, cancelable: true, dataTransfer: data }));
        }
        """,
        base64.b64encode(path.read_bytes()).decode(),
        "dropped.png",
    )
    assert "dropped.png" in page.find_element(By.ID, "file-name").text
    page.find_element(By.ID, "submit").click()
    [article] = results(page, 1)
    assert "Northwind" in article.find_element(By.CSS_SELECTOR, "pre.text").get_attribute("textContent")


def test_labelled_and_usable_from_the_keyboard(page, server: Server):
    unlabelled = page.execute_script(
        "return [...document.querySelectorAll('input, button')]"
        ".filter(e => !(e.labels && e.labels.length) && !e.textContent.trim() && !e.ariaLabel)"
        ".map(e => e.id)"
    )
    assert unlabelled == []
    key = page.find_element(By.ID, "api-key")
    key.click()
    order = []
    for _ in range(5):
        ActionChains(page).send_keys(Keys.TAB).perform()  # to the page (a file input takes keys as paths)
        order.append(page.switch_to.active_element.get_attribute("id"))
    assert order == ["forget-key", "file", "pages", "as-job", "submit"]
    # Enter in a field submits; without a file the page says so and puts the focus on the file chooser.
    page.find_element(By.ID, "pages").send_keys(Keys.ENTER)
    assert shown_error(page)["title"] == "No file chosen"
    assert page.switch_to.active_element.get_attribute("id") == "file"


def test_narrow_window_puts_the_text_under_the_image(page, server: Server, invoice):
    size = page.get_window_size()
    page.set_window_size(420, 900)
    try:
        submit(page, server.key, invoice[0])
        [article] = results(page, 1)
        img = article.find_element(By.TAG_NAME, "img").rect
        text = article.find_element(By.CSS_SELECTOR, "pre.text").rect
        assert text["y"] >= img["y"] + img["height"]
        assert page.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    finally:
        page.set_window_size(size["width"], size["height"])
