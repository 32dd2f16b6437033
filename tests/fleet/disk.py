"""A full disk on an app host, under load (tests/fleet/test_crash.py): the filesystem nginx buffers request
bodies on (/var/lib/nginx) is a small tmpfs mounted over it (whole: nginx's directories made on it first),
then filled in two steps.

1. Below the app's free-space bound (health_disk_min_free_mb, 256 MiB; the lab inventory's health_disk_paths
   name /var/lib/nginx) but with room left for bodies: /healthz says `degraded` with a `disk_low` problem
   naming the path, HAProxy takes the host out, and the alert for a nearly full filesystem (node-exporter's
   metrics) reaches the Alertmanager. The load's requests that reached the host meanwhile still had room:
   none fails.
2. Full: a 2 MB document sent straight to the host's nginx (past HAProxy) cannot be buffered; nginx's failure
   is answered as the API's JSON 503 `host_unavailable` with Retry-After and the request id, never a 500 or
   HTML. A small document (buffered in memory) is still read.

Then the space is freed and the host must come back into HAProxy by itself.
"""

from __future__ import annotations

import json
import time

from lab.base import wait_until
from tests.fleet.conftest import firing, lb_servers, say
from tests.fleet.load import Load, documents, large_documents, misread

MOUNT = "/var/lib/nginx"  # nginx's body buffers (client_body_temp_path) and other temp paths
NGINX_TEMP = ("body", "proxy", "fastcgi", "uwsgi", "scgi")  # what Debian's nginx makes there at start
SIZE_MIB = 300  # the tmpfs: above the app's 256 MiB bound until filled
LEFT_MIB = 20  # after the first fill: under the bound and 10 % of the size, room for the load's bodies
STAGE = "/run/ocrfleet-test-nginx-tmpfs"  # where the tmpfs is made ready before it goes over MOUNT
FILL = f"{MOUNT}/ocrfleet-test-fill"
ALERT = "OcrFilesystemNearlyFull"
APP_PORT = 8000  # the host's ocr-app@0


def free_mib(fleet, host: str) -> float:
    out = fleet.lab.exec(host, ["df", "--output=avail", "-B1", MOUNT]).stdout
    return int(out.split()[-1]) / 2**20


def health(fleet, host: str) -> dict:
    return json.loads(fleet.host_get(host, APP_PORT, "/healthz"))


def disk_alerts(fleet, host: str) -> list[dict]:
    return [a for a in firing(fleet, ALERT) if a["labels"].get("host") == host]


def fill(fleet, host: str, name: str, leave_mib: float) -> None:
    size = int((free_mib(fleet, host) - leave_mib) * 2**20)
    fleet.lab.exec(host, ["fallocate", "-l", str(size), name])


def full_disk(fleet, load: Load, host: str, client) -> None:
    """The scenario above on `host` while `load` runs through HAProxy; `client(host)` is an HTTPS client of
    the host's own nginx."""
    assert lb_servers(fleet)[host]["status"] == "UP"
    # nginx must never see the tmpfs without its directories (a body it cannot buffer is a 500, the load's
    # request would fail): the tmpfs is made ready on STAGE, bound over MOUNT whole, and unmounted from STAGE.
    try:
        fleet.lab.exec(host, ["mkdir", "-p", STAGE])
        fleet.lab.exec(host, ["mount", "-t", "tmpfs", "-o", f"size={SIZE_MIB}m,mode=0755", "tmpfs", STAGE])
        for d in NGINX_TEMP:
            argv = ["install", "-d", "-o", "www-data", "-g", "root", "-m", "0700", f"{STAGE}/{d}"]
            fleet.lab.exec(host, argv)
        fleet.lab.exec(host, ["mount", "--bind", STAGE, MOUNT])
        fleet.lab.exec(host, ["umount", STAGE])
        wait_until(
            lambda: health(fleet, host)["status"] == "ready", 60, f"{host} ready on the new {MOUNT}", 0.2
        )
        before = load.total

        fill(fleet, host, FILL, LEFT_MIB)
        filled_at = time.monotonic()
        h = wait_until(
            lambda: (h := health(fleet, host))["status"] == "degraded" and h, 60, f"{host} degraded", 0.2
        )
        seen_s = time.monotonic() - filled_at
        (low,) = [p for p in h["problems"] if p["code"] == "disk_low"]
        assert f"disk: {MOUNT} has " in low["message"] and "health_disk_min_free_mb 256" in low["message"], h
        wait_until(lambda: lb_servers(fleet)[host]["status"] == "DOWN", 60, f"{host} DOWN", 0.2)
        down_s = time.monotonic() - filled_at
        fired = wait_until(lambda: disk_alerts(fleet, host), 120, f"{ALERT} for {host}", 1.0)
        alert_s = time.monotonic() - filled_at
        assert {a["labels"].get("mountpoint") for a in fired} == {MOUNT}, fired
        say(
            f"{host}: {MOUNT} filled to {LEFT_MIB} MiB free: /healthz degraded after {seen_s:.1f} s, "
            f"HAProxy DOWN after {down_s:.1f} s, {ALERT} in the Alertmanager after {alert_s:.1f} s"
        )
        wait_until(lambda: load.total >= before + 8, 300, "the load going on without the host")

        # Full: nginx cannot buffer a body above client_body_buffer_size (1 MiB).
        fill(fleet, host, f"{FILL}-2", 0)
        big, small = large_documents(1)[0], documents(1)[0]
        with client(host) as c:
            headers = {"Content-Type": "image/png", "Authorization": f"Bearer {fleet.key}"}
            r = c.post("/v1/ocr", content=big.body, headers={**headers, "X-Request-ID": "full-disk-big"})
            assert r.status_code == 503, (r.status_code, r.headers, r.text[:300])
            assert r.headers["content-type"].startswith("application/json"), r.headers
            assert r.json()["error"]["code"] == "host_unavailable", r.text
            assert r.json()["error"]["request_id"] == r.headers["x-request-id"] == "full-disk-big", r.text
            assert r.headers["retry-after"] == "3", r.headers
            r = c.post("/v1/ocr", content=small.body, headers=headers)
            assert r.status_code == 200, r.text[:300]
            assert misread(small, r.json()["pages"][0]["text"]) is None, r.text[:300]
        say(f"{host}: {MOUNT} full: a 2 MB body got JSON 503 host_unavailable, a small one 200")
    finally:
        # Whatever step failed: the host's own /var/lib/nginx back, the staging tmpfs gone (either may
        # already be so, hence check=False).
        fleet.lab.exec(host, ["rm", "-f", FILL, f"{FILL}-2"], check=False)
        if fleet.lab.exec(host, ["mountpoint", "-q", MOUNT], check=False).returncode == 0:
            fleet.lab.exec(host, ["umount", "-l", MOUNT])
        fleet.lab.exec(host, ["umount", "-l", STAGE], check=False)
    freed_at = time.monotonic()
    wait_until(lambda: lb_servers(fleet)[host]["status"] == "UP", 120, f"{host} UP again", 0.2)
    say(f"{host}: space freed, UP in HAProxy {time.monotonic() - freed_at:.1f} s later")
