"""Webhooks for bulk jobs: a POST to the job's `webhook_url` once it is finished (done, failed, cancelled).

Submit: `webhook_url` must lie under one of the prefixes of `job_webhook_allowed_urls` (`allowed`): the same
scheme (http or https), host and port, and a path inside the prefix's path; no user info. The URL is
checked again before every attempt (the setting may have changed since).

Delivery (worker.py's senders, deliveries.py's `ocr_job_webhooks` rows): any instance claims a due delivery
with a lease, POSTs `payload(...)` signed with the job's API key's secret (`sign`), and records the outcome:
2xx delivered; 5xx, a time-out or no connection: retried after `backoff(...)` until
job_webhook_max_attempts; 3xx (redirects are never followed) and 4xx: failed at once.

Signing: the server holds only sha256(key) of each API key (ocr_app/auth.py), so that hex digest is the
secret; the client computes it from its own key. `X-OCR-Signature: t=<unix seconds>,v1=<hex>` where
v1 = HMAC-SHA256(secret as ASCII, f"{t}.".encode() + body). Receivers call `verify(secret, header, body)`.

Which webhook URLs are allowed is ocr_app/urls.py's. This module imports nothing of the app: receivers (and
the CLI) can import `verify` alone.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import time
from typing import Any

EVENT = "job.finished"
ID_HEADER = "X-OCR-Webhook-Id"
SIGNATURE_HEADER = "X-OCR-Signature"
MAX_BACKOFF_S = 900.0  # 15 min: a receiver that is down for hours still hears within 15 min of its return


def secret_for_key(key: str) -> str:
    """The signing secret of an API key: its sha256 as lowercase hex (what the server's keys file holds)."""
    return hashlib.sha256(key.encode()).hexdigest()


def _mac(secret: str, t: int, body: bytes) -> str:
    return hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()


def sign(secret: str, body: bytes, t: int | None = None) -> str:
    """The X-OCR-Signature header's value for this body, at t (unix seconds; default now)."""
    t = int(time.time()) if t is None else t
    return f"t={t},v1={_mac(secret, t, body)}"


def verify(
    secret: str, header: str | None, body: bytes, tolerance_s: float = 300, now: float | None = None
) -> bool:
    """True when `header` (X-OCR-Signature) signs exactly `body` with `secret`, at a time within
    tolerance_s of now (a replayed old delivery is refused). Constant-time; any v1 entry may match."""
    if not header:
        return False
    t: int | None = None
    macs: list[str] = []
    for part in header.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep:
            return False
        if name == "t":
            if not (value.isascii() and value.isdigit()) or len(value) > 12:
                return False
            t = int(value)
        elif name == "v1":
            macs.append(value)
    if t is None or not macs:
        return False
    if abs((time.time() if now is None else now) - t) > tolerance_s:
        return False
    expected = _mac(secret, t, body)
    return any(hmac.compare_digest(expected, m) for m in macs)


# --- what is sent, and when again ---------------------------------------------------------------------------


def payload(status: dict[str, Any], status_url: str, result_url: str) -> bytes:
    """The body: the status route's fields (`store.status`'s dict), flattened, and the job's URLs."""
    return json.dumps(
        {
            "event": EVENT,
            "job_id": status["job_id"],
            "status": status["status"],
            "pages_total": status["pages"]["total"],
            "pages_done": status["pages"]["done"],
            "pages_failed": status["pages"]["failed"],
            "finished_at": status["finished_at"],
            "status_url": status_url,
            "result_url": result_url,
        },
        separators=(",", ":"),
    ).encode()


def backoff(attempts: int, base_s: float, rng: random.Random | None = None) -> float:
    """Seconds before the next attempt after `attempts` failed ones: base, doubled each time, capped at
    15 min, then jittered down by up to half (receivers coming back are not hit by every sender at once)."""
    delay: float = min(MAX_BACKOFF_S, base_s * 2 ** max(0, attempts - 1))
    return delay * (rng.uniform(0.5, 1.0) if rng is not None else random.uniform(0.5, 1.0))  # noqa: S311 - spreading retries: no secret


def headers(delivery_id: str, body: bytes, secret: str | None) -> dict[str, str]:
    out = {"Content-Type": "application/json", ID_HEADER: delivery_id, "User-Agent": "ocr-app-webhook"}
    if secret is not None:
        out[SIGNATURE_HEADER] = sign(secret, body)
    return out


def classify(status_code: int) -> str:
    """delivered (2xx), retry (5xx) or failed (anything else: 3xx is never followed, 4xx is final)."""
    if 200 <= status_code < 300:
        return "delivered"
    if status_code >= 500:
        return "retry"
    return "failed"
