"""Every error the contract names: status, code, JSON body with the request id, and nothing lost."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
from PIL import Image

from ocr_app.config import Settings

from .docs import TEXTS, encode, pdf, png_bomb, render


def assert_error(r: httpx.Response, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert set(err) == {"code", "message", "request_id", "type"}
    assert err["code"] == code and err["message"]
    # OpenAI's error class for the status, beside our code (ocr_app/http/errors.py).
    kinds = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}
    assert err["type"] == kinds.get(status, "server_error" if status >= 500 else "invalid_request_error")
    assert err["request_id"] == r.headers["x-request-id"]
    return err


@pytest.fixture(scope="module")
def png() -> bytes:
    return encode(render(TEXTS["en"][:1]).image, "PNG")


def test_missing_key_is_401_with_challenge(server, png):
    r = server.ocr(png, "image/png", key=None)
    assert_error(r, 401, "unauthorized")
    assert r.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize("headers", [{"Authorization": "Bearer wrong"}, {"X-API-Key": "ocr_nope"}])
def test_wrong_key_is_401(server, png, headers):
    r = server.ocr(png, "image/png", key=None, headers=headers)
    assert_error(r, 401, "unauthorized")


def test_x_api_key_header_is_accepted(server, png):
    r = server.ocr(png, "image/png", key=None, headers={"X-API-Key": server.key})
    assert r.status_code == 200


@pytest.mark.parametrize(
    ("data", "ctype"),
    [
        (b"\x89PNG\r\n\x1a\nthis is not a png", "image/png"),
        (b"not an image at all", "image/jpeg"),
        (b"", "image/png"),
        (b"%PDF-1.7\nbroken", "application/pdf"),
    ],
)
def test_undecodable_is_400(server, data, ctype):
    assert_error(server.ocr(data, ctype), 400, "invalid_image")


def test_truncated_image_is_400(server):
    data = encode(render(TEXTS["en"]).image, "JPEG", quality=90)
    assert_error(server.ocr(data[: len(data) // 2], "image/jpeg"), 400, "invalid_image")
    png = encode(render(TEXTS["en"]).image, "PNG")
    assert_error(server.ocr(png[: len(png) // 2], "image/png"), 400, "invalid_image")


def test_unsupported_media_type_is_415(server):
    assert_error(server.ocr(b"hello", "text/plain"), 415, "unsupported_media_type")
    assert_error(server.ocr(b"GIF89a....", "image/gif"), 415, "unsupported_media_type")
    with server.client() as c:
        r = c.post("/v1/ocr", files={"file": ("a.txt", b"plain words", "text/plain")})
    assert_error(r, 415, "unsupported_media_type")


@pytest.mark.parametrize("pages", ["x", "0", "3-1", "1-", "1,,2", "-1"])
def test_bad_page_selection_is_422(server, pages):
    data = pdf([render(["one"]).image])
    assert_error(server.ocr(data, "application/pdf", params={"pages": pages}), 422, "invalid_parameter")


def test_page_out_of_range_is_422(server):
    data = pdf([render(["one"]).image])
    err = assert_error(server.ocr(data, "application/pdf", params={"pages": "2"}), 422, "invalid_parameter")
    assert "out of range" in err["message"]


def test_multipart_without_file_field_is_422(server):
    with server.client() as c:
        r = c.post("/v1/ocr", files={"document": ("a.png", b"x", "image/png")})
    assert_error(r, 422, "invalid_parameter")


def test_too_many_pages_is_413(server):
    page = render(["p"], size=20, width=200).image
    data = pdf([page] * 51)  # max_pages defaults to 50
    assert_error(server.ocr(data, "application/pdf"), 413, "too_many_pages")
    assert_error(server.ocr(data, "application/pdf", params={"pages": "1-51"}), 413, "too_many_pages")
    assert server.ocr(data, "application/pdf", params={"pages": "50-51"}).status_code == 200


def _rss_peak_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_png_bomb_is_refused_from_its_header(server):
    bomb = png_bomb(40_000, 40_000)
    assert len(bomb) < 400_000
    before = _rss_peak_kb(server.proc.pid)
    err = assert_error(server.ocr(bomb, "image/png"), 413, "image_too_large")
    assert "40000x40000" in err["message"]
    # Decoding it would need 1.6 GB; refusing it from the header needs next to nothing.
    assert _rss_peak_kb(server.proc.pid) - before < 64 * 1024


def test_too_many_pixels_is_413_for_each_format(server):
    big = Image.new("1", (8000, 7000), 1)  # 56 MP > 50 MP, 7 MB as a 1-bit BMP
    for fmt, ctype in (("PNG", "image/png"), ("TIFF", "image/tiff"), ("BMP", "image/bmp")):
        assert_error(server.ocr(encode(big, fmt), ctype), 413, "image_too_large")


def test_declared_oversize_body_is_refused_before_it_is_read(server):
    # Announce one byte over the limit, send 1 KiB, read the answer: the server must not wait for the rest.
    over = Settings.model_fields["max_upload_bytes"].default + 1
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(
            (
                f"POST /v1/ocr HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.key}\r\n"
                f"Content-Type: image/png\r\nContent-Length: {over}\r\n\r\n"
            ).encode()
            + b"\0" * 1024
        )
        # The head and the body may come in separate segments: read until the JSON body is complete.
        answer = b""
        while not answer.rstrip().endswith(b"}") and (chunk := s.recv(65536)):
            answer += chunk
    head = answer.decode("latin-1")
    assert head.startswith("HTTP/1.1 413"), head
    assert "payload_too_large" in head


def test_chunked_oversize_body_is_cut_off(server):
    def chunks():
        for _ in range(22):
            yield b"\0" * (1024 * 1024)

    with server.client() as c:
        r = c.post("/v1/ocr", content=chunks(), headers={"Content-Type": "image/png"})
    assert_error(r, 413, "payload_too_large")


def test_a_body_at_the_upload_limit_is_read_and_one_byte_more_is_413(server):
    # The shared server runs with the default max_upload_bytes: a PNG padded with zeros after its end (a
    # decoder stops at IEND) to exactly the limit is read; one byte more is refused, whether the length is
    # declared (Content-Length) or counted as a chunked body is read.
    limit = Settings.model_fields["max_upload_bytes"].default
    png = encode(render(["Harbour"], size=24, width=300).image, "PNG")
    at = png + b"\0" * (limit - len(png))

    def chunked(data: bytes):
        for i in range(0, len(data), 1 << 20):
            yield data[i : i + (1 << 20)]

    assert server.ocr(at, "image/png").status_code == 200
    assert_error(server.ocr(at + b"\0", "image/png"), 413, "payload_too_large")
    with server.client() as c:
        r = c.post("/v1/ocr", content=chunked(at), headers={"Content-Type": "image/png"})
        assert r.status_code == 200, r.text
        r = c.post("/v1/ocr", content=chunked(at + b"\0"), headers={"Content-Type": "image/png"})
        assert_error(r, 413, "payload_too_large")


def test_unknown_route_and_method_are_json(server):
    assert_error(httpx.get(server.url + "/v2/nothing"), 404, "not_found")
    assert_error(httpx.get(server.url + "/v1/ocr"), 405, "method_not_allowed")


def test_errors_lose_nothing_the_next_request_succeeds(server, png):
    for bad in (b"", b"junk"):
        server.ocr(bad, "image/png")
    assert server.ocr(png, "image/png").status_code == 200
    assert server.health().json()["inflight"] == 0
