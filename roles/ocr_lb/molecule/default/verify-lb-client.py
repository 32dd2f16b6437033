#!/usr/bin/env python3
"""Client for the ocr_lb scenario's verify (runs on the controller): POSTs through the LB, prints JSON.

Usage: verify-lb-client.py ADDRESS CAFILE MODE ARGS
  sequential N   N POSTs one after another
  held           one POST the backend holds until the test releases it (verify.yml starts it in the
                 background and follows it in HAProxy's runtime API)

Each POST is a new HTTPS connection, verified against CAFILE; each result is {status, host, request_id}.
"""

import http.client
import json
import ssl
import sys


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
    elif mode == "held":
        out = [post(address, context, "?hold=1")]
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
