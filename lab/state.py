"""A lab as it is recorded: Lab and its Hosts, kept in <state>/<lab>/state.json (written first at `up`, so
that `down` finds what to clean), the Ansible inventory beside it, and commands run in a host (nsenter or
ssh)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

from .base import LabError, run, state_dir
from .procs import is_alive, nsenter_argv

SSH_OPTS = [
    "-F",
    "none",
    "-o",
    "StrictHostKeyChecking=no",
    "-o",
    "UserKnownHostsFile=/dev/null",
    "-o",
    "IdentitiesOnly=yes",
    "-o",
    "BatchMode=yes",
    "-o",
    "LogLevel=ERROR",
    "-o",
    "ConnectTimeout=5",
]


@dataclasses.dataclass
class Host:
    name: str
    address: str
    machine: str
    nspawn_pid: int = 0
    leader: int = 0

    def log_path(self, lab: str) -> Path:
        return state_dir() / lab / "logs" / f"{self.name}.log"


@dataclasses.dataclass
class Lab:
    name: str
    bridge: str
    subnet: str
    bridge_ip: str
    apt_proxy: str
    key: str
    inventory: str
    image: str
    hosts: list[Host]
    started_at: float = 0.0

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise LabError(
            f"lab {self.name} has no host {name!r} (hosts: {', '.join(h.name for h in self.hosts)})"
        )

    def instance_config(self) -> list[dict]:
        """Molecule's molecule_instance_config: a list of dicts (write it as a YAML list)."""
        return [
            {"instance": h.name, "address": h.address, "user": "root", "port": 22, "identity_file": self.key}
            for h in self.hosts
        ]

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["state"] = str(state_dir() / self.name / "state.json")
        d["instance_config"] = self.instance_config()
        return d

    def ssh_argv(self, host: str, *cmd: str) -> list[str]:
        return ["ssh", *SSH_OPTS, "-i", self.key, f"root@{self.host(host).address}", *cmd]

    def exec(
        self, host: str, cmd: list[str], *, check=True, timeout=120, input=None, capture=True
    ) -> subprocess.CompletedProcess:
        """Run cmd inside host via nsenter (needs no network, no ssh)."""
        h = self.host(host)
        if not h.leader or not is_alive(h.leader):
            raise LabError(f"host {host} of lab {self.name} is not running")
        return run(
            [*nsenter_argv(h.leader, (self.name, h.name)), *cmd],
            check=check,
            timeout=timeout,
            input=input,
            capture=capture,
        )

    def ssh(self, host: str, cmd: str, *, check=True, timeout=120) -> subprocess.CompletedProcess:
        return run(self.ssh_argv(host, cmd), check=check, timeout=timeout)


def read_state(lab: str) -> dict:
    return json.loads((state_dir() / lab / "state.json").read_text())


def load(lab: str) -> Lab:
    try:
        d = read_state(lab)
    except (OSError, ValueError):
        raise LabError(f"lab {lab!r} is not up (no {state_dir() / lab / 'state.json'})") from None
    d.pop("state", None)
    d.pop("instance_config", None)
    d["hosts"] = [Host(**h) for h in d["hosts"]]
    return Lab(**d)


def write_state(lab: Lab) -> None:
    d = state_dir() / lab.name
    tmp = d / "state.json.tmp"
    tmp.write_text(json.dumps(lab.to_dict(), indent=2) + "\n")
    tmp.rename(d / "state.json")


def write_inventory(lab: Lab) -> None:
    lines = ["# Written by lab/ (ocrfleet). Regenerated on every `up`.", "[lab]"]
    lines += [f"{h.name} ansible_host={h.address}" for h in lab.hosts]
    common = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o IdentitiesOnly=yes"
    lines += [
        "",
        "[all:vars]",
        "ansible_user=root",
        f"ansible_ssh_private_key_file={lab.key}",
        f"ansible_ssh_common_args='{common}'",
        "ansible_python_interpreter=/usr/bin/python3",
        f"lab_name={lab.name}",
        f"lab_controller_address={lab.bridge_ip}",
        f"lab_apt_proxy={lab.apt_proxy}",
        "",
    ]
    Path(lab.inventory).write_text("\n".join(lines))


def running_labs() -> list[str]:
    d = state_dir()
    return sorted(p.parent.name for p in d.glob("*/state.json")) if d.is_dir() else []


def instance_config(name: str) -> list[dict]:
    return load(name).instance_config()
