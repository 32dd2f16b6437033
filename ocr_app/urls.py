"""Which URLs the service may send to: http(s) URLs with a host, without user info, under an allowed prefix.

The one guard for every URL a client names for the service to call (a job's `webhook_url`; Settings checks
`job_webhook_allowed_urls` with it). It parses with httpx, the client that sends: what is checked is what is
sent to. It imports nothing of the app.
"""

from __future__ import annotations

import httpx

MAX_URL_LENGTH = 2000


def parse(url: str) -> httpx.URL | None:
    """httpx's parse of an http(s) URL with a host and no user info, else None. The same parser sends it:
    what is checked is what is sent to."""
    # The mutants of `ord(c) < 0x20` below are equivalent: httpx (0.28) refuses ASCII control characters
    # itself (the clause keeps the rule should the parser change), and 0x1f and 0x20 are whitespace:
    # mutation: NumberReplacer
    # mutation: ReplaceComparisonOperator_Lt_LtE
    # mutation: ReplaceOrWithAnd to `c.isspace() and ord(c) < 0x20`
    if len(url) > MAX_URL_LENGTH or any(c.isspace() or ord(c) < 0x20 or c == "\\" for c in url):
        return None
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError):
        return None
    if parsed.scheme not in ("http", "https") or not parsed.host or parsed.userinfo:
        return None
    # Dot segments left after httpx's normalisation came percent-encoded: a receiver may still resolve them.
    if any(seg in (".", "..") for seg in parsed.path.split("/")):
        return None
    return parsed


def _port(u: httpx.URL) -> int:
    return u.port if u.port is not None else (443 if u.scheme == "https" else 80)


def prefix_problem(prefix: str) -> str | None:
    """Why an entry of job_webhook_allowed_urls cannot be used, or None."""
    parsed = parse(prefix)
    if parsed is None:
        return f"{prefix!r} is not an http(s) URL with a host and without user info"
    if parsed.query or parsed.fragment:
        return f"{prefix!r}: a prefix has no query or fragment"
    return None


def allowed(url: str, prefixes: list[str]) -> bool:
    """The URL lies under one of the prefixes: scheme, host and port equal; its path starts with the
    prefix's path, at a segment's end (a prefix path `/hooks` allows `/hooks` and `/hooks/...`, not
    `/hooksx`; `/hooks/` allows `/hooks/...` only)."""
    target = parse(url)
    if target is None:
        return False
    for prefix in prefixes:
        p = parse(prefix)
        if p is None or (p.scheme, p.host, _port(p)) != (target.scheme, target.host, _port(target)):
            continue
        base = p.path or "/"
        if target.path == base or target.path.startswith(base if base.endswith("/") else base + "/"):
            return True
    return False


def host_of(url: str) -> str:
    """What a log line may name of a webhook URL: its scheme and host (a path or query may hold a token)."""
    parsed = parse(url)
    return f"{parsed.scheme}://{parsed.host}" if parsed is not None else "(invalid)"
