"""Log records as journal entries (ocr_app/logs.py): fields, priorities, the human line, and the native
protocol as logging-journald's transport writes it, read back from a datagram socket the test owns.
The same, against a real journald, is checked on a lab host by roles/ocr_app's Molecule scenario."""

from __future__ import annotations

import logging
import os
import socket
import struct

import pytest

from ocr_app import logs


def record(level=logging.INFO, msg="request", name="ocr_app.access", exc_info=None, **extra):
    r = logging.LogRecord(name, level, __file__, 42, msg, None, exc_info)
    r.__dict__.update(extra)
    return r


ACCESS = dict(caller="fleet", engine="rapidocr", method="POST", route="/v1/ocr", status=200, pages=1)


def test_access_line_reads_as_a_sentence():
    assert logs.summary(record(duration_ms=1612.0, **ACCESS)) == "POST /v1/ocr 200 1.6 s 1 page caller=fleet"
    line = logs.summary(
        record(duration_ms=12.5, **{**ACCESS, "status": 413, "pages": 3}, error="too_many_pages")
    )
    assert line == "POST /v1/ocr 413 12.5 ms 3 pages caller=fleet error=too_many_pages"
    assert logs.summary(record(logging.ERROR, "keeping previous API keys: %s", "ocr_app.auth")) == (
        "keeping previous API keys: %s"
    )


def test_fields_are_searchable_names_and_levels_are_priorities():
    fields = dict(
        logs.journal_fields(record(request_id="abc", duration_ms=5.0, bytes=None, **ACCESS), "ocr-app@0")
    )
    assert fields["PRIORITY"] == 6 and fields["SYSLOG_IDENTIFIER"] == "ocr-app@0"
    assert fields["LOGGER"] == "ocr_app.access" and fields["CODE_LINE"] == 42
    assert (fields["REQUEST_ID"], fields["CALLER"], fields["ROUTE"], fields["STATUS"]) == (
        "abc",
        "fleet",
        "/v1/ocr",
        200,
    )
    assert (fields["DURATION_MS"], fields["PAGES"], fields["ENGINE"]) == (5.0, 1, "rapidocr")
    assert "BYTES" not in fields  # None: left out
    expected = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}
    for level, priority in expected.items():
        assert dict(logs.journal_fields(record(level, "x", "ocr_app.api"), "i"))["PRIORITY"] == priority
    odd = dict(logs.journal_fields(record(**{"_private": 1, "job-id": "j1", "message_x": 2}), "i"))
    assert odd["PRIVATE"] == 1 and odd["JOB_ID"] == "j1" and odd["MESSAGE_X"] == 2


def read_native(datagram: bytes) -> dict[str, str]:
    """journald's native protocol: KEY=value lines, or KEY, newline, 64-bit length, bytes, newline."""
    out, i = {}, 0
    while i < len(datagram):
        nl = datagram.index(b"\n", i)
        line = datagram[i:nl]
        if b"=" in line:
            k, v = line.split(b"=", 1)
            out[k.decode()], i = v.decode(), nl + 1
        else:
            (n,) = struct.unpack("<Q", datagram[nl + 1 : nl + 9])
            out[line.decode()], i = datagram[nl + 9 : nl + 9 + n].decode(), nl + 9 + n + 1
    return out


@pytest.fixture
def journal_socket(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "socket"))
    sock.settimeout(5)
    yield sock, tmp_path / "socket"
    sock.close()


def test_the_transport_writes_our_fields_in_the_native_protocol(journal_socket, monkeypatch):
    from logging_journald import JournaldTransport

    sock, path = journal_socket
    monkeypatch.setattr(JournaldTransport, "SOCKET_PATH", path)
    handler = logs.JournalHandler("ocr-app@1")
    handler.addFilter(logs._RequestIdFilter())
    token = logs.request_id_var.set("rid-7")
    try:
        raise ValueError("bad\nthing")
    except ValueError as err:
        handler.handle(
            record(logging.ERROR, "unhandled error", "ocr_app.api", (ValueError, err, err.__traceback__))
        )
    finally:
        logs.request_id_var.reset(token)
    entry = read_native(sock.recv(65536))
    assert (entry["MESSAGE"], entry["PRIORITY"], entry["REQUEST_ID"]) == ("unhandled error", "3", "rid-7")
    assert entry["SYSLOG_IDENTIFIER"] == "ocr-app@1"
    assert "ValueError: bad\nthing" in entry["TRACEBACK"]  # multi-line: the length-prefixed form


def test_journald_is_used_only_when_it_holds_our_output(monkeypatch):
    st = os.fstat(1)
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    assert logs.under_journald()
    # An inode neither stdout nor stderr has (pytest's capture files are often consecutive inodes).
    other = max(st.st_ino, os.fstat(2).st_ino) + 1
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{other}")
    assert not logs.under_journald()
    monkeypatch.delenv("JOURNAL_STREAM")
    assert not logs.under_journald()
