"""Driver reboots under load (`make test-fleet`, after the upgrades): two app hosts become GPU hosts through
the lab's stand-ins (`lab gpu`: PCI devices, nvidia-smi, the kernel module's version, a reboot command),
then playbooks/nvidia-driver.yml (what site.yml runs for the driver), limited to them, installs the NVIDIA
driver from the signed fake repository on each, and, since a new driver needs a reboot, reboots them one host
at a time: each drained and out of the load balancer before its reboot, verified and back in before the next
host's drain. Two hosts are the fewest that show the order; the third app host keeps serving and is left
alone (no GPU, no driver, no reboot). A constant load through the load balancer loses no request. app-2 has 4
stand-in GPUs and runs one instance per GPU (ocr-app@0..1): each is bound to its own device, its nginx
balances across both, and its GPU metrics count two.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from lab import gpu as G
from lab.base import wait_until
from tests.fleet.conftest import (
    MULTI,
    MULTI_INSTANCES,
    ROOT,
    instances,
    lb_servers,
    log_size,
    ocr_lines,
    say,
    task_order,
)
from tests.fleet.load import Load

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

FIXTURE = ROOT / "tests" / "fixtures" / "nvidia_repo"
REPO_PORT = 8766  # inventory/lab/group_vars/all/lab.yml: lab_nvidia_repo_port
MIN_REQUESTS = 40
# One host's way through the reboot play, by the tasks of the roles' entry points, in the order they must run.
STEPS = (
    "Write the drain file",  # ocr_app drain
    "Wait until the LB reports it | lb-1 {host} out",  # ocr_lb wait-server
    "Reboot",  # nvidia_driver reboot
    "Query the GPUs with nvidia-smi",  # nvidia_driver verify, after the reboot
    "Restart ocr-app@0",  # ocr_app restart
    "OCR the golden document on every instance",  # ocr_app smoke
    "Remove the drain file",  # ocr_app undrain
    "Wait until the LB reports it | lb-1 {host} in",
)


@pytest.fixture
def nvidia_repo(fleet, tmp_path):
    repo = tmp_path / "nvidia_repo"
    subprocess.run(["python3", str(FIXTURE / "build.py"), str(repo)], check=True, capture_output=True)
    serve = [str(FIXTURE / "serve.sh")]
    subprocess.run([*serve, "start", str(repo), fleet.lab.bridge_ip, str(REPO_PORT), "900"], check=True)
    for host in fleet.apps:  # apt reaches the controller directly, not through the lab's apt proxy
        fleet.lab.exec(host, ["sh", "-c", "echo 'Acquire::http::Proxy::controller \"DIRECT\";' "
                              "> /etc/apt/apt.conf.d/90ocrfleet-fixture-direct"])  # fmt: skip
    try:
        yield (repo / "fingerprint").read_text().strip()
    finally:
        subprocess.run([*serve, "stop", fleet.lab.bridge_ip, str(REPO_PORT)], check=False)


def rebooted(fleet) -> list[str]:
    """The app hosts that get GPUs and the driver, in the reboot play's order: the multi-instance host and the
    last one-instance host."""
    return [h for h in fleet.apps if h in (MULTI, fleet.apps[-1])]


def gpu_counts(fleet) -> dict[str, int]:
    """The stand-in GPUs each app host has: one per instance on the rebooted hosts, none on the others."""
    return {h: instances(h) if h in rebooted(fleet) else 0 for h in fleet.apps}


def reboots(fleet, host: str) -> int:
    out = fleet.lab.exec(host, ["sh", "-c", "cat /var/log/ocrfleet-lab/reboots 2>/dev/null || true"]).stdout
    return len(out.splitlines())


def test_new_driver_reboots_one_drained_host_at_a_time_under_load(fleet, nvidia_repo):
    gpus, hosts = gpu_counts(fleet), rebooted(fleet)
    for host in hosts:
        G.configure(fleet.lab.name, host, gpus=gpus[host])
    for host in fleet.apps:
        assert reboots(fleet, host) == 0
    assert {lb_servers(fleet)[h]["status"] for h in fleet.apps} == {"UP"}
    offset = log_size(fleet, MULTI)

    load = Load(fleet.client, concurrency=2, interval_s=1.0).start()  # paced as test_fleet's
    try:
        t0 = time.monotonic()
        r = fleet.playbook(
            "playbooks/nvidia-driver.yml", {"nvidia_driver_repo_key_fingerprint": nvidia_repo}, limit=hosts
        )
        say(f"playbooks/nvidia-driver.yml (install, {len(hosts)} drained reboots of {hosts}): "
            f"{time.monotonic() - t0:.0f} s, {load.total} requests so far")  # fmt: skip
        assert not load.exhausted, "the load ended before the reboots did"
    finally:
        load.finish(MIN_REQUESTS)
    load.check(MIN_REQUESTS, prefix="reboot_")

    order = task_order(r, "NVIDIA driver - reboots")
    assert {h for h, _ in order} == set(hosts), order
    positions = []
    for host in hosts:
        for step in STEPS:
            task = step.format(host=host)
            at = [i for i, (h, t) in enumerate(order) if h == host and t.startswith(task)]
            assert at, f"{host} never ran {task!r}: {order}"
            positions.append(at[0])
    # Each host's steps in order, and each host drained only after the one before it was back in.
    assert positions == sorted(positions), order
    for host in fleet.apps:
        assert reboots(fleet, host) == (host in hosts), host
    for host in hosts:
        smi = fleet.lab.exec(
            host, ["nvidia-smi", "--query-gpu=index,driver_version", "--format=csv,noheader"]
        )
        assert smi.stdout.splitlines() == [f"{i}, 570.124.06" for i in range(gpus[host])], smi.stdout
        assert fleet.host_health(host)["status"] == "ready", host
        held = fleet.lab.exec(host, ["apt-mark", "showhold"]).stdout.split()
        assert {"nvidia-open", "nvidia-persistenced"} <= set(held), held
    assert {lb_servers(fleet)[h]["status"] for h in fleet.apps} == {"UP"}
    # app-2's nginx answered the load through each of its instances (least_conn).
    served = {a for r in ocr_lines(fleet, MULTI, offset) for a, s in r["attempts"] if s == "200"}
    assert served == {f"127.0.0.1:{8000 + i}" for i in range(MULTI_INSTANCES)}, served


def test_each_instance_is_bound_to_its_gpu_and_the_metrics_see_every_gpu(fleet):
    # After the test above: the rebooted hosts have the driver (the fixture's nvidia-smi) and stand-in GPUs.
    for i in range(MULTI_INSTANCES):  # one instance per GPU
        unit = f"ocr-app@{i}.service"
        allowed = fleet.lab.exec(MULTI, ["systemctl", "show", unit, "-p", "DeviceAllow"]).stdout.splitlines()
        gpus = sorted(a for a in allowed if re.match(r"DeviceAllow=/dev/nvidia[0-9]+ ", a))
        assert gpus == [f"DeviceAllow=/dev/nvidia{i} rw"], allowed
        pid = fleet.lab.exec(MULTI, ["systemctl", "show", unit, "-p", "MainPID", "--value"]).stdout.strip()
        environ = fleet.lab.exec(MULTI, ["cat", f"/proc/{pid}/environ"]).stdout.split("\0")
        assert f"CUDA_VISIBLE_DEVICES={i}" in environ and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in environ, environ
    # The GPU metrics timer runs every 5 s in the lab.
    for host, count in gpu_counts(fleet).items():
        wait_until(
            lambda host=host, count=count: f"ocr_gpu_count {count}\n"
            in fleet.lab.exec(host, ["cat", "/var/lib/prometheus/node-exporter/ocr_gpu.prom"]).stdout,
            60, f"the GPU metrics on {host} report {count} GPU(s)", 1,
        )  # fmt: skip


# ocr_app's own count, read from the host: its preflight (pure: facts and checks) on every app host.
INSTANCES_PLAY = """
- name: The instances ocr_app lays out on each host
  hosts: ocr_servers
  gather_facts: false
  become: true
  tasks:
    - name: Compute them
      ansible.builtin.include_role:
        name: ocr_app
        tasks_from: preflight.yml
    - name: Show the instances
      ansible.builtin.debug:
        var: _ocr_app_instances
"""


def test_with_gpu_count_auto_the_instances_follow_the_gpus(fleet, tmp_path):
    # After the tests above: app-2 has 2 stand-in GPUs, app-3 1, app-1 none. ocr_app_gpu_count's default,
    # auto, counts the /dev/nvidiaN nodes (the lab inventory fixes app-2's count only because the demo's hosts
    # have none).
    play = tmp_path / "instances.yml"
    play.write_text(INSTANCES_PLAY)
    r = fleet.playbook(str(play), {"ocr_app_gpu_count": "auto"})
    shown = {
        e["event_data"]["host"]: e["event_data"]["res"]["_ocr_app_instances"]
        for e in r.events
        if e.get("event") == "runner_on_ok" and e["event_data"]["task"] == "Show the instances"
    }
    # A host without GPUs runs one instance, on the CPU engine.
    assert shown == {h: list(range(max(n, 1))) for h, n in gpu_counts(fleet).items()}, shown
