"""Shadow comparison (ocr_app/fleet/shadow.py): an old instance replays the requests it answered to a canary,
over real HTTP between real app processes (rapidocr), and counts what the comparison found; its clients only
ever get its own answers. The control file is the one the ocr_app role's `shadow` writes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import certifi
import pytest

from .docs import encode, render
from .models import misreading_revision, wheel_revision
from .server import Server, free_port

LINES = ["Invoice No. 2048", "Total due 1337.50 EUR"]
OUTCOMES = ("compared", "failed", "busy", "skipped")


@pytest.fixture(scope="module")
def png() -> bytes:
    return encode(render(LINES).image, "PNG")


@pytest.fixture(scope="module")
def old(server, tmp_path_factory):
    """The old version's instance; its callers' key is the canaries' too (the fleet's keys are the same)."""
    srv = Server(
        tmp_path_factory.mktemp("old"), api_keys_file=str(server.keys_file), log_level="debug"
    ).start()
    srv.key = server.key
    yield srv
    assert srv.stop() == 0, srv.logs()[-2000:]


@pytest.fixture(scope="module")
def misreading(server, tmp_path_factory):
    """A canary whose model reads vowels as other vowels."""
    root = tmp_path_factory.mktemp("models")
    model = misreading_revision(wheel_revision(root / "good"), root / "misread", letters="aeiou")
    srv = Server(root / "srv", model_path=str(model), api_keys_file=str(server.keys_file)).start()
    yield srv
    assert srv.stop() == 0, srv.logs()[-2000:]


def shadow_to(srv: Server, canary_url: str, share: float = 1.0) -> None:
    srv.shadow_file.write_text(json.dumps({"url": canary_url + "/v1/ocr", "share": share}))


def counts(srv: Server) -> dict[str, float]:
    m = srv.metrics()
    out = {o: m[f'ocr_shadow_requests_total{{outcome="{o}"}}'] for o in OUTCOMES}
    return out | {
        "chars": m["ocr_shadow_reference_chars_total"],
        "edits": m["ocr_shadow_edit_distance_total"],
    }


def replays(srv: Server) -> float:
    c = counts(srv)
    return sum(c[o] for o in OUTCOMES)


def wait_replays(srv: Server, total: float, timeout: float = 30) -> dict[str, float]:
    """Poll /metrics until `total` sampled requests have an outcome (the replays run after the answers)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        c = counts(srv)
        if sum(c[o] for o in OUTCOMES) >= total:
            return c
        time.sleep(0.05)
    raise TimeoutError(f"{total} replays not done within {timeout} s: {counts(srv)}")


def eventually(predicate, timeout: float = 30) -> bool:
    """What a server writes once its answer is sent (its access line, its counters, a replay's warning) may
    come just after the client has the answer: poll for it, bounded."""
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


def ocr_ok(srv: Server, png: bytes, **kw) -> dict:
    r = srv.ocr(png, "image/png", **kw)
    assert r.status_code == 200, r.text
    return r.json()


def flat(text: str) -> str:
    return "".join(text.split())


def test_replays_to_a_canary_of_the_same_model_read_the_same(old, server, png):
    shadow_to(old, server.url)
    before = counts(old)
    canary_requests = server.metrics().get('ocr_requests_total{code="200"}', 0)
    n = replays(old)
    # Bearer and X-API-Key, raw and multipart, query parameters: each replayed as the client sent it. One
    # request at a time, each replay waited for: shadow_max_inflight is 1.
    answers = [ocr_ok(old, png, params={"pages": "1", "preview": "true"})]
    n = wait_replays(old, n + 1)
    answers.append(ocr_ok(old, png, key=None, headers={"X-API-Key": old.key}))
    n = wait_replays(old, sum(n[o] for o in OUTCOMES) + 1)
    with old.client() as c:
        r = c.post("/v1/ocr", files={"file": ("invoice.png", png, "image/png")})
    assert r.status_code == 200, r.text
    answers.append(r.json())
    after = wait_replays(old, sum(n[o] for o in OUTCOMES) + 1)

    assert after["compared"] - before["compared"] == 3, after
    assert after["edits"] == before["edits"] and after["chars"] - before["chars"] >= 3 * len(
        flat("".join(LINES))
    )
    assert eventually(
        lambda: server.metrics().get('ocr_requests_total{code="200"}', 0) - canary_requests == 3
    )
    # The same request id on both sides (`journalctl REQUEST_ID=` finds both); no text in the old one's log.
    assert eventually(lambda: all(a["request_id"] in server.logs() for a in answers))
    # Words, not numbers: a timestamp or a request id may hold any 4 digits.
    assert "Invoice" not in old.logs() and "EUR" not in old.logs()
    assert '"outcome": "compared"' in old.logs()  # the debug line per replay: figures only


def test_a_misreading_canary_is_measured_and_the_clients_get_the_old_answers(old, misreading, png):
    shadow_to(old, misreading.url)
    before = counts(old)
    for i in range(3):
        page = ocr_ok(old, png)["pages"][0]
        assert flat(page["text"]) == flat("".join(LINES)), page["text"]  # ours, not the canary's
        after = wait_replays(old, sum(before[o] for o in OUTCOMES) + i + 1)
    assert after["compared"] - before["compared"] == 3
    edits, chars = after["edits"] - before["edits"], after["chars"] - before["chars"]
    assert edits > 0 and chars > 0, after
    assert eventually(lambda: misreading.metrics().get('ocr_requests_total{code="200"}', 0) == 3)


def test_an_unreachable_canary_counts_failures_and_the_clients_are_answered(old, png):
    shadow_to(old, f"http://127.0.0.1:{free_port()}")  # nothing listens there
    before = counts(old)
    for i in range(2):
        ocr_ok(old, png)
        after = wait_replays(old, sum(before[o] for o in OUTCOMES) + i + 1)
    assert after["failed"] - before["failed"] == 2 and after["compared"] == before["compared"]


def _no_replays_until_a_marker(old, png) -> None:
    """Two requests while replays are off, then one with a control file again: only that one is replayed."""
    n = replays(old)
    served = old.metrics().get('ocr_requests_total{code="200"}', 0)
    ocr_ok(old, png)
    ocr_ok(old, png)
    # Both counted, so both offers were made (just after each answer) before the control file comes back.
    assert eventually(lambda: old.metrics().get('ocr_requests_total{code="200"}', 0) == served + 2)
    shadow_to(old, f"http://127.0.0.1:{free_port()}")
    ocr_ok(old, png)
    wait_replays(old, n + 1)
    assert replays(old) == n + 1


def test_an_answer_in_another_format_is_not_replayed(old, server, png):
    # The canary's comparison reads JSON: a request for text or Markdown (format= or Accept) is answered in
    # it and not replayed, neither as it came nor as a request for JSON.
    shadow_to(old, server.url)
    n = replays(old)
    served = old.metrics().get('ocr_requests_total{code="200"}', 0)
    text = old.ocr(png, "image/png", params={"format": "text"})
    md = old.ocr(png, "image/png", headers={"Accept": "text/markdown"})
    assert (text.status_code, md.status_code) == (200, 200), (text.text, md.text)
    assert text.headers["content-type"].startswith("text/plain") and "Invoice" in text.text
    assert md.headers["content-type"].startswith("text/markdown") and "Invoice" in md.text
    assert eventually(lambda: old.metrics().get('ocr_requests_total{code="200"}', 0) == served + 2)
    ocr_ok(old, png)  # JSON: replayed
    wait_replays(old, n + 1)
    assert replays(old) == n + 1


def test_no_control_file_no_replays(old, png):
    shadow_to(old, f"http://127.0.0.1:{free_port()}")
    n = replays(old)
    ocr_ok(old, png)
    wait_replays(old, n + 1)  # on, then
    old.shadow_file.unlink()
    _no_replays_until_a_marker(old, png)


def test_an_invalid_control_file_turns_replays_off_with_one_warning(old, png):
    old.shadow_file.write_text('{"url": "https://canary/v1/ocr", "share": 2}')
    warnings = old.logs().count("invalid control file")
    _no_replays_until_a_marker(old, png)
    assert old.logs().count("invalid control file") == warnings + 1  # once, not once per request


def test_a_ca_file_that_comes_after_the_start_is_used(server, png, tmp_path):
    """On a host being set up the fleet CA (nginx_tls) may come after the app's first start: replays start
    once the CA is there and the control file changes, with no restart."""
    ca = tmp_path / "ca.crt"
    srv = Server(tmp_path / "srv", api_keys_file=str(server.keys_file), shadow_ca_file=str(ca)).start()
    srv.key = server.key
    try:
        shadow_to(srv, server.url)
        ocr_ok(srv, png)
        assert eventually(lambda: "cannot load shadow_ca_file" in srv.logs())
        assert srv.logs().count("cannot load shadow_ca_file") == 1 and replays(srv) == 0
        ca.write_text(Path(certifi.where()).read_text())  # any CA bundle: the canary here is plain HTTP
        shadow_to(srv, server.url)  # written again (a new mtime), as each canary step does
        ocr_ok(srv, png)
        assert wait_replays(srv, 1)["compared"] == 1
    finally:
        assert srv.stop() == 0, srv.logs()[-2000:]


@pytest.fixture(scope="module")
def old_chat(server, tmp_path_factory):
    """The old version's instance with shadow_route: chat."""
    srv = Server(
        tmp_path_factory.mktemp("old-chat"),
        api_keys_file=str(server.keys_file),
        log_level="debug",
        shadow_route="chat",
    ).start()
    srv.key = server.key
    yield srv
    assert srv.stop() == 0, srv.logs()[-2000:]


def chat_requests(srv: Server) -> float:
    return srv.metrics().get('ocr_chat_requests_total{code="200"}', 0)


def test_with_shadow_route_chat_the_canarys_chat_answer_is_compared(old_chat, server, misreading, png):
    # A raw document goes to the canary's /v1/chat/completions; its Markdown matches ours (no edits), and a
    # canary that misreads is measured through that route. A multipart body is replayed to /v1/ocr.
    shadow_to(old_chat, server.url)
    before, canary_chats = counts(old_chat), chat_requests(server)
    answer = ocr_ok(old_chat, png)
    after = wait_replays(old_chat, sum(before[o] for o in OUTCOMES) + 1)
    assert after["compared"] - before["compared"] == 1 and after["edits"] == before["edits"], after
    assert after["chars"] - before["chars"] >= len(flat("".join(LINES)))
    assert eventually(lambda: chat_requests(server) - canary_chats == 1)
    assert eventually(lambda: answer["request_id"] in server.logs())

    with old_chat.client() as c:
        r = c.post("/v1/ocr", files={"file": ("invoice.png", png, "image/png")})
    assert r.status_code == 200, r.text
    after = wait_replays(old_chat, sum(after[o] for o in OUTCOMES) + 1)
    assert after["compared"] - before["compared"] == 2 and after["edits"] == before["edits"], after
    assert chat_requests(server) - canary_chats == 1  # the multipart one went to /v1/ocr

    shadow_to(old_chat, misreading.url)
    before, canary_chats = after, chat_requests(misreading)
    ocr_ok(old_chat, png)
    after = wait_replays(old_chat, sum(before[o] for o in OUTCOMES) + 1)
    assert after["compared"] - before["compared"] == 1 and after["edits"] > before["edits"], after
    assert eventually(lambda: chat_requests(misreading) - canary_chats == 1)
