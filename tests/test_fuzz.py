"""The whole API fuzzed from its own OpenAPI document (schemathesis, property-based): whatever a client with a
valid key sends, fitting the schema or not (random bodies of every declared content type, multipart, query
parameters, headers), the answer is never a 5xx and every error is the JSON error shape with the request's id.

Every operation of the document is fuzzed, the list read from the document itself (a new route is fuzzed
without a change here): `POST /v1/ocr` against the session's server and its real engine, every other one
against a server with a job database (PostgreSQL, as the other job tests) and tests/stall_engine.py's
instant engine. That server holds jobs of every kind before the fuzz starts (done, done with a failed page,
an image's, running and held so, cancelled, purged, another key's), and the `/v1/jobs/{job_id}` cases are
sent to those jobs and to the jobs the fuzz itself created as well as to generated ids, so they reach real
jobs, not only 404s. An event stream is read until it ends, or for EVENTS_BOUND_S once no event comes (the
running job's). The job server connects to loopback only (STALL_LOOPBACK_ONLY, STALL_HOSTS: no name
resolves), so a generated document or image URL never leaves the machine.

Schemathesis' strategies drive Hypothesis directly (its pytest plugin's lazy fixtures do not run on this
pytest); the test prints how many requests it sent to each operation, and the statuses it got.
"""

from __future__ import annotations

import base64
import re
from collections import Counter, defaultdict
from urllib.parse import urlsplit

import h11
import psycopg
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from ocr_app.jobs import schema

from . import hostile
from .docs import encode, render
from .server import Server, add_key
from .test_errors import assert_error
from .test_jobs import PDF_TYPE, StallServer, doc, make_server, submit, wait_status

MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
# Cases per operation and generation mode, where not EXAMPLES_EACH. /v1/ocr reads documents with the real
# engine: the most varied input of all.
EXAMPLES = {"POST /v1/ocr": 500}
EXAMPLES_EACH = 25
# The job held running answers an event stream that never ends: read for this long once no event comes.
EVENTS_BOUND_S = 2.0
# Chat requests whose options are generated around a real page (a generated image URL is never one).
CHAT_WITH_A_PAGE = 25
HOLD_WIDTH = 997  # tests/stall_engine.py's hold_width: a page this wide is held in the engine
UNROUTED = "192.0.2.0/24"  # TEST-NET-1 (RFC 5737): nowhere, should a connection ever be tried
JOB_OPERATION = "/v1/jobs/{job_id}"

SENT: Counter[str] = Counter()
STATUSES: defaultdict[str, Counter[int]] = defaultdict(Counter)
# uvicorn's own answer to bytes its parser refuses (plain text, before any app code runs).
UVICORN_REFUSAL = "Invalid HTTP request received."
FIELD_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # not field-vchar, SP or HTAB (RFC 9110, 5.5)
REFUSED: defaultdict[str, list[str]] = defaultdict(list)  # operation: why not_http finds those not HTTP/1.1


def call(case, server: Server, key: str, timeout: float | tuple[float, float] = 60):
    """Send the case with the key (what any client holding one can send), unless the case brings its own
    Authorization; record and check the answer."""
    r = case.call(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=timeout)
    label = case.operation.label
    SENT[label] += 1
    if r.status_code == 400 and r.text == UVICORN_REFUSAL:
        # Refused by the HTTP server (uvicorn's parser) before the app saw it; behind nginx, nginx refuses
        # it first, in JSON (the nginx_tls scenario, tests/edge_client.py errors). Only bytes that are not an
        # HTTP/1.1 request may get this.
        why = not_http(r.request)
        assert why, f"{label}: a valid request was refused as invalid HTTP:\n{raw_request(r.request)!r}"
        REFUSED[label].append(why)
        return r
    STATUSES[label][r.status_code] += 1
    assert r.status_code < 500, f"{label} answered {r.status_code}: {r.text[:500]}"
    if r.status_code >= 400:
        error = r.json()["error"]
        assert set(error) >= {"code", "message", "request_id"}, error
        assert [error["request_id"]] == r.headers["x-request-id"], (error, r.headers)  # a list per name
    return r


def raw_request(request: requests.PreparedRequest) -> bytes:
    """The request's bytes as requests (http.client) writes them: request line, headers (latin-1), body."""
    head = [f"{request.method} {request.path_url} HTTP/1.1", f"Host: {urlsplit(request.url).netloc}"]
    head += [f"{name}: {value}" for name, value in request.headers.items()]
    body = request.body or b""
    return "\r\n".join([*head, "", ""]).encode("latin-1") + (body.encode() if isinstance(body, str) else body)


def latin1(value: str | bytes) -> bytes:
    return value.encode("latin-1") if isinstance(value, str) else value


def not_http(request: requests.PreparedRequest) -> str | None:
    """Why the request is not HTTP/1.1; None when it is. A second reader (h11) checks the request line and
    the headers' grammar; h11 admits control characters in a header's value on purpose (its _abnf says why),
    which RFC 9110 (5.5: field-vchar = VCHAR / obs-text, with SP and HTAB between) does not: checked on top.
    The space or tab around a value is not part of it (OWS): stripped first."""
    headers = [(latin1(name), latin1(value).strip(b" \t")) for name, value in request.headers.items()]
    try:
        h11.Request(
            method=request.method or "",
            target=latin1(request.path_url),
            headers=[("Host", urlsplit(request.url).netloc), *headers],
        )
    except h11.LocalProtocolError as e:
        return str(e)
    for name, value in headers:
        if FIELD_CONTROL.search(value):
            return f"a control character in header {name!r}: {value!r}"
    return None


def modes(operation) -> tuple[GenerationMode, ...]:
    """A negative case needs something to break: a parameter, a body or the key (the probes take none)."""
    takes = (
        any(operation.iter_parameters()) or len(operation.body) or operation.definition.raw.get("security")
    )
    return MODES if takes else (GenerationMode.POSITIVE,)


def fuzz(strategy, label: str, send, examples: int | None = None) -> None:
    @given(case=strategy)
    @settings(
        max_examples=examples or EXAMPLES.get(label, EXAMPLES_EACH),
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    def one(case):
        send(case)

    one()


@pytest.fixture(scope="module")
def api_schema(server):
    return schemathesis.openapi.from_url(f"{server.url}/openapi.json")


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
def test_no_document_gets_a_server_error_or_a_bare_error(api_schema, server, mode):
    operation = api_schema["/v1/ocr"]["POST"]
    fuzz(operation.as_strategy(generation_mode=mode), operation.label, lambda c: call(c, server, server.key))


@pytest.mark.parametrize(
    ("value", "refused"),
    [
        ("a\x00b", True),
        ("a\x01b", True),
        ("a\x1fb", True),
        ("a\x7fb", True),
        ("a\tb", False),
        ("\xe9", False),
        ("Bearer ", False),
    ],
    ids=["NUL", "SOH", "US", "DEL", "HTAB", "obs-text", "trailing-SP"],
)
def test_the_http_server_refuses_what_not_http_calls_not_http(server, value, refused):
    """The fuzz accepts uvicorn's plain-text refusal only for a request not_http finds invalid: both agree."""
    sent = requests.Request("GET", f"{server.url}/livez", headers={"X-Probe": value}).prepare()
    with requests.Session() as session:
        r = session.send(sent, timeout=30)
    assert (r.status_code == 400 and r.text == UVICORN_REFUSAL) == refused, (r.status_code, r.text[:200])
    assert (not_http(sent) is not None) == refused, not_http(sent)


def seed_jobs(srv: Server) -> dict[str, str]:
    """A job of each kind the job routes answer differently for, by name: its id."""
    other_key = add_key(srv.keys_file, "other")
    held = encode(render(["Held 7"], width=HOLD_WIDTH).image, "PNG")
    image = encode(render(["Image 7"], width=500).image, "PNG")

    def new(key: str, data: bytes, ctype: str = PDF_TYPE) -> str:
        with srv.client(key) as c:
            r = submit(c, data, headers={"Content-Type": ctype})
        assert r.status_code == 202, r.text
        return r.json()["job_id"]

    jobs = {
        "done": new(srv.key, doc(2, "fuzz")),
        "page_failed": new(srv.key, hostile.pdf_count_lies(2)),  # page 2 is not there: a page error
        "image": new(srv.key, image, "image/png"),
        "running": new(srv.key, held, "image/png"),
        "cancelled": new(srv.key, held, "image/png"),
        "purged": new(srv.key, doc(1, "purged")),
        "another_keys": new(other_key, doc(1, "other")),
    }
    with srv.client() as c:
        for name in ("done", "page_failed", "image"):
            assert wait_status(c, jobs[name], lambda b: b["status"] == "done")["pages"]["total"] >= 1
        assert c.delete(f"/v1/jobs/{jobs['cancelled']}").json()["status"] == "cancelled"
        assert c.delete(f"/v1/jobs/{jobs['purged']}", params={"purge": "true"}).status_code == 204
        wait_status(c, jobs["running"], lambda b: b["status"] == "running")
        failed = c.get(f"/v1/jobs/{jobs['page_failed']}").json()["pages"]
        assert failed == {"total": 2, "done": 1, "failed": 1}, failed
    return jobs


@pytest.fixture(scope="module")
def job_server(tmp_path_factory, postgres):
    srv = make_server(
        StallServer,
        tmp_path_factory,
        postgres,
        "fuzz",
        upgrade=False,  # here, not by `ocr-app db upgrade`: seconds of start-up saved
        engine="rapidocr",
        max_concurrency=4,
        max_jobs_in_flight=10_000,  # the fuzz's own jobs never meet the per-key limit
        job_yield_s=0,
        job_url_allowed_hosts=[UNROUTED],  # the guard lets it through: STALL_LOOPBACK_ONLY must stop it
    )
    with psycopg.connect(srv.config["database_url"], autocommit=True) as conn:
        schema.upgrade(conn)
    srv.control = tmp_path_factory.mktemp("fuzz-control")
    (srv.control / "hold_width").write_text(str(HOLD_WIDTH))
    hosts = srv.control / "hosts.json"
    hosts.write_text("{}")
    srv.start(env={"STALL_CONTROL": str(srv.control), "STALL_HOSTS": str(hosts), "STALL_LOOPBACK_ONLY": "1"})
    srv.jobs = seed_jobs(srv)
    yield srv
    (srv.control / "hold_width").unlink()  # the held pages end, so the server can stop
    assert srv.stop() == 0, srv.logs()[-2000:]


def test_the_job_server_reaches_nothing_but_loopback(job_server):
    """What the fuzz generates may name a public address, which the guard lets through: the connection to it
    fails in the server, before any socket is opened."""
    with job_server.client() as c:
        r = c.post("/v1/jobs", json={"url": "http://192.0.2.1/a.pdf"})
    assert_error(r, 400, "url_fetch_failed")
    assert "only loopback is reached here" in r.json()["error"]["message"], r.text


@pytest.fixture(scope="module")
def job_schema(job_server):
    return schemathesis.openapi.from_url(f"{job_server.url}/openapi.json")


def operations(api) -> list:
    """Every operation of the document, submissions first (their jobs join the ids the others are sent to),
    deletions last (they purge jobs the others would read)."""
    ops = [result.ok() for result in api.get_all_operations()]
    return sorted(ops, key=lambda op: (op.method.upper() == "DELETE", op.method.upper() != "POST", op.label))


def test_no_input_to_any_other_operation_gets_a_server_error_or_a_bare_error(job_schema, job_server):
    srv = job_server
    held = srv.jobs["running"]
    created: list[str] = []  # the jobs the fuzz submitted
    held_streams: list[bytes] = []

    def send(case) -> None:
        label = case.operation.label
        stream = label.endswith("/events")
        if stream and case.path_parameters["job_id"] == held:
            r = call(case, srv, srv.key, timeout=(60, EVENTS_BOUND_S))
            held_streams.append(r.content if r.status_code == 200 else b"")
            return
        r = call(case, srv, srv.key)
        if label == "POST /v1/jobs" and r.status_code == 202:
            created.append(r.json()["job_id"])
        if stream and r.status_code == 200:  # every other job is finished (or soon is): its stream ends
            assert r.headers["content-type"][0].startswith("text/event-stream"), r.headers
            assert b"event: done" in r.content, r.content[-500:]

    page = (
        "data:image/png;base64,"
        + base64.b64encode(encode(render(["Chat 7"], width=400).image, "PNG")).decode()
    )

    def with_a_page(case):
        case.body["messages"] = [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": page}}]}
        ]
        return case

    for operation in operations(job_schema):
        if operation.label == "POST /v1/ocr":
            continue  # fuzzed above, with the real engine
        if operation.label == "POST /v1/chat/completions":
            fuzz(operation.as_strategy().map(with_a_page), operation.label, send, examples=CHAT_WITH_A_PAGE)
        ids = [*srv.jobs.values(), *created]
        if operation.label.endswith("/events"):
            # The held job's stream never ends: read once, for EVENTS_BOUND_S, not at every draw.
            ids.remove(held)
            send(operation.Case(path_parameters={"job_id": held}))
        for mode in modes(operation):
            strategy = operation.as_strategy(generation_mode=mode)
            if "{job_id}" in operation.path:  # generated ids, and real ones
                strategy = st.one_of(
                    strategy,
                    *(
                        operation.as_strategy(generation_mode=mode, path_parameters={"job_id": i})
                        for i in ids
                    ),
                )
            fuzz(strategy, operation.label, send)
    # Its stream was read until the bound: what the job had to say so far, and no end.
    assert len(held_streams) == 1 and b"event: progress" in held_streams[0], held_streams
    assert b"event: done" not in held_streams[0], held_streams


def test_the_fuzzing_reached_every_operation(job_schema):
    print(f"\nfuzz requests sent: {sum(SENT.values())} {dict(SENT)}")
    print("statuses:", {label: dict(codes) for label, codes in STATUSES.items()})
    print("refused by the HTTP parser (not HTTP/1.1: not_http):", dict(REFUSED))
    everything = {result.ok().label for result in job_schema.get_all_operations()}
    # The routes of one job answered for a real job, not only 404; the chat route read a page.
    for label in everything:
        if JOB_OPERATION in label or label == "POST /v1/chat/completions":
            assert any(code < 300 for code in STATUSES[label]), (label, STATUSES[label])
    assert set(SENT) == everything, SENT
    assert SENT["POST /v1/ocr"] >= 1000, SENT
