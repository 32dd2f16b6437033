"""The ocr_app role's `shadow-counts`, run on a host by its Python (from stdin): the replay counters
(ocr_app/fleet/shadow.py) of the host's enabled ocr-app instances, read from each one's Prometheus /metrics on
loopback and summed, as JSON.

argv: the enabled units' directory, their file name pattern (the role's instances.yml uses the same two), and
the port base (instance N listens on base + N). An instance that does not answer is listed under "unread"."""

import json
import os
import re
import sys
import urllib.request

SAMPLES = {
    'ocr_shadow_requests_total{outcome="compared"}': "compared",
    'ocr_shadow_requests_total{outcome="failed"}': "failed",
    'ocr_shadow_requests_total{outcome="busy"}': "busy",
    'ocr_shadow_requests_total{outcome="skipped"}': "skipped",
    "ocr_shadow_reference_chars_total": "reference_chars",
    "ocr_shadow_edit_distance_total": "edits",
}


def main(units_dir: str, pattern: str, port_base: str) -> None:
    counts = dict.fromkeys(SAMPLES.values(), 0)
    read, unread = [], []
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy
    for name in sorted(os.listdir(units_dir)):
        if not re.match(pattern, name):
            continue
        port = int(port_base) + int(name.split("@", 1)[1].split(".", 1)[0])  # ocr-app@<index>.service
        try:
            with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
                text = resp.read().decode()
        except OSError:
            unread.append(port)
            continue
        read.append(port)
        for line in text.splitlines():
            sample, _, value = line.rpartition(" ")
            if sample in SAMPLES:
                counts[SAMPLES[sample]] += int(float(value))
    print(json.dumps({"counts": counts, "read": read, "unread": unread}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
