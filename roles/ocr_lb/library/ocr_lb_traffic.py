#!/usr/bin/python
"""A load balancer's requests since a moment, the canary's apart, from HAProxy's access entries (journal)."""

from __future__ import annotations

import json
import math
import subprocess

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: ocr_lb_traffic
short_description: Requests, errors and durations of HAProxy's access entries since a moment, one server apart
description:
  - Reads the journal entries HAProxy's access lines became through journal_relay
    (C(SYSLOG_IDENTIFIER=haproxy), fields C(ROUTE), C(STATUS), C(DURATION_MS), C(UPSTREAM) = the server that
    answered) written at or after I(since), and sums up those of I(route) in two groups: the requests the
    server I(server) answered (C(canary)) and all the others (C(rest)), the LB's own answers without a server
    (503 no server up, 429...) included.
  - An entry is written when its request ends, so the window holds the requests that ended in it. A request
    replayed on another server counts for the server that answered it last.
  - Reads only (check mode runs the same); never changed.
options:
  since:
    description: The window's start, Unix epoch seconds (fractions allowed), by this host's clock.
    type: float
    required: true
  server:
    description: The canary, a server name of the backend (its C(UPSTREAM)).
    type: str
    required: true
  route:
    description: The requests counted (C(ROUTE), the path without the query).
    type: str
    default: /v1/ocr
"""

RETURN = r"""
canary:
  description: The requests I(server) answered.
  type: dict
  returned: always
  contains:
    requests:
      description: How many.
      type: int
    errors:
      description: Those answered with a status of 500 or more.
      type: int
    durations_ms:
      description: >-
        The time each took at the LB (HAProxy's C(%Ta), whole milliseconds), in journal order.
      type: list
      elements: int
rest:
  description: All the other requests of I(route), the LB's own answers included; as I(canary).
  type: dict
  returned: always
"""

FIELDS = "SYSLOG_IDENTIFIER,ROUTE,STATUS,DURATION_MS,UPSTREAM"


def number(value: object) -> int | float | None:
    """A field's value as a number (journalctl gives strings; an array for a repeated or binary field)."""
    try:
        n = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return int(n) if n.is_integer() else n


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "since": {"type": "float", "required": True},
            "server": {"type": "str", "required": True},
            "route": {"type": "str", "default": "/v1/ocr"},
        },
        supports_check_mode=True,
    )
    since, server, route = module.params["since"], module.params["server"], module.params["route"]
    since_us = int(since * 1_000_000)
    groups = {name: {"requests": 0, "errors": 0, "durations_ms": []} for name in ("canary", "rest")}
    # --since gets whole seconds: the entries of that second before `since` are dropped below by their own
    # timestamp (microseconds).
    argv = [
        module.get_bin_path("journalctl", required=True),
        "-t",
        "haproxy",
        "--since",
        f"@{math.floor(since)}",
        "-o",
        "json",
        f"--output-fields={FIELDS}",
        "--no-pager",
    ]
    # Streamed: a busy LB writes tens of thousands of entries a minute.
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # noqa: S603 -- fixed argv
    assert proc.stdout is not None
    for line in proc.stdout:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        # HAProxy's own events (servers UP/DOWN) and lines that were not JSON have no ROUTE/STATUS.
        if entry.get("ROUTE") != route or "STATUS" not in entry:
            continue
        if int(entry.get("__REALTIME_TIMESTAMP", 0)) < since_us:
            continue
        group = groups["canary" if entry.get("UPSTREAM") == server else "rest"]
        group["requests"] += 1
        status = number(entry.get("STATUS"))
        if status is not None and status >= 500:
            group["errors"] += 1
        duration = number(entry.get("DURATION_MS"))
        if duration is not None:
            group["durations_ms"].append(duration)
    stderr = proc.stderr.read() if proc.stderr else ""
    if proc.wait() != 0:
        module.fail_json(msg=f"journalctl failed (rc {proc.returncode}): {stderr.strip()}", cmd=argv)
    if stderr.strip():
        # e.g. its hint that a user outside group systemd-journal sees only their own entries (become: true).
        module.warn(f"journalctl: {stderr.strip()}")
    module.exit_json(changed=False, **groups)


if __name__ == "__main__":
    main()
