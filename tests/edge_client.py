"""Edge limits as a client meets them: the one client of the nginx_tls and ocr_lb Molecule verifies.

python3 -m tests.edge_client ADDRESS CAFILE MODE [ARGS] prints JSON:
  held N [--key]     N POST /v1/ocr?hold=1 at once, each on its own HTTPS connection (the stand-in backends
                     hold them until the test releases them): a list of post's results once all answered
  post [--key]       one POST /v1/ocr: {status, code, host, server, retry_after}
  squat N            N sockets that never start TLS and N that finish TLS and send part of a header block, all
                     held open, from this address; then one POST: {squatted: 2N, post: post's result}
  drip-body WAIT     a POST's whole header block announcing a 1000-byte body, then one body byte, then nothing
  drip-header WAIT   a request line and one header, then nothing (slowloris)
--key sends `Authorization: Bearer <key>` (the stand-ins take any key). The drip modes report what the server
did within WAIT seconds: {outcome: "status 408" (the status line it sent) | "closed" | "open", waited_s}; only
"open" means the server kept the slow client. WAIT is the server's timeout plus a margin, never an assertion.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import sys
import time
from concurrent.futures import ThreadPoolExecutor

PORT = 443
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
