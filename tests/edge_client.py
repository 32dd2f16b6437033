"""Edge limits as a client meets them: the one client of the nginx_tls and ocr_lb Molecule verifies.

python3 -m tests.edge_client ADDRESS CAFILE MODE [ARGS] prints JSON:
  held N [--key]     N POST /v1/ocr?hold=1 at once, each on its own HTTPS connection (the stand-in backends
                     hold them until the test releases them): a list of post's results once all answered
  post [--key]       one POST /v1/ocr: {status, code, host, server, retry_after}
  squat N            N sockets that never start TLS and N that finish TLS and send part of a header block, all
                     held open, from this address; then one POST: {squatted: 2N, post: post's result}
  errors             malformed and refused requests, each on its own connection (HTTPS, plain HTTP to the
                     HTTPS port, the plain HTTP port): {case: {status, json, code, request_id}}; request_id
                     is true when the body's request id is the X-Request-ID header's
  drip-body WAIT     a POST's whole header block announcing a 1000-byte body, then one body byte, then nothing
  drip-header WAIT   a request line and one header, then nothing (slowloris)
--key sends `Authorization: Bearer <key>` (the stand-ins take any key). The drip modes report what the server
did within WAIT seconds: {outcome: "status 408" (the status line it sent) | "closed" | "open", waited_s}; only
"open" means the server kept the slow client. WAIT is the server's timeout plus a margin, never an assertion.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import sys
import time
from concurrent.futures import ThreadPoolExecutor

PORT = 443
HTTP_PORT = 80
KEY = "Bearer ocr_edge-client-test-key"


def post(address: str, context: ssl.SSLContext, query: str = "", key: bool = False) -> dict:
    conn = http.client.HTTPSConnection(address, PORT, context=context, timeout=200)
    headers = {"Content-Type": "image/png", **({"Authorization": KEY} if key else {})}
    try:
        conn.request("POST", "/v1/ocr" + query, body=b"x", headers=headers)
        resp = conn.getresponse()
        try:
            data = json.loads(resp.read())
        except ValueError:
            data = {}
        error = data.get("error") or {}
        return {
            "status": resp.status,
            "code": error.get("code"),
            "host": data.get("host"),
            # nginx names itself; HAProxy's own answers carry no Server header.
            "server": resp.getheader("Server"),
            "retry_after": resp.getheader("Retry-After"),
        }
    except OSError as err:
        return {"status": None, "code": None, "host": None, "error": str(err)}
    finally:
        conn.close()


def drip(address: str, context: ssl.SSLContext, head: bytes, wait_s: float) -> dict:
    """Send `head`, then nothing; what the server does within wait_s."""
    start = time.monotonic()
    with (
        socket.create_connection((address, PORT), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=address) as tls,
    ):
        tls.sendall(head)
        tls.settimeout(wait_s)
        try:
            data = tls.recv(4096)
        except TimeoutError:
            outcome = "open"
        except (ConnectionError, ssl.SSLError):
            outcome = "closed"
        else:
            outcome = "status " + data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "closed"
    return {"outcome": outcome, "waited_s": round(time.monotonic() - start, 1)}


def squat(address: str, context: ssl.SSLContext, n: int, head: bytes) -> dict:
    """n idle sockets before TLS and n after it with a partial header block, held while one POST is sent."""
    held: list[socket.socket] = []
    try:
        for _ in range(n):
            held.append(socket.create_connection((address, PORT), timeout=10))
        for _ in range(n):
            raw = socket.create_connection((address, PORT), timeout=10)
            tls = context.wrap_socket(raw, server_hostname=address)
            held.append(tls)
            tls.sendall(head)
        return {"squatted": len(held), "post": post(address, context)}
    finally:
        for s in held:
            s.close()


def _raw(address: str, port: int, context: ssl.SSLContext | None, request: bytes) -> dict:
    """One raw request on its own connection: what came back (its status, JSON error shape, request id)."""
    with socket.create_connection((address, port), timeout=10) as raw:
        conn = context.wrap_socket(raw, server_hostname=address) if context else raw
        # Refused before it was all sent: its answer may be there all the same.
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            conn.sendall(request)
        data = b""
        try:
            while len(data) < 65536 and (chunk := conn.recv(65536)):
                data += chunk
        except (TimeoutError, ConnectionError, ssl.SSLError):
            pass
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    status = int(lines[0].split(" ", 2)[1]) if lines[0].startswith("HTTP/") else None
    try:
        error = json.loads(body.split(b"\n", 1)[0])["error"]
    except (ValueError, KeyError, TypeError):
        error = None
    return {
        "status": status,
        "json": headers.get("content-type", "").startswith("application/json") and error is not None,
        "code": error.get("code") if error else None,
        "request_id": bool(error) and error.get("request_id") == headers.get("x-request-id") != "",
    }


def errors(address: str, context: ssl.SSLContext) -> dict:
    host = f"Host: {address}\r\n".encode()
    tls = {
        "broken request line": b"GARBAGE\r\n\r\n",
        # Over nginx's 8 kB large_client_header_buffers, small enough to be sent whole before it answers.
        "header block too large": b"GET / HTTP/1.1\r\n" + host + b"X-Big: " + b"a" * 9000 + b"\r\n\r\n",
        "URI too long": b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n" + host + b"\r\n",
        "unknown HTTP version": b"GET / HTTP/3.0\r\n" + host + b"\r\n",
        "TRACE": b"TRACE / HTTP/1.1\r\n" + host + b"\r\n",
        "unknown transfer coding": b"POST /v1/ocr HTTP/1.1\r\n" + host + b"Transfer-Encoding: foo\r\n\r\n",
        "error page asked for": b"GET /ocrfleet-error/400 HTTP/1.1\r\n" + host + b"Connection: close\r\n\r\n",
    }
    plain = {
        "plain: broken request line": b"GARBAGE\r\n\r\n",
        "plain: URI too long": b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n" + host + b"\r\n",
        # The body is never sent: the redirect comes first, not a 413.
        "plain: large POST": b"POST /v1/jobs HTTP/1.1\r\n" + host + b"Content-Length: 5000000\r\n\r\n",
    }
    out = {name: _raw(address, PORT, context, req) for name, req in tls.items()}
    out["plain HTTP to the HTTPS port"] = _raw(address, PORT, None, b"GET / HTTP/1.1\r\n" + host + b"\r\n")
    out.update({name: _raw(address, HTTP_PORT, None, req) for name, req in plain.items()})
    return out


def main() -> None:
    address, cafile, mode, *args = sys.argv[1:]
    context = ssl.create_default_context(cafile=cafile)
    key = "--key" in args
    args = [a for a in args if a != "--key"]
    host_line = f"Host: {address}\r\n".encode()
    out: object
    if mode == "held":
        n = int(args[0])
        with ThreadPoolExecutor(n) as pool:
            out = list(pool.map(lambda _: post(address, context, "?hold=1", key), range(n)))
    elif mode == "post":
        out = post(address, context, key=key)
    elif mode == "squat":
        out = squat(address, context, int(args[0]), b"POST /v1/ocr HTTP/1.1\r\n" + host_line)
    elif mode == "errors":
        out = errors(address, context)
    elif mode == "drip-body":
        head = b"POST /v1/ocr HTTP/1.1\r\n" + host_line + b"Content-Length: 1000\r\n\r\nx"
        out = drip(address, context, head, float(args[0]))
    elif mode == "drip-header":
        out = drip(address, context, b"POST /v1/ocr HTTP/1.1\r\n" + host_line, float(args[0]))
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
