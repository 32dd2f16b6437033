"""The page's files as HTTP serves them: public, strict headers, cached with revalidation (make test-app)."""

from __future__ import annotations

import fnmatch
import http.client
import json
import re
import tomllib
from importlib.resources import files
from pathlib import Path

import httpx
import pytest

from ..server import Server

WEB = files("ocr_app.web")
ASSETS = {
    "/": "text/html; charset=utf-8",
    "/web/app.js": "text/javascript; charset=utf-8",
    "/web/style.css": "text/css; charset=utf-8",
    "/web/favicon.svg": "image/svg+xml",
    "/docs": "text/html; charset=utf-8",
    "/redoc": "text/html; charset=utf-8",
    "/web/docs.js": "text/javascript; charset=utf-8",
    "/web/redoc-init.js": "text/javascript; charset=utf-8",
    "/web/swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "/web/swagger-ui.css": "text/css; charset=utf-8",
    "/web/redoc.standalone.js": "text/javascript; charset=utf-8",
}
# What each page loads: its own files from this app, nothing else.
PAGE_FILES = {
    "/": ["web/app.js", "web/style.css", "web/favicon.svg", "docs", "docs"],
    "/docs": ["web/docs.js", "web/swagger-ui-bundle.js", "web/swagger-ui.css", "web/favicon.svg"],
    "/redoc": ["web/redoc-init.js", "web/redoc.standalone.js", "web/favicon.svg"],
}


@pytest.mark.parametrize(("path", "ctype"), ASSETS.items())
def test_page_and_assets_are_public_with_strict_headers(server: Server, path, ctype):
    r = httpx.get(server.url + path)  # no key: the page is public, its API calls carry the key
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == ctype
    assert r.headers["x-content-type-options"] == "nosniff"
    csp = dict(d.strip().split(" ", 1) for d in r.headers["content-security-policy"].split(";"))
    assert csp["default-src"] == "'none'"
    assert csp["script-src"] == csp["connect-src"] == "'self'"
    assert csp["frame-ancestors"] == "'none'"
    # ReDoc's page alone needs inline styles (styled-components); nothing may run inline script.
    assert csp.pop("style-src") == ("'self' 'unsafe-inline'" if path == "/redoc" else "'self'")
    assert "unsafe" not in "; ".join(csp.values())
    assert r.headers["cache-control"] == "no-cache"
    # Revalidation: the same ETag answers 304 without a body.
    etag = r.headers["etag"]
    again = httpx.get(server.url + path, headers={"If-None-Match": f'W/"other", {etag}'})
    assert (again.status_code, again.content, again.headers["etag"]) == (304, b"", etag)


@pytest.mark.parametrize(("path", "loads"), PAGE_FILES.items())
def test_pages_load_only_their_own_files(server: Server, path, loads):
    html = httpx.get(server.url + path).text
    assert sorted(re.findall(r'(?:src|href)="([^"]+)"', html)) == sorted(loads)
    assert "<script>" not in html and " style=" not in html  # nothing inline: the CSP would block it
    for ref in loads:
        assert httpx.get(f"{server.url}/{ref}").status_code == 200, ref


@pytest.mark.parametrize(
    "name", ["index.html", "app.js", "style.css", "docs.html", "docs.js", "redoc.html", "redoc-init.js"]
)
def test_works_offline_and_keeps_the_key_out_of_persistent_storage(name):
    text = WEB.joinpath(name).read_text().replace('"http://www.w3.org/2000/svg"', "")  # a name, not a URL
    assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.I), "no CDN or remote resource"
    if name == "app.js":
        assert "sessionStorage" in text
        assert "localStorage" not in text and "document.cookie" not in text
        assert "innerHTML" not in text  # API data goes in as text only


@pytest.mark.parametrize(
    "path",
    [
        *("/web/index.html", "/web/nope.js", "/index.html"),
        *("/web/../cli.py", "/web/..%2fcli.py", "/web/%2e%2e/cli.py"),  # traversal, sent as written
    ],
)
def test_other_paths_are_json_404(server: Server, path):
    # http.client sends the path as written (httpx would resolve the dot segments before sending).
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        status, body = r.status, r.read()
    finally:
        conn.close()
    assert status == 404, body[:120]
    assert json.loads(body)["error"]["code"] == "not_found"


def test_page_is_not_in_the_api_schema(server: Server):
    paths = httpx.get(server.url + "/openapi.json").json()["paths"]
    assert not {"/", "/docs", "/redoc"} & set(paths) and not any(p.startswith("/web") for p in paths)


def test_wheel_ships_every_web_file():
    # The hosts install the app from a wheel: a file that pyproject's package-data misses is a broken page.
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["ocr_app.web"]
    shipped = [p.name for p in WEB.iterdir() if p.is_file() and not p.name.endswith((".py", ".pyc"))]
    assert shipped
    for name in shipped:
        assert any(fnmatch.fnmatch(name, g) for g in globs), f"{name} is not in package-data"
