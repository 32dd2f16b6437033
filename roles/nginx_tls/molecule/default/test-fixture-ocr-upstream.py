#!/usr/bin/env python3
"""TEST FIXTURE (Molecule, role nginx_tls): a stand-in for an ocr-app instance behind nginx.

Listens on 127.0.0.1:<port>; answers GET /healthz, GET /metrics and POST /v1/ocr with JSON that echoes the
X-Request-ID header it received (and the body size), so the tests can see what nginx passed on.
`POST /v1/ocr?hold=1` answers only after the next GET /fixture/release (requests in progress for as long as
the test needs, e.g. to fill a connection limit); GET /fixture/held says how many are held.
Not the real app: stdlib only, no OCR.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOLD_LIMIT_S = 120  # a test that never releases still gets its answer
RELEASED = threading.Condition()
STATE = {"generation": 0, "held": 0}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as nginx's upstream keepalive expects
    server_version = "ocr-upstream-fixture"

    def _send(self, status, body, content_type="application/json"):
        data = body if isinstance(body, bytes) else (json.dumps(body) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if self.headers.get("X-Request-ID"):
            self.send_header("X-Request-ID", self.headers["X-Request-ID"])
        self.end_headers()
        self.wfile.write(data)

    def _echo(self, **extra):
        return {
            "fixture": "ocr-upstream",
            "method": self.command,
            "path": self.path,
            "request_id_received": self.headers.get("X-Request-ID"),
            "forwarded_proto": self.headers.get("X-Forwarded-Proto"),
            **extra,
        }

    def do_GET(self):
        if self.path == "/healthz":
            self._send(200, self._echo(status="ready"))
        elif self.path == "/fixture/held":
            with RELEASED:
                self._send(200, {"held": STATE["held"]})
        elif self.path == "/fixture/release":
            with RELEASED:
                STATE["generation"] += 1
                RELEASED.notify_all()
            self._send(200, {"released": True})
        elif self.path == "/metrics":
            self._send(200, b"# fixture\nocr_model_loaded 1\n", "text/plain; version=0.0.4")
        else:
            self._send(404, {"error": {"code": "not_found", "message": "no such route", "request_id": None}})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        remaining = length
        while remaining > 0:
            chunk = self.rfile.read(min(remaining, 1 << 20))
            if not chunk:
                break
            remaining -= len(chunk)
        path, _, query = self.path.partition("?")
        if path == "/v1/ocr" and query == "hold=1":
            with RELEASED:
                generation = STATE["generation"]
                STATE["held"] += 1
                RELEASED.wait_for(lambda: STATE["generation"] != generation, timeout=HOLD_LIMIT_S)
                STATE["held"] -= 1
        if path == "/v1/ocr":
            self._send(200, self._echo(bytes=length - remaining))
        else:
            self._send(404, {"error": {"code": "not_found", "message": "no such route", "request_id": None}})

    def log_message(self, fmt, *args):
        sys.stderr.write("fixture: " + (fmt % args) + "\n")


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
