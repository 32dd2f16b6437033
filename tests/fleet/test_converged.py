"""The fleet as site.yml left it (`make test-fleet`), verified from outside before any upgrade changes it:
HTTPS through each host's nginx with the fleet's CA, README.md's `openai` client code through HAProxy and
nginx (plain and streamed), only modern TLS, the firewall, the request in the journal as fields (no document
text) and its way LB -> nginx -> app, the GPU metrics timer, and a second converge that changes nothing.

The per-role paths site.yml does not take in the lab (the NVIDIA driver from a signed repository, check
mode) are each role's Molecule scenario; here the roles meet on one fleet.
"""

from __future__ import annotations

import json
import socket
import ssl
import time

import jiwer
import pytest

from lab.base import wait_until
from tests import old_tls
from tests.docs import TEXTS, encode, render
from tests.readme import run_chat_snippet

from .conftest import https_client, say

pytestmark = [pytest.mark.lab, pytest.mark.timeout(1200)]

APP_PORT = 8000
GPU_METRICS = "/var/lib/prometheus/node-exporter/ocr_gpu.prom"


def test_https_ocr_through_each_hosts_nginx(fleet):
    doc = render(TEXTS["en"])
    for host in fleet.apps:
        with https_client(fleet, host) as c:
            headers = {"Content-Type": "image/png", "X-Request-ID": f"converged-{host}"}
            r = c.post("/v1/ocr", content=encode(doc.image, "PNG"),
                       headers={**headers, "Authorization": f"Bearer {fleet.key}"})  # fmt: skip
            assert r.status_code == 200, r.text
            text = r.json()["pages"][0]["text"]
            assert jiwer.cer("".join(doc.text.split()), "".join(text.split())) < 0.02, host
            assert r.headers["x-request-id"] == f"converged-{host}"
            r = c.post("/v1/ocr", content=encode(doc.image, "PNG"), headers={"Content-Type": "image/png"})
            assert r.status_code == 401
            assert r.json()["error"]["code"] == "unauthorized"


def test_the_readmes_openai_snippet_through_haproxy_and_nginx(fleet, tmp_path):
    # README.md's block as it stands (tests/readme.py), against the load balancer's address with the fleet's
    # key and CA as `make demo` leaves them: the plain answer, then the streamed one, the same text.
    doc = render(TEXTS["en"][:2], size=32, width=1000)
    out = run_chat_snippet(fleet.lb_url, fleet.key, fleet.ca_file, encode(doc.image, "PNG"), tmp_path)
    plain, streamed = out[: len(out) // 2], out[len(out) // 2 :]
    assert plain == streamed and plain.endswith("\n"), out
    got = "".join(plain.replace("\\", "").split()).lower()  # the Markdown's escapes dropped
    assert jiwer.cer("".join(doc.text.split()).lower(), got) < 0.05, out


def test_journal_has_the_request_as_fields_without_document_text(fleet):
    host = fleet.apps[0]

    def entries(*match: str) -> list[dict]:
        argv = ["journalctl", "-u", "ocr-app@0", *match, "-o", "json", "--no-pager"]
        return [json.loads(x) for x in fleet.lab.exec(host, argv).stdout.splitlines()]

    access = [e for e in entries(f"REQUEST_ID=converged-{host}") if e.get("LOGGER") == "ocr_app.access"]
    assert any((e["ROUTE"], e["STATUS"], e["PRIORITY"]) == ("/v1/ocr", "200", "6") for e in access), access
    # The entries' own fields (journald's `_`/`__` ones are its ids and timestamps).
    own = "\n".join(str(v) for e in entries() for k, v in e.items() if not k.startswith("_"))
    assert own
    for line in TEXTS["en"]:
        assert line not in own


def test_one_requests_way_through_the_fleet_in_the_journal(fleet):
    """docs/operations.md's "One request's way": with the id from the response, `journalctl REQUEST_ID=<id>`
    on the LB names the app host (`UPSTREAM`), and the same command there shows nginx's entry and the
    app's."""
    with fleet.client() as c:
        r = c.post(
            "/v1/ocr", content=encode(render(TEXTS["en"]).image, "PNG"), headers={"Content-Type": "image/png"}
        )
    assert r.status_code == 200, r.text
    rid = r.headers["x-request-id"]

    def way(host: str, *idents: str) -> dict[str, dict]:
        """The request's entries on `host` by SYSLOG_IDENTIFIER (of the app's, its access entry), once all
        of `idents` are there."""

        def read() -> dict[str, dict] | None:
            argv = ["journalctl", f"REQUEST_ID={rid}", "-o", "json", "--no-pager"]
            found = [json.loads(x) for x in fleet.lab.exec(host, argv).stdout.splitlines()]
            by = {
                e["SYSLOG_IDENTIFIER"].split("@")[0]: e
                for e in found
                if e.get("LOGGER", "ocr_app.access") == "ocr_app.access"
            }
            return by if set(idents) <= set(by) else None

        # The relay's rsyslogd writes nginx's and HAProxy's entries a moment after the response.
        return wait_until(read, 30, f"{idents} entries of {rid} on {host}", 0.5)

    lb = way("lb-1", "haproxy")["haproxy"]
    assert (lb["ROUTE"], lb["STATUS"], lb["PRIORITY"]) == ("/v1/ocr", "200", "6"), lb
    assert lb["UPSTREAM"] in fleet.apps, lb
    on_host = way(lb["UPSTREAM"], "nginx", "ocr-app")
    assert (on_host["nginx"]["ROUTE"], on_host["nginx"]["STATUS"]) == ("/v1/ocr", "200"), on_host
    app = on_host["ocr-app"]
    assert (app["ROUTE"], app["STATUS"], app["CALLER"]) == ("/v1/ocr", "200", "fleet"), app


def test_only_modern_tls(fleet):
    address = fleet.lab.host(fleet.apps[0]).address
    for modern in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):  # the same client completes these
        assert old_tls.handshake(address, 443, modern) == f"ok {modern.name.replace('_', '.')}"
    outcomes = old_tls.old_versions(address)
    assert all(map(old_tls.refused, outcomes.values())), outcomes


def connect_result(address: str, port: int, timeout: float = 3.0) -> str:
    with socket.socket() as s:
        s.settimeout(timeout)
        try:
            s.connect((address, port))
        except ConnectionRefusedError:
            return "refused"
        except TimeoutError:
            return "dropped"
        return "open"


def test_firewall_from_the_controller(fleet):
    address = fleet.lab.host(fleet.apps[0]).address
    assert connect_result(address, 443) == "open"
    assert connect_result(address, 22) == "open"
    assert connect_result(address, APP_PORT) != "open"  # the app's own port is never reachable
    assert connect_result(address, 8081) == "dropped"  # a port not in the ruleset: silently dropped


def test_gpu_metrics_textfile_is_refreshed_by_the_timer(fleet):
    for host in fleet.apps:  # GPU-less lab hosts: the exporter says so instead of saying nothing
        assert "ocr_gpu_count 0" in fleet.lab.exec(host, ["cat", GPU_METRICS]).stdout
    host = fleet.apps[0]
    mtime = fleet.lab.exec(host, ["stat", "-c", "%Y", GPU_METRICS]).stdout.strip()
    wait_until(
        lambda: fleet.lab.exec(host, ["stat", "-c", "%Y", GPU_METRICS]).stdout.strip() != mtime,
        90, f"{GPU_METRICS} on {host} refreshed", 0.5,
    )  # fmt: skip


def test_second_converge_changes_nothing(fleet):
    start = time.monotonic()
    again = fleet.playbook("site.yml")
    say(f"idempotent rerun of site.yml on {len(fleet.lab.hosts)} hosts: {time.monotonic() - start:.0f} s")
    changed = [
        f"{e['event_data']['host']}: {e['event_data']['task']}"
        for e in again.events
        if e.get("event") == "runner_on_ok" and e["event_data"].get("res", {}).get("changed")
    ]
    assert changed == []
