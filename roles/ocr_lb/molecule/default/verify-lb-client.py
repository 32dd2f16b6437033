#!/usr/bin/env python3
"""Client for the ocr_lb scenario's verify (runs on the controller): POSTs through the LB, prints JSON.

Usage: verify-lb-client.py ADDRESS CAFILE MODE ARGS
  sequential N         N POSTs one after another
  concurrent N DELAY   N POSTs at once, each held DELAY seconds by the backend
  leastconn DELAY K    one POST held DELAY seconds, then K quick POSTs while it is in flight

Each POST is a new HTTPS connection, verified against CAFILE; each result is {status, host, request_id}.
"""

import http.client
import json
import ssl
import sys
import threading
import time


def post(address: str, context: ssl.SSLContext, query: str = "") -> dict:
    conn = http.client.HTTPSConnection(address, 443, context=context, timeout=60)
    try:
        conn.request("POST", "/v1/ocr" + query, body=b"x", headers={"Content-Type": "image/png"})
        resp = conn.getresponse()
        body = resp.read()
        try:
            data = json.loads(body)
        except ValueError:
            data = {}
        return {"status": resp.status, "host": data.get("host"), "request_id": resp.getheader("X-Request-ID")}
    except OSError as err:
        return {"status": None, "host": None, "error": str(err)}
    finally:
        conn.close()


def main() -> None:
    address, cafile, mode, *args = sys.argv[1:]
    context = ssl.create_default_context(cafile=cafile)
    if mode == "sequential":
        out: object = [post(address, context) for _ in range(int(args[0]))]
    elif mode == "concurrent":
        results: list = [None] * int(args[0])

        def one(i: int) -> None:
            results[i] = post(address, context, f"?delay={args[1]}")

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(results))]
        for t in threads:
            t.start()
            time.sleep(0.2)
        for t in threads:
            t.join()
        out = results
    elif mode == "leastconn":
        slow: dict = {}
        t = threading.Thread(target=lambda: slow.update(post(address, context, f"?delay={args[0]}")))
        t.start()
        time.sleep(1)
        quick = [post(address, context) for _ in range(int(args[1]))]
        t.join()
        out = {"slow": slow, "quick": quick}
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
