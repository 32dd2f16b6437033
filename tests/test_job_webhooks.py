"""Job webhooks: the real app over real HTTP (tests/server.py) against a real PostgreSQL (tests/postgres.py),
delivering to a real receiver: an HTTP server on 127.0.0.1 in a thread that records every request and answers
the statuses a test scripts for its path.

Signed with sha256(key), retried on 5xx with the same delivery id, never retried on 4xx, never following a
redirect, refused at submit outside job_webhook_allowed_urls; and below HTTP, a delivery whose sender died is
taken by another once its lease expires.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import psycopg
import pytest

from ocr_app import urls
from ocr_app.config import ConfigError, load_settings
from ocr_app.errors import InvalidWebhook
from ocr_app.http.errors import http_status
from ocr_app.jobs import schema, webhooks
from ocr_app.jobs.service import check_webhook_url
from ocr_app.jobs.store import JobStore
from ocr_app.urls import allowed

from .test_errors import assert_error
from .test_jobs import StallServer, doc, make_server, submit, submit_ok, wait_status


class Receiver:
    """Records (path, headers, body) of each POST; answers the next scripted status for its path (then 200).
    An answer may be (status, {header: value})."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.script: dict[str, list] = {}
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.lock:
                    receiver.requests.append((self.path, dict(self.headers), body))
                    queue = receiver.script.get(self.path, [])
                    answer = queue.pop(0) if queue else 200
                status, headers = answer if isinstance(answer, tuple) else (answer, {})
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.named_url = f"http://hooks.example:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def at(self, path: str) -> list[tuple[str, dict[str, str], bytes]]:
        with self.lock:
            return [r for r in self.requests if r[0] == path]

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def hooks_srv(tmp_path_factory, postgres, receiver):
    srv = make_server(
        StallServer,
        tmp_path_factory,
        postgres,
        "jobs_webhooks",
        engine="rapidocr",
        max_concurrency=2,
        job_range_pages=2,
        max_job_pages=5,
        max_jobs_in_flight=8,
        job_webhook_allowed_urls=[receiver.url + "/hooks/", receiver.named_url + "/hooks/"],
        # The receiver's loopback address is opened as an operator would open an internal receiver's;
        # hooks.example resolves to another loopback address, not opened (tests/stall_engine.py's resolver).
        job_url_allowed_hosts=["127.0.0.1"],
        job_webhook_retry_base_s=0.05,
        job_webhook_timeout_s=5,
        job_webhook_max_attempts=4,
    )
    hosts = tmp_path_factory.mktemp("hooks-hosts") / "hosts.json"
    hosts.write_text(json.dumps({"hooks.example": ["127.0.0.2"]}))
    srv.start(
        env={"STALL_CONTROL": str(tmp_path_factory.mktemp("stall-control-hooks")), "STALL_HOSTS": str(hosts)}
    )
    yield srv
    assert srv.stop() == 0, srv.logs()[-2000:]


def delivery(srv, job_id: str, until=lambda row: row["state"] != "pending", timeout: float = 30) -> dict:
    """The job's delivery row once `until` holds (bounded)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(srv.config["database_url"], autocommit=True) as conn:
        while True:
            cur = conn.execute(
                "SELECT id, url, state, attempts, last_status, last_error FROM ocr_job_webhooks"
                " WHERE job_id = %s",
                (job_id,),
            )
            names = [c.name for c in cur.description]
            row = cur.fetchone()
            found = dict(zip(names, row, strict=True)) if row else None
            if found is not None and until(found):
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"delivery of {job_id} never matched: {found}\n{srv.logs()[-2000:]}")
            time.sleep(0.05)  # a poll interval, not a timing assumption


def hook_job(srv, receiver: Receiver, path: str, script: list | None = None, seed: str = "") -> str:
    if script is not None:
        receiver.script[path] = list(script)
    with srv.client() as c:
        return submit_ok(c, doc(1, seed or path), params={"webhook_url": receiver.url + path}).json()[
            "job_id"
        ]


def test_a_finished_job_is_posted_signed_with_the_keys_sha256(hooks_srv, receiver):
    job_id = hook_job(hooks_srv, receiver, "/hooks/signed")
    row = delivery(hooks_srv, job_id)
    assert row["state"] == "delivered" and row["attempts"] == 1 and row["last_status"] == 200
    [(_, headers, body)] = receiver.at("/hooks/signed")
    assert headers["Content-Type"] == "application/json"
    assert headers[webhooks.ID_HEADER] == str(row["id"])
    signature = headers[webhooks.SIGNATURE_HEADER]
    # The scheme docs/api.md publishes, recomputed with the standard library.
    parts = dict(part.split("=", 1) for part in signature.split(","))
    assert abs(time.time() - int(parts["t"])) < 600
    assert parts["v1"] == published_signature(hooks_srv.key, int(parts["t"]), body)
    assert webhooks.verify(webhooks.secret_for_key(hooks_srv.key), signature, body)
    assert webhooks.verify(hooks_srv.keys_file.read_text().split(":")[1].strip(), signature, body)
    assert not webhooks.verify(webhooks.secret_for_key(hooks_srv.key + "x"), signature, body)
    assert not webhooks.verify(webhooks.secret_for_key(hooks_srv.key), signature, body + b" ")
    with hooks_srv.client() as c:
        status = c.get(f"/v1/jobs/{job_id}").json()
    assert json.loads(body) == {
        "event": "job.finished",
        "job_id": job_id,
        "status": "done",
        "pages_total": 1,
        "pages_done": 1,
        "pages_failed": 0,
        "finished_at": status["finished_at"],
        "status_url": f"/v1/jobs/{job_id}",
        "result_url": f"/v1/jobs/{job_id}/result",
    }
    metrics = hooks_srv.metrics()
    assert metrics['ocr_job_webhooks_total{outcome="delivered"}'] >= 1


def test_5xx_is_retried_with_the_same_delivery_id_until_delivered(hooks_srv, receiver):
    before = hooks_srv.metrics()
    job_id = hook_job(hooks_srv, receiver, "/hooks/flaky", [503, 503, 200])
    row = delivery(hooks_srv, job_id)
    assert row["state"] == "delivered" and row["attempts"] == 3, row
    attempts = receiver.at("/hooks/flaky")
    assert len(attempts) == 3
    assert {h[webhooks.ID_HEADER] for _, h, _ in attempts} == {str(row["id"])}
    assert {json.loads(b)["job_id"] for _, _, b in attempts} == {job_id}
    after = hooks_srv.metrics()
    assert (
        after['ocr_job_webhooks_total{outcome="retried"}']
        - before['ocr_job_webhooks_total{outcome="retried"}']
        == 2
    )


def test_5xx_until_the_attempts_are_spent_fails_the_delivery(hooks_srv, receiver):
    job_id = hook_job(hooks_srv, receiver, "/hooks/down", [500] * 10)
    row = delivery(hooks_srv, job_id)
    assert row["state"] == "failed" and row["attempts"] == 4 and row["last_status"] == 500  # max_attempts 4
    assert len(receiver.at("/hooks/down")) == 4
    # The row is marked failed before the warning is written: the log is read once the line is there.
    assert hooks_srv.log_records(
        lambda x: x["message"].startswith("webhook failed") and x.get("job_id") == job_id
    )


def test_4xx_is_not_retried(hooks_srv, receiver):
    before = hooks_srv.metrics()['ocr_job_webhooks_total{outcome="failed"}']
    job_id = hook_job(hooks_srv, receiver, "/hooks/refuses", [400])
    row = delivery(hooks_srv, job_id)
    assert row["state"] == "failed" and row["attempts"] == 1 and row["last_status"] == 400
    assert len(receiver.at("/hooks/refuses")) == 1  # final: a failed delivery is never claimed again
    assert hooks_srv.metrics()['ocr_job_webhooks_total{outcome="failed"}'] == before + 1


def test_a_redirect_is_not_followed(hooks_srv, receiver):
    job_id = hook_job(
        hooks_srv, receiver, "/hooks/moved", [(307, {"Location": receiver.url + "/hooks/there"})]
    )
    row = delivery(hooks_srv, job_id)
    assert row["state"] == "failed" and row["attempts"] == 1 and row["last_status"] == 307
    assert len(receiver.at("/hooks/moved")) == 1 and receiver.at("/hooks/there") == []


def test_a_receiver_at_an_address_not_opened_is_never_connected_to(hooks_srv, receiver):
    """Under job_webhook_allowed_urls, but its name resolves to a loopback address that
    job_url_allowed_hosts does not open: the request-forgery guard fails the delivery, not retried."""
    with hooks_srv.client() as c:
        job_id = submit_ok(
            c, doc(1, "guarded"), params={"webhook_url": receiver.named_url + "/hooks/guarded"}
        ).json()["job_id"]
    row = delivery(hooks_srv, job_id)
    assert row["state"] == "failed" and row["attempts"] == 1, row
    assert row["last_error"] == "url_loopback" and row["last_status"] is None
    assert receiver.at("/hooks/guarded") == []
    deadline = time.monotonic() + 30  # logged just after the row is written
    while "127.0.0.2, a loopback address" not in hooks_srv.logs():
        assert time.monotonic() < deadline, "the refusal was not logged"
        time.sleep(0.05)


def test_a_cancelled_job_is_posted_too(hooks_srv, receiver):
    hooks_srv.drain_file.touch()  # a draining instance claims no page: the job stays queued until cancelled
    try:
        job_id = hook_job(hooks_srv, receiver, "/hooks/cancelled")
        with hooks_srv.client() as c:
            assert c.delete(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"
        assert delivery(hooks_srv, job_id)["state"] == "delivered"
    finally:
        hooks_srv.drain_file.unlink(missing_ok=True)
    [(_, _, body)] = receiver.at("/hooks/cancelled")
    assert json.loads(body)["status"] == "cancelled" and json.loads(body)["pages_done"] == 0


def test_a_url_outside_the_allow_list_is_refused_at_submit(hooks_srv, receiver):
    port = receiver.url.rsplit(":", 1)[1]
    with psycopg.connect(hooks_srv.config["database_url"]) as conn:
        jobs_before = conn.execute("SELECT count(*) FROM ocr_jobs").fetchone()
    sent_before = len(receiver.requests)
    with hooks_srv.client() as c:
        for url in (
            receiver.url + "/other",  # the path outside the prefix's
            receiver.url + "/hooksx",
            receiver.url + "/hooks/%2e%2e/other",
            f"http://localhost:{port}/hooks/a",  # another host name
            f"http://127.0.0.1:{int(port) + 1}/hooks/a",  # another port
            f"https://127.0.0.1:{port}/hooks/a",  # another scheme
            f"http://user:pw@127.0.0.1:{port}/hooks/a",  # user info
            f"ftp://127.0.0.1:{port}/hooks/a",
            "not a url",
        ):
            err = assert_error(
                submit(c, doc(1, "refused"), params={"webhook_url": url}), 400, "invalid_webhook"
            )
            assert "job_webhook_allowed_urls" in err["message"], url
    with psycopg.connect(hooks_srv.config["database_url"]) as conn:
        assert (
            conn.execute("SELECT count(*) FROM ocr_jobs").fetchone() == jobs_before
        )  # no job: nothing to send
    assert len(receiver.requests) == sent_before


def test_without_an_allow_list_webhooks_are_refused():
    with pytest.raises(InvalidWebhook) as err:
        check_webhook_url("http://127.0.0.1:9/hooks/", [])  # the default: an empty list
    assert (http_status(err.value), err.value.code) == (400, "invalid_webhook")
    assert "job_webhook_allowed_urls is empty" in err.value.message
    check_webhook_url(None, [])  # no webhook asked for: nothing to check


def test_the_webhook_url_is_part_of_the_idempotent_request(hooks_srv, receiver):
    data = doc(1, "idem")
    with hooks_srv.client() as c:
        key = {"Idempotency-Key": "hook-1"}
        first = submit_ok(c, data, headers=key, params={"webhook_url": receiver.url + "/hooks/idem"})
        again = submit(c, data, headers=key, params={"webhook_url": receiver.url + "/hooks/idem"})
        assert again.status_code == 202 and again.json()["job_id"] == first.json()["job_id"]
        other = submit(c, data, headers=key, params={"webhook_url": receiver.url + "/hooks/idem2"})
        assert_error(other, 409, "idempotency_conflict")
        assert_error(submit(c, data, headers=key), 409, "idempotency_conflict")
        wait_status(c, first.json()["job_id"], lambda b: b["status"] == "done")


def test_webhook_url_in_the_openapi_document(hooks_srv):
    post = httpx.get(hooks_srv.url + "/openapi.json").json()["paths"]["/v1/jobs"]["post"]
    param = next(p for p in post["parameters"] if p["name"] == "webhook_url")
    # How a delivery is signed is said once, on the parameter; the route points at it and at the verifier.
    assert param["in"] == "query" and "X-OCR-Signature" in param["description"]
    assert "sha256 of your API key" in param["description"]
    assert "webhooks.verify" in post["description"] and "HMAC" not in post["description"]
    assert "invalid_webhook" in post["responses"]["400"]["description"]


# --- below HTTP ---------------------------------------------------------------------------------------------


def test_a_dead_senders_delivery_is_taken_by_another_once_its_lease_expires(postgres):
    url = postgres.create_database("webhooks_lease")
    with psycopg.connect(url, autocommit=True) as conn:
        schema.upgrade(conn)

    async def scenario():
        store = JobStore(url)
        await store.open()
        try:
            job_id, _ = await store.create("o", None, "f", "image/png", {}, [1], b"doc", 1, 10, "http://h/x")
            assert await store.deliveries.claim("w", 30) is None  # not due while the job runs
            assert await store.cancel("o", job_id, 60)
            dead = await store.deliveries.claim("dead", 0.5)
            assert dead is not None and dead.job_id == job_id and dead.attempts == 1 and dead.owner == "o"
            assert await store.deliveries.claim("alive", 30) is None  # leased
            deadline = time.monotonic() + 30
            # Polls the database's clock past the dead sender's lease (no event says when it passes).
            claim = store.deliveries.claim
            while (again := await claim("alive", 30)) is None and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            assert again is not None and again.id == dead.id and again.attempts == 2
            await store.deliveries.retry(again, 3600, 503, None)
            assert await store.deliveries.claim("alive", 30) is None  # not due for an hour
        finally:
            await store.close()

    asyncio.run(scenario())


# --- the pure functions -------------------------------------------------------------------------------------


def published_signature(key: str, t: int, body: bytes) -> str:
    """docs/api.md's scheme: the hex HMAC-SHA256 of `<t>.` and the body, keyed with the hex SHA-256 of the
    API key (what the server's keys file holds)."""
    secret = hashlib.sha256(key.encode("utf-8")).hexdigest().encode("ascii")
    return hmac.new(secret, str(t).encode("ascii") + b"." + body, hashlib.sha256).hexdigest()


def test_sign_and_verify():
    secret = webhooks.secret_for_key("ocr_key")
    body = b'{"event":"job.finished"}'
    header = webhooks.sign(secret, body, t=1_700_000_000)
    assert header == f"t=1700000000,v1={published_signature('ocr_key', 1_700_000_000, body)}"
    assert webhooks.verify(secret, header, body, now=1_700_000_100)
    assert not webhooks.verify(secret, header, body, now=1_700_000_301)  # older than the tolerance
    assert webhooks.verify(secret, header, body, tolerance_s=400, now=1_700_000_301)
    assert not webhooks.verify("another", header, body, now=1_700_000_000)
    assert not webhooks.verify(secret, header, body + b"x", now=1_700_000_000)
    for bad in (
        None,
        "",
        "v1=ab",
        "t=1700000000",
        "t=x,v1=ab",
        "t=²,v1=ab",
        "garbage",
        header.replace("v1=", "v0="),
    ):
        assert not webhooks.verify(secret, bad, body, now=1_700_000_000)
    assert webhooks.verify(secret, header + ",v1=00", body, now=1_700_000_000)  # any v1 may match


def test_verify_at_its_limits():
    secret = webhooks.secret_for_key("ocr_key")
    body = b"{}"
    t = 1_700_000_000
    header = f"t={t},v1={published_signature('ocr_key', t, body)}"
    # tolerance_s either side of t, at the limit and one second past it.
    assert webhooks.verify(secret, header, body, now=t + 300) and webhooks.verify(
        secret, header, body, now=t - 300
    )
    assert not webhooks.verify(secret, header, body, now=t + 301)
    assert not webhooks.verify(secret, header, body, now=t - 301)
    # t has at most 12 digits.
    for t, ok in ((999_999_999_999, True), (1_000_000_000_000, False)):
        header = f"t={t},v1={published_signature('ocr_key', t, body)}"
        assert webhooks.verify(secret, header, body, now=t) is ok
    assert not webhooks.verify(secret, "t=1700000000,v1", body, now=1_700_000_000)


def test_headers_sign_only_with_a_secret():
    body = b'{"a":1}'
    assert webhooks.headers("d-1", body, None) == {
        "Content-Type": "application/json",
        "X-OCR-Webhook-Id": "d-1",
        "User-Agent": "ocr-app-webhook",
    }
    signed = webhooks.headers("d-1", body, webhooks.secret_for_key("ocr_key"))
    t, v1 = (part.split("=", 1)[1] for part in signed["X-OCR-Signature"].split(","))
    assert v1 == published_signature("ocr_key", int(t), body)


def test_payload_flattens_the_status():
    status = {
        "job_id": "j-1",
        "status": "done",
        "pages": {"total": 3, "done": 2, "failed": 1},
        "finished_at": "t",
    }
    body = webhooks.payload(status, "https://s/status", "https://s/result")
    assert b" " not in body  # compact
    assert json.loads(body) == {
        "event": "job.finished",
        "job_id": "j-1",
        "status": "done",
        "pages_total": 3,
        "pages_done": 2,
        "pages_failed": 1,
        "finished_at": "t",
        "status_url": "https://s/status",
        "result_url": "https://s/result",
    }


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (199, "failed"),
        (200, "delivered"),
        (299, "delivered"),
        (300, "failed"),
        (499, "failed"),
        (500, "retry"),
    ],
)
def test_classify_at_each_boundary(status, outcome):
    assert webhooks.classify(status) == outcome


def test_backoff_at_the_cap_and_the_jitters_ends():
    class End(random.Random):
        """A generator whose uniform(a, b) answers one end, a or b, and records what it was asked."""

        def __init__(self, top: bool) -> None:
            super().__init__(0)
            self.top, self.asked = top, []

        def uniform(self, a: float, b: float) -> float:
            self.asked.append((a, b))
            return b if self.top else a

    top, bottom = End(True), End(False)
    # base * 2 ** (attempts - 1), capped at 900 s: 112.5 * 2**3 is the cap itself, one attempt more past it.
    for attempts, full in ((0, 112.5), (1, 112.5), (2, 225), (4, 900), (5, 900)):
        assert webhooks.backoff(attempts, 112.5, top) == full
        assert webhooks.backoff(attempts, 112.5, bottom) == full / 2
    assert set(top.asked) == {(0.5, 1.0)}
    for _ in range(20):  # the module's own generator, within the same ends
        assert 450 <= webhooks.backoff(5, 112.5) <= 900


def test_allowed_urls():
    prefixes = ["https://hooks.example.com/ocr/", "http://10.0.0.5:8080/in"]
    for url in (
        "https://hooks.example.com/ocr/a?token=1",
        "https://HOOKS.example.com:443/ocr/",
        "http://10.0.0.5:8080/in",
        "http://10.0.0.5:8080/in/deep/er",
    ):
        assert allowed(url, prefixes), url
    for url in (
        "https://hooks.example.com/ocr",  # above the prefix's path
        "https://hooks.example.com/ocr/../admin",
        "https://hooks.example.com/ocr/%2E%2E/admin",
        "https://hooks.example.com:8443/ocr/a",
        "http://hooks.example.com/ocr/a",
        "https://hooks.example.com.evil.net/ocr/a",
        "https://a@hooks.example.com/ocr/a",
        "https://hooks.example.com\\@evil.net/ocr/a",
        "http://10.0.0.5:8080/inside",
        "http://10.0.0.5/in",
        "file:///etc/passwd",
    ):
        assert not allowed(url, prefixes), url
    assert not allowed("https://hooks.example.com/ocr/a", [])


def test_url_rules_at_their_limits():
    base = "https://h.example/x/"
    at_limit = base + "a" * (urls.MAX_URL_LENGTH - len(base))
    assert len(at_limit) == 2000 and urls.parse(at_limit) is not None
    assert urls.parse(at_limit + "a") is None  # one past
    for bad in (
        "https://h.example/x/\x1f",
        "https://h.example/x/\x7f",
        "https://h.example/x\\y",
        "ftp://h.example/",
    ):
        assert urls.parse(bad) is None, repr(bad)
    assert urls.parse("https://h.example/x/~!$&'()*+,;=:@") is not None
    # Default ports: 443 for https, 80 for http, written or not.
    assert allowed("http://h.example:80/in/a", ["http://h.example/in"])
    assert allowed("https://h.example/in/a", ["https://h.example:443/in"])
    assert not allowed("http://h.example:443/in/a", ["http://h.example/in"])
    for port in (79, 81):  # either side of each default
        assert not allowed(f"http://h.example:{port}/in/a", ["http://h.example/in"])
    for port in (442, 444):
        assert not allowed(f"https://h.example:{port}/in/a", ["https://h.example/in"])
    assert not allowed("https://h.example:8443/in/a", ["https://h.example:9443/in"])
    # A prefix without a path opens the whole host; one with a path only what lies under it.
    assert allowed("https://h.example/any", ["https://h.example"])
    assert not allowed("https://h.example/", ["https://h.example/in"])
    # Another prefix in the list may open what the first does not.
    assert allowed("https://h.example/in/a", ["https://other.example/in", "https://h.example/in"])
    assert allowed("https://h.example/in/a", ["not a url", "https://h.example/in"])


def test_prefix_problems_and_what_a_log_line_names():
    assert urls.prefix_problem("https://h.example/in/") is None
    for bad, why in (
        ("https://h.example/in?q=1", "no query or fragment"),
        ("https://h.example/in#f", "no query or fragment"),
        ("https://u@h.example/in", "not an http(s) URL"),
    ):
        assert why in (urls.prefix_problem(bad) or ""), bad
    assert urls.host_of("https://h.example:8443/in/secret?token=1") == "https://h.example"
    assert urls.host_of("nothing") == "(invalid)"


def test_backoff_doubles_is_capped_and_jittered():
    rng = random.Random(1)
    for attempts, full in ((1, 5), (2, 10), (3, 20), (8, 640), (9, 900), (30, 900)):
        for _ in range(20):
            assert full / 2 <= webhooks.backoff(attempts, 5, rng) <= full


def test_allowed_urls_are_checked_at_start(tmp_path):
    base = {"auth_disabled": True}
    assert load_settings(None, **base, job_webhook_allowed_urls=["https://h/x/"]).job_webhook_allowed_urls
    for bad in ("ftp://h/", "https://u@h/", "https://h/x?q=1", "nothing"):
        with pytest.raises(ConfigError, match="job_webhook_allowed_urls"):
            load_settings(None, **base, job_webhook_allowed_urls=[bad])
