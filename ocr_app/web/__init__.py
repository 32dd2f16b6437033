"""The web page at `/`: plain HTML, CSS and JS shipped inside the package, served with strict headers.

The page itself is public; the key it asks for is kept in the tab's sessionStorage and sent only with its
own `POST /v1/ocr` calls. No CDN, no build step: the files below are what the browser runs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.resources import files

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException

# name -> media type; served at /web/<name> (index.html at /).
_ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
INDEX = "index.html"

# Scripts and styles from these files only (no inline code, no eval); images from here or the data URLs
# of page previews; fetch() to this origin only; never framed.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'none'; base-uri 'none'; frame-ancestors 'none'"
)
_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
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


def load_assets() -> dict[str, Asset]:
    here = files(__name__)
    out = {}
    for name, media_type in _ASSETS.items():
        body = here.joinpath(name).read_bytes()
        out[name] = Asset(body, media_type, f'"{hashlib.sha256(body).hexdigest()[:32]}"')
    return out


def _matches(if_none_match: str, etag: str) -> bool:
    tags = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
    return "*" in tags or etag in tags


def router() -> APIRouter:
    """`GET /` and `GET /web/<file>`; the files are read once, here, and served from memory."""
    assets = load_assets()
    r = APIRouter(include_in_schema=False)

    def serve(request: Request, asset: Asset) -> Response:
        headers = {**_HEADERS, "ETag": asset.etag}
        if _matches(request.headers.get("if-none-match", ""), asset.etag):
            return Response(status_code=304, headers=headers)
        return Response(asset.body, media_type=asset.media_type, headers=headers)

    @r.get("/")
    async def index(request: Request) -> Response:
        return serve(request, assets[INDEX])

    @r.get("/web/{name}")
    async def web_file(request: Request, name: str) -> Response:
        if name == INDEX or name not in assets:
            raise HTTPException(404, "Not Found")
        return serve(request, assets[name])

    return r
