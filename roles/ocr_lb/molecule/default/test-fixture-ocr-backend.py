#!/usr/bin/env python3
"""TEST FIXTURE (Molecule, role ocr_lb): a stand-in for the ocr-app of one app host, behind nginx_tls.

Listens on 127.0.0.1:<port> (stdlib only, no OCR):
- GET /healthz: 200 {"status": "ready"}, or 503 {"status": "draining"} while the drain file exists
  (as the app).
- POST /v1/ocr: reads the body, then answers JSON naming this host and echoing the X-Request-ID, X-Real-IP and
  X-Forwarded-For it received. `?hold=1` answers only once the release file exists (a long OCR that
  ends when the test says so); `?die=1` closes the connection without answering (a crash after the request
  arrived).
- GET /fixture/seen?request_id=ID: how many POSTs with that request id reached this host (replays show
  up here).
"""

import json
import socket
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

DRAIN_FILE = Path("/run/ocr-app/drain")
RELEASE_FILE = Path("/run/ocr-app/fixture-release")
HOLD_LIMIT_S = 120  # a test that never releases still gets its answer
HOST = socket.gethostname()
SEEN: Counter = Counter()
SEEN_LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as nginx's upstream keepalive expects
    server_version = "ocr-backend-fixture"

    def _send(self, status, body):
        data = (json.dumps(body) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.headers.get("X-Request-ID"):
            self.send_header("X-Request-ID", self.headers["X-Request-ID"])
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        url = urlsplit(self.path)
        if url.path == "/healthz":
            draining = DRAIN_FILE.exists()
            self._send(
                503 if draining else 200, {"status": "draining" if draining else "ready", "host": HOST}
            )
        elif url.path == "/fixture/seen":
            rid = parse_qs(url.query).get("request_id", [""])[0]
            with SEEN_LOCK:
                count = SEEN[rid]
            self._send(200, {"host": HOST, "request_id": rid, "count": count})
        else:
            self._send(404, {"error": {"code": "not_found", "message": "no such route", "request_id": None}})

    def do_POST(self):
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        remaining = int(self.headers.get("Content-Length") or 0)
        while remaining > 0:
            chunk = self.rfile.read(min(remaining, 1 << 20))
            if not chunk:
                break
            remaining -= len(chunk)
        if url.path != "/v1/ocr":
            self._send(404, {"error": {"code": "not_found", "message": "no such route", "request_id": None}})
            return
        rid = self.headers.get("X-Request-ID") or ""
        with SEEN_LOCK:
            SEEN[rid] += 1
        if query.get("die") == ["1"]:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if query.get("hold") == ["1"]:
            deadline = time.monotonic() + HOLD_LIMIT_S
            while not RELEASE_FILE.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        self._send(
            200,
            {
                "fixture": "ocr-backend",
                "host": HOST,
                "request_id_received": rid or None,
                "real_ip": self.headers.get("X-Real-IP"),
                "forwarded_for": self.headers.get("X-Forwarded-For"),
                "forwarded_proto": self.headers.get("X-Forwarded-Proto"),
            },
        )

    def log_message(self, fmt, *args):
        sys.stderr.write("fixture: " + (fmt % args) + "\n")


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
