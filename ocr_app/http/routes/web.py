"""The web page at `/` and the API docs at `/docs` and `/redoc`: files shipped inside the packages, served
with strict headers.

The page itself is public; the key it asks for is kept in the tab's sessionStorage and sent only with its
own `POST /v1/ocr` calls (and, for a bulk job, its `/v1/jobs` calls: fetch() reads the job's event stream,
as EventSource cannot send the key). No CDN, no build step: the files below are what the browser runs.
Swagger UI's and ReDoc's bundles come from the pinned `fastapi-offline` wheel (FastAPI's own docs pages
load them from a CDN, which hosts without internet cannot reach and which would run a third party's script
on the origin whose sessionStorage holds the key); the pages that start them are ours, with no inline
script.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib.resources import files

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException

WEB_PACKAGE = "ocr_app.web"  # the files' package
_HTML, _JS, _CSS = "text/html; charset=utf-8", "text/javascript; charset=utf-8", "text/css; charset=utf-8"
# name -> media type (files of WEB_PACKAGE); served at /web/<name>, the pages (PAGES) at their own paths.
_ASSETS = {
    "index.html": _HTML,
    "docs.html": _HTML,
    "redoc.html": _HTML,
    "app.js": _JS,
    "docs.js": _JS,
    "redoc-init.js": _JS,
    "style.css": _CSS,
    "favicon.svg": "image/svg+xml",
}
# The docs' bundles, read from the fastapi-offline package.
_DOCS_ASSETS = {
    "swagger-ui-bundle.js": _JS,
    "swagger-ui.css": _CSS,
    "redoc.standalone.js": _JS,
}
PAGES = {"/": "index.html", "/docs": "docs.html", "/redoc": "redoc.html"}

# Scripts and styles from these files only (no inline code, no eval); images from here or the data URLs
# of page previews (and Swagger UI's icons); fetch() to this origin only; never framed. ReDoc runs its
# search index in a worker it creates from a blob: URL.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "worker-src blob:; form-action 'none'; base-uri 'none'; frame-ancestors 'none'"
)
# ReDoc (styled-components) cannot render without inline <style> elements: that page alone allows inline
# styles. Scripts stay 'self' only, and the page shows nothing but this app's own OpenAPI document.
REDOC_CONTENT_SECURITY_POLICY = CONTENT_SECURITY_POLICY.replace(
    "style-src 'self';", "style-src 'self' 'unsafe-inline';"
)
_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    # The URLs are not versioned: a browser may keep a copy but asks (If-None-Match -> 304) before using
    # it, so an upgraded app never runs with the previous release's script.
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    media_type: str
    etag: str
    csp: str = CONTENT_SECURITY_POLICY


def load_assets() -> dict[str, Asset]:
    out = {}
    for package, assets in ((WEB_PACKAGE, _ASSETS), ("fastapi_offline", _DOCS_ASSETS)):
        here = files(package) if package == WEB_PACKAGE else files(package).joinpath("static")
        for name, media_type in assets.items():
            body = here.joinpath(name).read_bytes()
            csp = REDOC_CONTENT_SECURITY_POLICY if name == "redoc.html" else CONTENT_SECURITY_POLICY
            out[name] = Asset(body, media_type, f'"{hashlib.sha256(body).hexdigest()[:32]}"', csp)
    return out


def _matches(if_none_match: str, etag: str) -> bool:
    tags = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
    return "*" in tags or etag in tags


def router() -> APIRouter:
    """The pages (`GET /`, `/docs`, `/redoc`) and `GET /web/<file>`; the files are read once, here, and
    served from memory."""
    assets = load_assets()
    r = APIRouter(include_in_schema=False)

    def serve(request: Request, asset: Asset) -> Response:
        headers = {**_HEADERS, "Content-Security-Policy": asset.csp, "ETag": asset.etag}
        if _matches(request.headers.get("if-none-match", ""), asset.etag):
            return Response(status_code=304, headers=headers)
        return Response(asset.body, media_type=asset.media_type, headers=headers)

    def page(asset: Asset) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return serve(request, asset)

        return endpoint

    for path, name in PAGES.items():
        r.add_api_route(path, page(assets[name]), methods=["GET"], name=f"page:{name}")

    @r.get("/web/{name}")
    async def web_file(request: Request, name: str) -> Response:
        if name in PAGES.values() or name not in assets:
            raise HTTPException(404, "Not Found")
        return serve(request, assets[name])

    return r
