"""The full site: two nspawn hosts converge site.yml with the CPU engine; verified from outside.

`make test-site`. One host is forced through the nvidia_driver role against the lab's signed fake
CUDA repository, the other is skipped as GPU-less. Figures (converge, idempotent rerun, restart after
kill -9) are printed in the test output.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import ansible_runner
import httpx
import jiwer
import pytest

from lab import fleet as F
from lab import lab as L
from tests import old_tls
from tests.docs import TEXTS, encode, render

pytestmark = [pytest.mark.lab, pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parents[2]
LAB = "site"
HOSTS = ["app-1", "app-2"]
APP_PORT = 8000


def figure(name: str, value: str) -> None:
    print(f"\n[site figure] {name}: {value}", flush=True)


def run_site(ctx: dict, *cmdline: str) -> ansible_runner.Runner:
    ctx["runner_dir"].mkdir(parents=True, exist_ok=True)
    r = ansible_runner.run(
        private_data_dir=str(ctx["runner_dir"]),
        project_dir=str(ROOT),
        playbook=str(ROOT / "site.yml"),
        inventory=str(ROOT / "inventory" / "lab"),
        extravars=ctx["extravars"],
        envvars={
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "OCRFLEET_LAB_NAME": LAB,
            "ANSIBLE_HOME": str(ctx["runner_dir"] / "ansible-home"),
            "ANSIBLE_FORCE_COLOR": "0",
            # The venv's pinned ansible-playbook, whether or not the venv is activated.
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        },
        cmdline=" ".join(cmdline) or None,
        quiet=True,
    )
    if r.rc != 0:
        failed = [
            f"{e['event_data'].get('host')}: {e['event_data'].get('task')}: "
            f"{e['event_data'].get('res', {}).get('msg', '')}"
            for e in r.events
            if e.get("event") == "runner_on_failed" and not e["event_data"].get("ignore_errors")
        ]
        pytest.fail(f"site.yml {' '.join(cmdline)} failed (rc {r.rc}): {failed}\n{r.stdout.read()[-4000:]}")
    return r


def changed_tasks(r: ansible_runner.Runner) -> list[str]:
    return [
        f"{e['event_data']['host']}: {e['event_data']['task']}"
        for e in r.events
        if e.get("event") == "runner_on_ok" and e["event_data"].get("res", {}).get("changed")
    ]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    F.require_wheelhouse()
    F.require_model()
    work = tmp_path_factory.mktemp("site")
    lab = L.up(LAB, hosts=HOSTS)
    fixture = ROOT / "tests" / "fixtures" / "nvidia_repo"
    port = "8766"  # lab_nvidia_repo_port in inventory/lab
    try:
        for h in HOSTS:  # the controller's own fixture server is reached directly, not through the apt proxy
            lab.exec(
                h,
                [
                    "sh",
                    "-c",
                    "echo 'Acquire::http::Proxy::controller \"DIRECT\";' >/etc/apt/apt.conf.d/99lab-direct",
                ],
            )
        # The fake NVIDIA CUDA repository, signed with a key made now, served on the lab bridge only.
        subprocess.run([sys.executable, str(fixture / "build.py"), str(work / "nvidia-repo")], check=True)
        subprocess.run(
            [str(fixture / "serve.sh"), "start", str(work / "nvidia-repo"), lab.bridge_ip, port], check=True
        )
        key = "ocr_" + secrets.token_urlsafe(32)
        ctx = {
            "lab": lab,
            "key": key,
            "runner_dir": work / "runner",
            "ca_dir": work / "ca",
            "extravars": {
                "ocr_app_api_keys": [{"name": "site-test", "key": key}],
                "fleet_pki_ca_dir": str(work / "ca"),
                "nvidia_driver_repo_key_fingerprint": (work / "nvidia-repo" / "fingerprint")
                .read_text()
                .strip(),
            },
        }
        start = time.monotonic()
        ctx["first"] = run_site(ctx)
        ctx["converge_s"] = time.monotonic() - start
        figure("first converge of site.yml on 2 hosts", f"{ctx['converge_s']:.0f} s")
        yield ctx
    finally:
        subprocess.run([str(fixture / "serve.sh"), "stop", lab.bridge_ip, port], check=False)
        L.down(LAB)


def https_client(site, host: str) -> httpx.Client:
    address = site["lab"].host(host).address
    ca = ssl.create_default_context(cafile=str(site["ca_dir"] / "ca.crt"))  # the chain must verify
    return httpx.Client(base_url=f"https://{address}", verify=ca, timeout=120)


@pytest.mark.parametrize("host", HOSTS)
def test_https_ocr_through_nginx(site, host):
    doc = render(TEXTS["en"])
    with https_client(site, host) as c:
        r = c.post(
            "/v1/ocr",
            content=encode(doc.image, "PNG"),
            headers={
                "Authorization": f"Bearer {site['key']}",
                "Content-Type": "image/png",
                "X-Request-ID": f"site-{host}",
            },
        )
        assert r.status_code == 200, r.text
        text = r.json()["pages"][0]["text"]
        assert jiwer.cer("".join(doc.text.split()), "".join(text.split())) < 0.02
        assert r.headers["x-request-id"] == f"site-{host}"
        r = c.post("/v1/ocr", content=encode(doc.image, "PNG"), headers={"Content-Type": "image/png"})
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "unauthorized"


def test_only_modern_tls(site):
    address = site["lab"].host("app-1").address
    for modern in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):  # the same client completes these
        assert old_tls.handshake(address, 443, modern) == f"ok {modern.name.replace('_', '.')}"
    outcomes = old_tls.old_versions(address)
    assert all(map(old_tls.refused, outcomes.values())), outcomes


def connect_result(address: str, port: int, timeout: float = 3.0) -> str:
    with socket.socket() as s:
        s.settimeout(timeout)
        try:
            s.connect((address, port))
        except ConnectionRefusedError:
            return "refused"
        except TimeoutError:
            return "dropped"
        return "open"


def test_firewall_from_the_controller(site):
    address = site["lab"].host("app-1").address
    assert connect_result(address, 443) == "open"
    assert connect_result(address, 22) == "open"
    assert connect_result(address, APP_PORT) != "open"  # the app's own port is never reachable
    assert connect_result(address, 8081) == "dropped"  # a port not in the ruleset: silently dropped


def lab_exec(site, host: str, *argv: str) -> str:
    return site["lab"].exec(host, list(argv)).stdout


def healthz_status(site, host: str) -> str:
    probe = (
        "import urllib.request as u, urllib.error as e\n"
        f"try: print(u.urlopen('http://127.0.0.1:{APP_PORT}/healthz', timeout=5).status)\n"
        "except e.HTTPError as x: print(x.code)\n"
        "except OSError: print('down')"
    )
    return site["lab"].exec(host, ["python3", "-c", probe], check=False).stdout.strip()


def test_kill_9_is_restarted_by_systemd(site):
    host = "app-2"
    pid = lab_exec(site, host, "systemctl", "show", "-P", "MainPID", "ocr-app@0").strip()
    assert pid not in ("", "0")
    start = time.monotonic()
    lab_exec(site, host, "kill", "-9", pid)
    deadline = start + 180
    while True:
        new = lab_exec(site, host, "systemctl", "show", "-P", "MainPID", "ocr-app@0").strip()
        if new not in ("0", pid) and healthz_status(site, host) == "200":
            break
        assert time.monotonic() < deadline, "ocr-app@0 not ready again within 180 s of kill -9"
        time.sleep(0.2)
    figure("kill -9 to /healthz ready again", f"{time.monotonic() - start:.1f} s")
    restarts = lab_exec(site, host, "systemctl", "show", "-P", "NRestarts", "ocr-app@0").strip()
    assert int(restarts) >= 1


def test_journal_has_the_request_as_fields_without_document_text(site):
    host = "app-1"

    def entries(*match: str) -> list[dict]:
        out = lab_exec(site, host, "journalctl", "-u", "ocr-app@0", *match, "-o", "json", "--no-pager")
        return [json.loads(x) for x in out.splitlines()]

    access = [e for e in entries(f"REQUEST_ID=site-{host}") if e.get("LOGGER") == "ocr_app.access"]
    assert any((e["ROUTE"], e["STATUS"], e["PRIORITY"]) == ("/v1/ocr", "200", "6") for e in access), access
    # The entries' own fields (journald's `_`/`__` ones are its ids and timestamps).
    own = "\n".join(str(v) for e in entries() for k, v in e.items() if not k.startswith("_"))
    assert own
    for line in TEXTS["en"]:
        assert line not in own


def test_gpu_metrics_textfile_is_refreshed_by_the_timer(site):
    path = "/var/lib/prometheus/node-exporter/ocr_gpu.prom"
    for host, gpus in (("app-1", None), ("app-2", 0)):
        first = lab_exec(site, host, "cat", path)
        assert "ocr_gpu_count" in first
        if gpus is not None:
            assert "ocr_gpu_count 0" in first
        mtime = lab_exec(site, host, "stat", "-c", "%Y", path).strip()
        deadline = time.monotonic() + 90
        while lab_exec(site, host, "stat", "-c", "%Y", path).strip() == mtime:
            assert time.monotonic() < deadline, f"{path} on {host} not refreshed within 90 s"
            time.sleep(0.5)


def test_second_converge_changes_nothing_and_check_diff_agrees(site):
    start = time.monotonic()
    again = run_site(site)
    figure("idempotent rerun of site.yml", f"{time.monotonic() - start:.0f} s")
    assert changed_tasks(again) == []
    check = run_site(site, "--check", "--diff")
    assert changed_tasks(check) == []
