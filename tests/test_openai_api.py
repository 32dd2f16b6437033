"""POST /v1/chat/completions and GET /v1/models (ocr_app/http/routes/openai.py), driven by OpenAI's own Python
client as LightOnOCR's instructions use it against vLLM's server: a page image in a chat message, its Markdown
back, plain and streamed; errors as the client's exception classes.

Two servers: the session's (the real rapidocr engine: text read back) and one of this module with the
stand-in engine of tests/stall_engine.py (answers the self-test text; wedged for the deadline), a small
max_upload_bytes, and names resolved from a file (STALL_HOSTS): `docs.internal` is 127.0.0.1, opened by
job_url_allowed_hosts, the documents served by an HTTP server of this test on loopback; `private.example` is
10.1.2.3, refused before any connection.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import jiwer
import openai
import pytest

from ocr_app.engines.base import SELF_TEST_TEXT

from .docs import TEXTS, encode, render
from .readme import run_chat_snippet
from .server import Server, StallServer

HERE = Path(__file__).parent
MODEL = "lightonai/LightOnOCR-2-1B"
SMALL_UPLOAD = 100_000
PAGE_BREAK = "\n\n---\n\n"


def client(srv: Server, key: str | None = None) -> openai.OpenAI:
    # No retries: a 5xx is the test's answer, not something to send again.
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key=key or srv.key, max_retries=0, timeout=120)


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def page(*urls: str, prompt: str = "Read this page.") -> list[dict]:
    parts: list[dict] = [{"type": "text", "text": prompt}]
    parts += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": parts}]


def plain(markdown: str) -> str:
    """The Markdown's text: escapes dropped, whitespace collapsed, case folded."""
    return "".join(markdown.replace("\\", "").split()).lower()


def cer(expected: str, got: str) -> float:
    return jiwer.cer(plain(expected), plain(got))


@pytest.fixture(scope="module")
def png() -> bytes:
    return encode(render(TEXTS["en"][:2], size=32, width=1000).image, "PNG")


@pytest.fixture(scope="module")
def answer(server, png):
    """One plain answer of the session's server, with its HTTP response."""
    raw = client(server).chat.completions.with_raw_response.create(model=MODEL, messages=page(data_url(png)))
    return raw.parse(), raw


class Documents:
    """/page.png: a page; every other path 404."""

    def __init__(self, png: bytes):
        self.gets = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                found = self.path == "/page.png"
                outer.gets += found
                body = png if found else b"no"
                self.send_response(200 if found else 404)
                self.send_header("Content-Type", "image/png" if found else "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def docs(png):
    d = Documents(png)
    yield d
    d.httpd.shutdown()


@pytest.fixture(scope="module")
def control(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("chat-control")


@pytest.fixture(scope="module")
def stall(tmp_path_factory, control):
    hosts = tmp_path_factory.mktemp("chat-hosts") / "hosts.json"
    hosts.write_text(json.dumps({"docs.internal": ["127.0.0.1"], "private.example": ["10.1.2.3"]}))
    s = StallServer(
        tmp_path_factory.mktemp("chat"),
        engine="rapidocr",
        request_timeout_s=3,
        max_upload_bytes=SMALL_UPLOAD,
        job_url_allowed_hosts=["docs.internal"],
        openai_model_name="ocr-test",
    ).start(env={"STALL_CONTROL": str(control), "STALL_HOSTS": str(hosts)})
    yield s
    assert s.stop() == 0, s.logs()[-2000:]


# --- the session's server: the real engine --------------------------------------------------------------


def test_models_lists_the_served_model_with_its_engine(server):
    models = list(client(server).models.list())
    assert [m.id for m in models] == [MODEL]
    assert models[0].owned_by == "ocrfleet-rapidocr"
    assert models[0].model_extra["engine"] == "rapidocr"


def test_a_data_url_image_is_read_back_as_markdown(server, answer):
    completion, raw = answer
    [choice] = completion.choices
    assert choice.message.role == "assistant" and choice.finish_reason == "stop"
    assert cer("\n".join(TEXTS["en"][:2]), choice.message.content) < 0.05, choice.message.content
    assert completion.model == MODEL and completion.object == "chat.completion"
    assert completion.usage is not None and completion.usage.total_tokens == 0
    rid = raw.headers["x-request-id"]
    assert completion.id == f"chatcmpl-{rid}"
    # The access log names the route and the request id, as /v1/ocr's does.
    [line] = server.log_records(
        lambda r: r.get("request_id") == rid and r.get("route") == "/v1/chat/completions"
    )
    assert line["status"] == 200 and line["pages"] == 1 and line["caller"] == "tests"


def test_streamed_chunks_join_to_the_plain_answer(server, png, answer):
    chunks = list(
        client(server).chat.completions.create(model=MODEL, messages=page(data_url(png)), stream=True)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["stop"]
    assert len(chunks) >= 4  # role, a chunk per line (two lines here), the finish
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == answer[0].choices[0].message.content


def test_images_of_a_message_are_read_in_order(server):
    first, second = (encode(render([t], size=32, width=900).image, "PNG") for t in TEXTS["en"][2:4])
    out = client(server).chat.completions.create(
        model=MODEL, messages=page(data_url(second), data_url(first))
    )
    got = out.choices[0].message.content.split(PAGE_BREAK)
    assert len(got) == 2, got
    assert cer(TEXTS["en"][3], got[0]) < 0.1 and cer(TEXTS["en"][2], got[1]) < 0.1, got


def test_the_request_is_counted_in_the_request_metrics(server, png):
    before = server.metrics()
    with pytest.raises(openai.BadRequestError):  # refused before any work: counted all the same
        client(server).chat.completions.create(model=MODEL, messages=page(data_url(png)), n=2)
    after = server.metrics()
    for series in ('ocr_chat_requests_total{code="400"}', 'ocr_requests_total{code="400"}'):
        assert after.get(series, 0) - before.get(series, 0) == 1, series


def test_a_bad_key_is_an_authentication_error(server, png):
    with pytest.raises(openai.AuthenticationError) as err:
        client(server, key="ocr_wrong").chat.completions.create(model=MODEL, messages=page(data_url(png)))
    assert err.value.status_code == 401
    assert err.value.type == "authentication_error" and err.value.code == "unauthorized"
    with pytest.raises(openai.AuthenticationError):
        client(server, key="ocr_wrong").models.list()


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("n", 2),
        ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
        ("logprobs", True),
        ("response_format", {"type": "json_object"}),
    ],
)
def test_an_unsupported_option_is_a_400_naming_it(server, png, option, value):
    with pytest.raises(openai.BadRequestError) as err:
        client(server).chat.completions.create(model=MODEL, messages=page(data_url(png)), **{option: value})
    assert err.value.status_code == 400 and err.value.code == "unsupported_option"
    assert err.value.param == option and option in err.value.message
    assert err.value.type == "invalid_request_error"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": -0.1}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 10**6}, "max_tokens"),
        ({"stream": "yes"}, "stream"),
        ({"messages": [{"role": "user", "content": "no image"}]}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": page("data:image/png;base64,@@@")}, "image_url"),
        ({"messages": page("data:image/png,plain")}, "image_url"),
    ],
)
def test_invalid_fields_are_a_400_naming_the_field(server, png, body, param):
    request = {"model": MODEL, "messages": page(data_url(png)), **body}
    with server.client() as c:
        r = c.post("/v1/chat/completions", json=request)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert err["request_id"] == r.headers["x-request-id"]


def test_sampling_options_within_bounds_are_taken(server, png, answer):
    out = client(server).chat.completions.create(
        model="any-name", messages=page(data_url(png)), temperature=0.0, top_p=1.0, max_tokens=100
    )
    assert out.choices[0].message.content == answer[0].choices[0].message.content


def test_a_body_that_is_not_json_is_a_400_and_not_json_typed_a_415(server):
    with server.client() as c:
        for body in (b"{", b"[" * 100_000, b"[]"):  # not JSON, nested past the parser, not an object
            r = c.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == 400 and r.json()["error"]["param"] == "body", (body[:5], r.text)
        r = c.post("/v1/chat/completions", content=b"{}", headers={"Content-Type": "text/plain"})
        assert r.status_code == 415 and r.json()["error"]["type"] == "invalid_request_error"


# --- the stand-in engine: URLs, limits, the deadline ----------------------------------------------------


def test_an_http_image_is_fetched_through_the_guard(stall, docs):
    before = docs.gets
    out = client(stall).chat.completions.create(
        model="ocr-test", messages=page(f"http://docs.internal:{docs.port}/page.png")
    )
    assert out.choices[0].message.content == SELF_TEST_TEXT and out.model == "ocr-test"
    assert [m.id for m in client(stall).models.list()] == ["ocr-test"]  # openai_model_name
    assert docs.gets == before + 1


@pytest.mark.parametrize(
    ("host", "code"), [("private.example", "url_private"), ("127.0.0.1", "url_loopback")]
)
def test_an_image_url_to_a_refused_address_is_a_400(stall, docs, host, code):
    before = docs.gets
    with pytest.raises(openai.BadRequestError) as err:
        client(stall).chat.completions.create(model="x", messages=page(f"http://{host}:{docs.port}/page.png"))
    assert err.value.code == code and "job_url_allowed_hosts" in err.value.message
    assert docs.gets == before  # refused before any connection


def test_an_image_url_that_is_not_there_says_so(stall, docs):
    with pytest.raises(openai.BadRequestError) as err:
        client(stall).chat.completions.create(
            model="x", messages=page(f"http://docs.internal:{docs.port}/missing.png")
        )
    assert err.value.code == "url_fetch_failed"


def test_an_image_over_max_upload_bytes_is_a_413(stall):
    # Decoded: one byte over the limit; the body: within its own.
    big = data_url(b"\x89PNG" + b"\0" * (SMALL_UPLOAD - 3))
    with pytest.raises(openai.APIStatusError) as err:
        client(stall).chat.completions.create(model="x", messages=page(big))
    assert err.value.status_code == 413 and err.value.code == "payload_too_large"
    # Two such images: the body itself is over its limit (max_upload_bytes in base64, and the JSON).
    with pytest.raises(openai.APIStatusError) as err:
        client(stall).chat.completions.create(model="x", messages=page(big, big))
    assert err.value.status_code == 413 and err.value.code == "payload_too_large"


def test_a_request_past_its_deadline_is_a_504(stall, control, png):
    small = encode(render(["x"], size=20, width=200).image, "PNG")
    (control / "wedge").touch()
    try:
        with pytest.raises(openai.InternalServerError) as err:
            client(stall).chat.completions.create(model="x", messages=page(data_url(small)), stream=True)
    finally:
        (control / "wedge").unlink()
    assert err.value.status_code == 504 and err.value.code == "timeout"
    assert err.value.type == "server_error"
    # The instance serves again once the engine does.
    out = client(stall).chat.completions.create(model="x", messages=page(data_url(small)))
    assert out.choices[0].message.content == SELF_TEST_TEXT


def test_a_client_that_leaves_stops_its_work_and_is_counted_499(stall, control):
    small = encode(render(["x"], size=20, width=200).image, "PNG")
    body = json.dumps({"model": "x", "messages": page(data_url(small))}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {stall.key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    gone = 'ocr_chat_requests_total{code="499"}'
    before = stall.metrics().get(gone, 0)
    (control / "wedge").touch()
    try:
        with socket.create_connection(("127.0.0.1", stall.port), timeout=30) as sock:
            sock.sendall(head + body)
            stall.wait_until(lambda h: h["inflight"] == 1)  # in the engine, which finishes nothing
        stall.wait_until(lambda h: h["inflight"] == 0)
    finally:
        (control / "wedge").unlink()
    # Stopped because the client left (499), not at the deadline (504).
    assert stall.metrics().get(gone, 0) - before == 1


def test_a_streamed_answer_asks_for_its_usage(stall, png):
    small = encode(render(["x"], size=20, width=200).image, "PNG")
    chunks = list(
        client(stall).chat.completions.create(
            model="x", messages=page(data_url(small)), stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == SELF_TEST_TEXT


def test_errors_of_other_routes_carry_the_openai_type(server):
    r = httpx.get(f"{server.url}/v1/models", timeout=10)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    with server.client() as c:
        r = c.get("/v1/nowhere")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


# --- stream: true as a generative engine writes the page (tests/stall_engine.py's `stream`) -----------------


@pytest.fixture
def writes(control):
    """Makes the stand-in engine write each page as `pieces` and read it as `lines`."""

    def write(pieces: list[str], lines: list[str]) -> None:
        (control / "stream").write_text(json.dumps({"pieces": pieces, "lines": lines}))

    yield write
    for name in ("stream", "wedge_streamed"):
        (control / name).unlink(missing_ok=True)


def streamed(srv: Server, *urls: str) -> list:
    return list(client(srv).chat.completions.create(model="x", messages=page(*urls), stream=True))


WRITTEN = ["Alpha ", "beta", " gamma"]


def test_a_page_streams_as_the_engine_writes_it_and_pages_in_order(stall, png, writes):
    # What the engine writes goes out a piece at a time, as written; what the read page adds to it follows;
    # the next image's page starts with the page break. Two images of one request, in their order.
    writes(WRITTEN, ["Alpha beta gamma delta"])
    small = data_url(encode(render(["x"], size=24, width=200).image, "PNG"))
    chunks = streamed(stall, small, small)
    deltas = [c.choices[0].delta.content for c in chunks[1:-1]]
    assert deltas == [*WRITTEN, " delta", PAGE_BREAK + WRITTEN[0], *WRITTEN[1:], " delta"]
    last = chunks[-1]
    assert last.choices[0].finish_reason == "stop"
    assert "ocr_pages_not_as_streamed" not in (last.model_extra or {})
    plain_answer = client(stall).chat.completions.create(model="x", messages=page(small, small))
    assert "".join(deltas) == plain_answer.choices[0].message.content


def test_a_page_read_otherwise_than_streamed_gets_nothing_more_and_is_named(stall, png, writes):
    # As the vllm engine's page whose first attempt was degenerate and whose re-run reads otherwise: what was
    # sent stands, nothing contradicts it, and the last chunk names the page (1-based, across the images).
    small = data_url(encode(render(["x"], size=24, width=200).image, "PNG"))
    writes(WRITTEN, ["Alpha beta GAMMA delta"])
    chunks = streamed(stall, small, small)
    deltas = [c.choices[0].delta.content for c in chunks[1:-1]]
    assert deltas == [*WRITTEN, PAGE_BREAK + WRITTEN[0], *WRITTEN[1:]]
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].model_extra["ocr_pages_not_as_streamed"] == [1, 2]


def test_an_error_after_the_text_began_is_the_streams_last_event(stall, control, png, writes):
    # The status went with the first piece: the deadline that falls later is an error event, which OpenAI's
    # client raises with its code, after the pieces already sent.
    small = data_url(encode(render(["x"], size=24, width=200).image, "PNG"))
    writes(WRITTEN[:2], ["Alpha beta"])
    (control / "wedge_streamed").touch()
    got: list = []

    def read() -> None:
        for c in client(stall).chat.completions.create(model="x", messages=page(small), stream=True):
            got.append(c.choices[0].delta.content)

    with pytest.raises(openai.APIError) as err:
        read()
    assert got == ["", *WRITTEN[:2]]
    assert err.value.code == "timeout" and err.value.body["request_id"]
    (control / "wedge_streamed").unlink()
    assert client(stall).chat.completions.create(model="x", messages=page(small)).choices[0].message.content


def test_the_readmes_openai_snippet_works_as_written(server, tmp_path):
    # tests/readme.py runs README.md's block as it stands (the fleet test runs it through HAProxy and nginx):
    # the plain answer, then the streamed one, each printed whole and the same.
    import certifi  # a CA file the snippet can load; the server here is plain HTTP

    doc = render(TEXTS["en"][:2], size=32, width=1000)
    out = run_chat_snippet(server.url, server.key, Path(certifi.where()), encode(doc.image, "PNG"), tmp_path)
    plain_answer, streamed_answer = out[: len(out) // 2], out[len(out) // 2 :]
    assert plain_answer == streamed_answer and plain_answer.endswith("\n")
    assert cer(doc.text, plain_answer) < 0.05, plain_answer
