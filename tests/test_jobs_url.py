"""A job's document by URL (`POST /v1/jobs` with `{"url": ...}`) and the request-forgery guard
(ocr_app/egress.py), through the real app over HTTP (`make test-app`).

Names are resolved by a resolver the test controls (tests/stall_engine.py, STALL_HOSTS): a JSON file of
name -> addresses. Documents come from an HTTP server of this test on 127.0.0.1; every other address named
here is refused before any connection, so no packet leaves loopback. The server opens one host,
`docs.internal` (job_url_allowed_hosts), which the system's resolver does not know: a fetch from it works
only if the connection goes to the address the guard checked, with no second lookup.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

import ocr_app.egress
from ocr_app.egress import (
    Policy,
    allowed_host_entry,
    carried,
    checked_address,
    guarded_client,
    ip_literal,
    refusal,
    system_resolver,
)
from ocr_app.errors import (
    LinkLocalRefused,
    LoopbackRefused,
    MetadataRefused,
    MulticastRefused,
    PayloadTooLarge,
    PrivateRefused,
    ReservedRefused,
    UniqueLocalRefused,
    UnsupportedMediaType,
    UrlFetchFailed,
    UrlUnsupportedScheme,
)
from ocr_app.jobs.fetch import _media_type, _why, check_url, fetch

from .test_errors import assert_error
from .test_jobs import PDF_TYPE, StallServer, doc, make_server, wait_status

MAX_JOB_BYTES = 200_000
MAX_REDIRECTS = 2


class Documents:
    """/doc.pdf, /located (it, with a Location header), /big (Content-Length over the limit), /drip-big
    (chunked, over it), /text, /missing, /to?url=U (a 302 to U), /status/N (N, Location /doc.pdf),
    /hops/N (N redirects, then /doc.pdf). Counts the GETs of each path."""

    def __init__(self, pdf: bytes):
        self.pdf = pdf
        self.gets: dict[str, int] = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path, _, query = self.path.partition("?")
                outer.gets[path] = outer.gets.get(path, 0) + 1
                if path == "/doc.pdf":
                    self._send(200, outer.pdf, PDF_TYPE)
                elif path == "/located":  # the document, with a Location header a 200 does not follow
                    self.send_response(200)
                    self.send_header("Location", "/missing")
                    self._send_body(outer.pdf, PDF_TYPE)
                elif path == "/big":
                    self._send(200, b"%PDF-" + b"x" * MAX_JOB_BYTES, PDF_TYPE)
                elif path == "/drip-big":
                    self.send_response(200)
                    self.send_header("Content-Type", PDF_TYPE)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    chunk = b"x" * 65536
                    for _ in range(MAX_JOB_BYTES // len(chunk) + 2):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.write(b"0\r\n\r\n")
                elif path == "/text":
                    self._send(200, b"just words", "text/plain")
                elif path == "/to":
                    self._redirect(query.removeprefix("url="))
                elif path.startswith("/status/"):  # that status, with a Location to /doc.pdf
                    self._redirect("/doc.pdf", int(path.rsplit("/", 1)[1]))
                elif path.startswith("/hops/"):
                    n = int(path.rsplit("/", 1)[1])
                    self._redirect(f"/hops/{n - 1}" if n > 1 else "/doc.pdf")
                else:
                    self._send(404, b"no", "text/plain")

            def _send(self, code: int, body: bytes, media_type: str) -> None:
                self.send_response(code)
                self._send_body(body, media_type)

            def _send_body(self, body: bytes, media_type: str) -> None:
                self.send_header("Content-Type", media_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _redirect(self, location: str, code: int = 302) -> None:
                self.send_response(code)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


# Names the resolver answers, and the refusal each must meet (the test's own reading of RFC 6890 & co).
REFUSED_NAMES = {
    "loop.example": (["127.0.0.1"], "url_loopback"),
    "loop6.example": (["::1"], "url_loopback"),
    "private.example": (["10.1.2.3"], "url_private"),
    "private172.example": (["172.16.9.9"], "url_private"),
    "private192.example": (["192.168.1.1"], "url_private"),
    "link.example": (["169.254.10.1"], "url_link_local"),
    "link6.example": (["fe80::1"], "url_link_local"),
    "ula.example": (["fd12:3456::1"], "url_unique_local"),
    "mcast.example": (["224.0.0.1"], "url_multicast"),
    "mcast6.example": (["ff02::1"], "url_multicast"),
    "metadata.example": (["169.254.169.254"], "url_metadata"),
    "metadata6.example": (["fd00:ec2::254"], "url_metadata"),
    "mapped.example": (["::ffff:127.0.0.1"], "url_loopback"),
    "mapped-private.example": (["::ffff:10.0.0.1"], "url_private"),
    "compat.example": (["::7f00:1"], "url_loopback"),
    "nat64.example": (["64:ff9b::a9fe:a9fe"], "url_metadata"),
    "sixtofour.example": (["2002:c0a8:0101::1"], "url_private"),
    "zero.example": (["0.0.0.0"], "url_reserved"),  # noqa: S104 - an address to refuse
    "shared.example": (["100.64.0.1"], "url_reserved"),
    # One public address and one loopback: every address must pass.
    "mixed.example": (["93.184.215.14", "127.0.0.1"], "url_loopback"),
}
# IP literals in the URL, as the resolver would read them.
REFUSED_LITERALS = {
    "127.0.0.1": "url_loopback",
    "[::1]": "url_loopback",
    "2130706433": "url_loopback",
    "0x7f.1": "url_loopback",
    "0177.0.0.1": "url_invalid",  # httpx's parser refuses an octal IPv4 host: never sent anywhere
    "[::ffff:127.0.0.1]": "url_loopback",
    "[::ffff:a9fe:a9fe]": "url_metadata",
    "169.254.169.254": "url_metadata",
    "10.0.0.1": "url_private",
    "[fc00::1]": "url_unique_local",
    "224.1.1.1": "url_multicast",
}


@pytest.fixture(scope="module")
def docs():
    d = Documents(doc(2, "url"))
    yield d
    d.httpd.shutdown()


@pytest.fixture(scope="module")
def srv(tmp_path_factory, postgres, docs):
    hosts = tmp_path_factory.mktemp("hosts") / "hosts.json"
    names = {name: addresses for name, (addresses, _) in REFUSED_NAMES.items()}
    hosts.write_text(json.dumps({**names, "docs.internal": ["127.0.0.1"]}))
    s = make_server(
        StallServer,
        tmp_path_factory,
        postgres,
        "jobs_url",
        engine="rapidocr",
        max_job_bytes=MAX_JOB_BYTES,
        job_url_max_redirects=MAX_REDIRECTS,
        job_url_allowed_hosts=["docs.internal"],
        max_jobs_in_flight=50,
    )
    control = tmp_path_factory.mktemp("url-control")
    s.hosts = hosts
    s.start(env={"STALL_CONTROL": str(control), "STALL_HOSTS": str(hosts)})
    yield s
    assert s.stop() == 0, s.logs()[-2000:]


def by_url(c: httpx.Client, url: str, **kw) -> httpx.Response:
    return c.post("/v1/jobs", json={"url": url}, **kw)


def test_an_allowed_internal_host_is_fetched_and_read(srv, docs):
    url = f"http://docs.internal:{docs.port}/doc.pdf"
    with srv.client() as c:
        r = by_url(c, url)
        assert r.status_code == 202, r.text
        job_id = r.json()["job_id"]
        done = wait_status(c, job_id, lambda s: s["status"] == "done")
        assert done["pages"] == {"total": 2, "done": 2, "failed": 0}
        pages = c.get(f"/v1/jobs/{job_id}/result").json()["pages"]
    assert pages == srv.ocr(docs.pdf, PDF_TYPE).json()["pages"]
    # Resolved once per connection, by the resolver the guard asked.
    assert srv.hosts.with_suffix(".json.log").read_text().splitlines().count("docs.internal") == 1


def test_the_idempotency_key_covers_the_url_and_fetches_once(srv, docs):
    url = f"http://docs.internal:{docs.port}/doc.pdf"
    before = docs.gets.get("/doc.pdf", 0)
    with srv.client() as c:
        first = by_url(c, url, headers={"Idempotency-Key": "by-url-1"})
        again = by_url(c, url, headers={"Idempotency-Key": "by-url-1"})
        assert first.status_code == again.status_code == 202, first.text
        assert (
            again.json()["job_id"] == first.json()["job_id"]
            and again.headers["Idempotent-Replayed"] == "true"
        )
        assert docs.gets["/doc.pdf"] == before + 1  # the replay did not fetch again
        other = by_url(c, url + "?v=2", headers={"Idempotency-Key": "by-url-1"})
        assert_error(other, 409, "idempotency_conflict")
        # The same key for the same document uploaded: another request than the URL's.
        upload = c.post(
            "/v1/jobs", content=docs.pdf, headers={"Content-Type": PDF_TYPE, "Idempotency-Key": "by-url-1"}
        )
        assert_error(upload, 409, "idempotency_conflict")


@pytest.mark.parametrize("name", sorted(REFUSED_NAMES))
def test_a_name_resolving_to_a_refused_address_is_a_400(srv, docs, name):
    code = REFUSED_NAMES[name][1]
    with srv.client() as c:
        err = assert_error(by_url(c, f"http://{name}:{docs.port}/doc.pdf"), 400, code)
    assert name in err["message"] and "job_url_allowed_hosts" in err["message"]


@pytest.mark.parametrize("host", sorted(REFUSED_LITERALS))
def test_an_address_in_the_url_is_judged_as_the_address_it_stands_for(srv, docs, host):
    with srv.client() as c:
        assert_error(by_url(c, f"http://{host}:{docs.port}/doc.pdf"), 400, REFUSED_LITERALS[host])


def test_every_redirect_is_checked_again(srv, docs):
    base = f"http://docs.internal:{docs.port}"
    before = docs.gets.get("/doc.pdf", 0)
    with srv.client() as c:
        for target, code in [
            (f"http://127.0.0.1:{docs.port}/doc.pdf", "url_loopback"),
            (f"http://loop.example:{docs.port}/doc.pdf", "url_loopback"),
            ("http://169.254.169.254/latest/meta-data/", "url_metadata"),
            ("file:///etc/passwd", "url_unsupported_scheme"),
        ]:
            assert_error(by_url(c, f"{base}/to?url={target}"), 400, code)
        assert docs.gets.get("/doc.pdf", 0) == before  # none of them reached the document
        # job_url_max_redirects (2): at the limit, fetched; one past it, refused.
        assert by_url(c, f"{base}/hops/{MAX_REDIRECTS}").status_code == 202
        assert_error(by_url(c, f"{base}/hops/{MAX_REDIRECTS + 1}"), 400, "url_too_many_redirects")


def test_what_cannot_be_fetched_says_why(srv, docs):
    base = f"http://docs.internal:{docs.port}"
    with srv.client() as c:
        assert_error(by_url(c, f"{base}/big"), 413, "payload_too_large")  # as an upload over max_job_bytes
        assert_error(by_url(c, f"{base}/drip-big"), 413, "payload_too_large")  # no Content-Length
        assert_error(by_url(c, f"{base}/missing"), 400, "url_fetch_failed")
        assert_error(by_url(c, f"{base}/text"), 415, "unsupported_media_type")
        assert_error(by_url(c, f"http://nowhere.example:{docs.port}/"), 400, "url_unresolvable")
        for bad in (
            "ftp://docs.internal/doc.pdf",
            "file:///etc/passwd",
            "gopher://x/",
            "docs.internal/doc.pdf",
        ):
            assert_error(by_url(c, bad), 400, "url_unsupported_scheme")
        assert_error(by_url(c, f"http://user:pw@docs.internal:{docs.port}/doc.pdf"), 400, "url_invalid")


def test_a_url_and_a_body_together_and_bad_json_are_422(srv, docs):
    url = f"http://docs.internal:{docs.port}/doc.pdf"
    with srv.client() as c:
        for body in (
            {"url": url, "file": "JVBERi0="},
            {"url": 7},
            {"uri": url},
            [url],
        ):
            assert_error(c.post("/v1/jobs", json=body), 422, "invalid_parameter")
        assert_error(
            c.post("/v1/jobs", content=b"{not json", headers={"Content-Type": "application/json"}),
            422,
            "invalid_parameter",
        )
        big = json.dumps({"url": url + "?" + "a" * 20_000}).encode()
        assert_error(
            c.post("/v1/jobs", content=big, headers={"Content-Type": "application/json"}),
            413,
            "payload_too_large",
        )


@pytest.mark.parametrize(
    ("address", "refused"),
    [
        ("8.8.8.8", None),
        ("2001:4860:4860::8888", None),
        ("127.0.0.2", LoopbackRefused),
        ("::1", LoopbackRefused),
        ("10.255.255.255", PrivateRefused),
        ("172.31.0.1", PrivateRefused),
        ("172.32.0.1", None),  # one past 172.16.0.0/12
        ("192.168.0.1", PrivateRefused),
        ("169.254.0.1", LinkLocalRefused),
        ("fe80::1", LinkLocalRefused),
        ("fc00::", UniqueLocalRefused),
        ("fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", UniqueLocalRefused),
        ("fe00::", ReservedRefused),  # one past fc00::/7: not global either
        ("239.255.255.255", MulticastRefused),
        ("ff0e::1", MulticastRefused),
        ("169.254.169.254", MetadataRefused),
        ("100.100.100.200", MetadataRefused),
        ("::ffff:169.254.169.254", MetadataRefused),
        ("::ffff:8.8.8.8", None),
        ("::8.8.8.8", None),  # compatible form of a public address
        ("::127.0.0.1", LoopbackRefused),
        ("0.0.0.0", ReservedRefused),  # noqa: S104 - an address to refuse
        ("::", ReservedRefused),
        ("100.127.255.255", ReservedRefused),  # shared address space
        ("100.128.0.0", None),  # one past it
        ("198.51.100.7", PrivateRefused),  # documentation (ipaddress counts it private)
        ("255.255.255.255", ReservedRefused),
    ],
)
def test_each_kind_of_address(address, refused):
    assert refusal(ipaddress.ip_address(address)) is refused


def test_a_200_with_a_location_header_is_the_document(docs):
    # fetch() itself, without the app: a Location header redirects only with a redirect's status.
    body, media_type = asyncio.run(
        fetch(
            f"http://127.0.0.1:{docs.port}/located",
            MAX_JOB_BYTES,
            30,
            MAX_REDIRECTS,
            Policy.of(["127.0.0.1"]),
        )
    )
    assert (body, media_type) == (docs.pdf, PDF_TYPE)


def test_each_redirect_status_is_followed_and_no_other(docs):
    policy = Policy.of(["127.0.0.1"])
    for code in (301, 302, 303, 307, 308):
        url = f"http://127.0.0.1:{docs.port}/status/{code}"
        assert asyncio.run(fetch(url, MAX_JOB_BYTES, 30, MAX_REDIRECTS, policy))[0] == docs.pdf, code
    for code in (300, 304, 305, 306, 309):
        with pytest.raises(UrlFetchFailed, match=f"answered {code}"):
            asyncio.run(fetch(f"http://127.0.0.1:{docs.port}/status/{code}", MAX_JOB_BYTES, 30, 2, policy))


def test_a_document_of_exactly_the_limit_is_fetched(docs):
    policy, url = Policy.of(["127.0.0.1"]), f"http://127.0.0.1:{docs.port}/doc.pdf"
    assert asyncio.run(fetch(url, len(docs.pdf), 30, MAX_REDIRECTS, policy))[0] == docs.pdf
    with pytest.raises(PayloadTooLarge):  # one byte past it
        asyncio.run(fetch(url, len(docs.pdf) - 1, 30, MAX_REDIRECTS, policy))


def test_why_a_fetch_failed():
    assert _why(httpx.ConnectError("refused")) == "ConnectError: refused"
    assert _why(httpx.ConnectError("")) == "ConnectError"
    assert (
        _why(httpx.ConnectError("[SSL: CERTIFICATE_VERIFY_FAILED] x"))
        == "its TLS certificate was not trusted"
    )


def test_the_system_resolver_answers_an_address_for_itself():
    assert asyncio.run(system_resolver("127.0.0.1", 80)) == ["127.0.0.1"]


def test_allowed_host_entries_at_their_limits():
    for entry in ("10.0.0.0/8", "192.0.2.1", "[::1]", "fc00::/7", "docs.internal", "Docs.Internal."):
        assert allowed_host_entry(entry), entry
    # A network written with its host bits set is that network.
    assert allowed_host_entry("10.1.2.3/8")
    assert Policy.of(["10.1.2.3/8"]).networks == (ipaddress.IPv4Network("10.0.0.0/8"),)
    assert allowed_host_entry("a") and allowed_host_entry("a.")  # one character: the shortest name
    name = ".".join(["a" * 63] * 3 + ["b" * 61])  # 253 characters: the longest name
    assert len(name) == 253 and allowed_host_entry(name)
    assert not allowed_host_entry(name + "b")  # one past
    for entry in ("", "a..b", "-a.example", "a-.example", "a_b.example", "a" * 64 + ".example"):
        assert not allowed_host_entry(entry), entry


# The guard's parts without the app, for what the app's answers above cannot tell apart (each kills mutants
# of `make mutate MODULE=egress`).


@pytest.mark.parametrize(
    ("address", "ipv4"),
    [
        ("::", None),  # itself (unspecified), as ::1 is
        ("::1", None),
        ("::2", "0.0.0.2"),  # the first compatible (::/96) address taken for the IPv4 one it carries
        ("::8.8.8.9", "8.8.8.9"),  # an odd one: its last bit kept
        ("::255.255.255.255", "255.255.255.255"),  # the last of ::/96
        ("::1:0:0", None),  # one past it: 2**32
        ("64:ff9b::8.8.8.9", "8.8.8.9"),  # NAT64
        ("64:ff9b::255.255.255.255", "255.255.255.255"),  # the last of 64:ff9b::/96
        ("64:ff9b::1:0:0", None),  # one past it
    ],
)
def test_the_ipv4_address_an_ipv6_one_carries(address, ipv4):
    ip = ipaddress.ip_address(address)
    assert carried(ip) == (ip if ipv4 is None else ipaddress.IPv4Address(ipv4))


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("[::1]", "::1"),
        ("[fe80::1%eth0]", "fe80::1"),  # a zone id: the address without it
        ("2130706433", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0x7f.0xa", "127.0.0.10"),  # ends with a hex letter: still an address to inet_aton
        ("", None),
        ("[]", None),
        ("a.1", None),  # starts with a letter: a name
        ("1.2.3.4.5", None),  # digits and dots that inet_aton refuses
        ("1e5", None),
        ("docs.internal", None),
        # glibc's inet_aton stops at a space (127.0.0.1); not an address here, a name the resolver answers
        # for (and each of its answers is judged). URLs never have one in their host anyway.
        ("127.0.0.1 x", None),
    ],
)
def test_an_ip_literal_is_read_as_its_address_and_a_name_is_not(host, address):
    assert ip_literal(host) == (None if address is None else ipaddress.ip_address(address))


def answering(*addresses: str):
    async def resolver(host: str, port: int) -> list[str]:
        return list(addresses)

    return resolver


@pytest.fixture
def no_system_resolver(monkeypatch):
    """The system's resolver, should the guard ask it instead of the test's: a failure, and no lookup."""

    async def refuse(host: str, port: int) -> list[str]:
        raise AssertionError(f"the system's resolver was asked for {host}")

    monkeypatch.setattr(ocr_app.egress, "RESOLVER", refuse)


def test_the_first_of_several_addresses_is_the_one_connected_to(no_system_resolver):
    # All allowed; the connection goes to the first, in the resolver's order (RFC 6724's, getaddrinfo's).
    policy = Policy.of(["127.0.0.0/8"])
    resolver = answering("127.0.0.2", "127.0.0.1")
    assert asyncio.run(checked_address("multi.example", 80, policy, resolver)) == "127.0.0.2"


def test_an_answer_with_a_zone_id_is_judged_without_it(no_system_resolver):
    resolver = answering("fd00:ec2::254%eth0")  # with its zone it would be a mere unique-local one
    with pytest.raises(MetadataRefused):
        asyncio.run(checked_address("zoned.example", 80, Policy(), resolver))


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("ftp://docs.internal/doc.pdf", "ftp"),
        ("FILE:///etc/passwd", "file"),
        ("docs.internal/doc.pdf", "one without a scheme"),
        ("docs.internal:8080/a:b", "docs.internal"),  # what precedes the first colon
    ],
)
def test_a_url_of_another_scheme_is_named_by_it(url, named):
    with pytest.raises(UrlUnsupportedScheme) as err:
        check_url(url)
    assert str(err.value) == f"url must be an http or https URL, not {named}"


@pytest.mark.parametrize(
    ("body", "declared", "media_type"),
    [
        (b"%PDF-1.7", "text/plain", PDF_TYPE),  # the bytes say it first
        (b"not an image", "image/png; charset=x", "image/png"),  # the decoder says what is wrong with it
        (b"not an image", "IMAGE/TIFF", "image/tiff"),
    ],
)
def test_a_fetched_documents_type(body, declared, media_type):
    assert _media_type(body, declared) == media_type


@pytest.mark.parametrize(
    ("declared", "said"),
    [
        (PDF_TYPE, PDF_TYPE),  # a PDF is known by its bytes: declared alone, it is not one
        ("text/plain", "text/plain"),
        (None, "of no declared type"),
    ],
)
def test_a_fetched_document_of_no_supported_type(declared, said):
    with pytest.raises(UnsupportedMediaType) as err:
        _media_type(b"just words", declared)
    assert str(err.value).startswith(f"the document at the URL is {said} and not one of ")


def test_a_fetch_is_bounded_in_time_as_a_whole(no_system_resolver):
    # A resolver that never answers: only the whole fetch's bound (job_url_timeout_s) ends it.
    async def never(host: str, port: int) -> list[str]:
        await asyncio.Event().wait()
        return []

    with pytest.raises(UrlFetchFailed, match=r"not fetched within 0\.01 s \(job_url_timeout_s\)"):
        asyncio.run(fetch("http://slow.example/doc.pdf", MAX_JOB_BYTES, 0.01, MAX_REDIRECTS, Policy(), never))


def test_the_guarded_client_takes_nothing_from_the_environment(monkeypatch, tmp_path):
    # A CA bundle or a proxy named there would change how or where the service connects, unchecked.
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "absent.pem"))
    monkeypatch.setenv("HTTPS_PROXY", "http://192.0.2.1:3128")
    monkeypatch.setenv("HTTP_PROXY", "http://192.0.2.1:3128")
    client = guarded_client(Policy(), 5)
    assert client._mounts == {}
    assert client._transport._pool._ssl_context.get_ca_certs()  # certifi's roots


def test_the_cli_submits_a_url_and_says_why_one_is_refused(srv, docs):
    """`ocr-app jobs submit URL --follow`: the server fetches it; a refused one prints the API's error."""
    from .test_cli_jobs import cli, lines

    url = f"http://docs.internal:{docs.port}/doc.pdf"
    out = cli(srv, "submit", url, "--follow")
    assert out.returncode == 0, out.stderr
    assert [p["page"] for p in lines(out.stdout)] == [1, 2]
    refused = cli(srv, "submit", f"http://metadata.example:{docs.port}/doc.pdf")
    assert refused.returncode == 1 and "url_metadata" in refused.stderr, refused.stderr
