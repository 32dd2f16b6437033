"""A fleet in the lab: app hosts, a load balancer, a monitoring and a database host converged with site.yml
(`make demo`, `make test-fleet`).

Playbooks run through ansible-runner against `inventory/lab` with the venv's pinned Ansible; an optional
progress callback sees one line per play and task as they start.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import ssl
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import ansible_runner
import httpx
import yaml

from . import lab as L
from .base import LabError
from .net import lb_service_address
from .state import Lab
from .state import load as load_lab

ROOT = Path(__file__).resolve().parents[1]
Progress = Callable[[str], None]


class PlaybookFailed(RuntimeError):
    def __init__(self, playbook: str, runner: ansible_runner.Runner):
        self.runner = runner
        self.failures = failures(runner)
        what = "; ".join(self.failures or ["see its output"])
        super().__init__(f"{playbook} failed (rc {runner.rc}): {what}")


def require_wheelhouse() -> Path:
    """build/wheelhouse, what the ocr_app role installs on the hosts; an error naming the fix when absent."""
    wheelhouse = ROOT / "build" / "wheelhouse"
    if not any(wheelhouse.glob("ocr_app-*.whl")):
        raise FileNotFoundError(f"no app wheel in {wheelhouse}: run `make wheelhouse`")
    return wheelhouse


MODEL_VARS = ROOT / "inventory" / "lab" / "group_vars" / "ocr_servers" / "ocr_model.yml"
MODELS = ROOT / "build" / "models"  # lab_models_dir in inventory/lab


def lab_model() -> tuple[str, str]:
    """The model name and revision the lab inventory installs."""
    v = yaml.safe_load(MODEL_VARS.read_text())
    return v["ocr_model_name"], v["ocr_model_revision"]


def require_model(revision: str | None = None) -> Path:
    """The directory of a model revision of the lab's model (default: the inventory's revision) on the
    controller, with its manifest beside it (<revision>.json): written from the installed rapidocr wheel
    (`ocr-app rapidocr-models`) unless present. Other revisions are other names for the same files."""
    from ocr_app.cli import main as ocr_app

    name, default = lab_model()
    out = MODELS / name / (revision or default)
    manifest = out.parent / f"{out.name}.json"
    if not manifest.is_file():  # written last: a revision with a manifest is complete
        shutil.rmtree(out, ignore_errors=True)
        if ocr_app(["rapidocr-models", str(out), "--manifest", str(manifest)]) != 0:
            raise RuntimeError(f"ocr-app rapidocr-models {out} failed")
    return out


def failures(r: ansible_runner.Runner) -> list[str]:
    """`host: task: message` of every task that failed and was not ignored or rescued."""
    out = []
    for e in r.events:
        if e.get("event") != "runner_on_failed" or e["event_data"].get("ignore_errors"):
            continue
        d = e["event_data"]
        out.append(f"{d.get('host')}: {d.get('task')}: {str(d.get('res', {}).get('msg', ''))[:500]}")
    return out


def _progress_handler(progress: Progress | None, started: float) -> Callable[[dict], bool]:
    seen = 0

    def handle(event: dict) -> bool:
        nonlocal seen
        if progress is None:
            return True
        kind, data = event.get("event"), event.get("event_data", {})
        stamp = f"{time.monotonic() - started:5.0f}s"
        if kind == "playbook_on_play_start":
            progress(f"{stamp}  PLAY {data.get('play', '')}")
        elif kind == "playbook_on_task_start" and not data.get("is_conditional"):
            seen += 1
            role = data.get("role")
            progress(f"{stamp}  [{seen:3d}] {role + ' : ' if role else ''}{data.get('task', '')}")
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            msg = str(data.get("res", {}).get("msg", ""))[:300]
            progress(f"{stamp}        failed on {data.get('host')}: {msg}")
        return True  # keep every event in the runner's artifacts

    return handle


# patronictl on a job database host (role postgresql's configuration).
PATRONICTL = ["patronictl", "--config-file", "/etc/patroni/config.yml"]


@dataclass
class Fleet:
    lab: Lab
    state: Path  # the fleet's CA, API key and runner directories
    key: str

    @property
    def apps(self) -> list[str]:
        return [h.name for h in self.lab.hosts if h.name.startswith("app-")]

    @property
    def dbs(self) -> list[str]:
        return [h.name for h in self.lab.hosts if h.name.startswith("db-")]

    def db_leader(self) -> str | None:
        """The job database host that takes writes: the only one, or Patroni's leader (asked of each database
        host in turn: one may be down); None while there is none (a failover)."""
        if len(self.dbs) == 1:
            return self.dbs[0]
        for host in self.dbs:
            r = self.lab.exec(host, [*PATRONICTL, "list", "--format", "json"], check=False)
            if r.returncode == 0:
                leaders = [m["Member"] for m in json.loads(r.stdout) if m["Role"] == "Leader"]
                return leaders[0] if leaders else None
        return None

    @property
    def lbs(self) -> list[str]:
        return [h.name for h in self.lab.hosts if h.name.startswith("lb-")]

    @property
    def lb_address(self) -> str:
        """Where clients reach the service: the one LB, or the address a pair shares (keepalived)."""
        if len(self.lbs) == 1:
            return self.lab.host(self.lbs[0]).address
        return lb_service_address(self.lab.subnet)

    def lb_holder(self) -> str | None:
        """The LB that serves clients: the only one, or the one holding the service address (asked of each
        LB in turn: one may be down); None while none holds it."""
        if len(self.lbs) == 1:
            return self.lbs[0]
        address = lb_service_address(self.lab.subnet)
        for host in self.lbs:
            try:
                r = self.lab.exec(host, ["ip", "-4", "-o", "addr", "show", "to", address], check=False)
            except LabError:  # the host is down
                continue
            if r.returncode == 0 and r.stdout.strip():
                return host
        return None

    @property
    def lb_url(self) -> str:
        return f"https://{self.lb_address}"

    @property
    def ca_file(self) -> Path:
        return self.state / "ca" / "ca.crt"

    @property
    def vars_file(self) -> Path:
        """The fleet's own variables (its key, its CA), for `ansible-playbook -e @<file>` by hand."""
        return self.state / "vars.yml"

    def extravars(self) -> dict:
        return {
            "ocr_app_api_keys": [{"name": "fleet", "key": self.key}],
            "fleet_pki_ca_dir": str(self.state / "ca"),
        }

    def playbook(
        self,
        playbook: str,
        extravars: dict | None = None,
        *,
        progress: Progress | None = None,
        check: bool = True,
        limit: list[str] | None = None,
    ) -> ansible_runner.Runner:
        """Run a playbook of the repo (path relative to it) against this fleet, or against its `limit` hosts
        (ansible-playbook --limit).

        Each run gets a private data dir of its own (under the fleet's 0700 state): ansible-runner writes
        the extravars to env/extravars only when that file is absent, and otherwise puts them on the
        ansible-playbook command line, where `ps` shows the API key, beside the first run's stale file."""
        runs = self.state / "runner"
        runs.mkdir(parents=True, exist_ok=True)
        runner_dir = Path(tempfile.mkdtemp(prefix=f"{Path(playbook).stem}-", dir=runs))
        r = ansible_runner.run(
            private_data_dir=str(runner_dir),
            project_dir=str(ROOT),
            playbook=str(ROOT / playbook),
            inventory=str(ROOT / "inventory" / "lab"),
            extravars={**self.extravars(), **(extravars or {})},
            limit=",".join(limit) if limit else None,
            envvars={
                "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
                "OCRFLEET_LAB_NAME": self.lab.name,
                "ANSIBLE_HOME": str(runs / "ansible-home"),
                "ANSIBLE_FORCE_COLOR": "0",
                # The venv's pinned ansible-playbook, whether or not the venv is activated.
                "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            },
            event_handler=_progress_handler(progress, time.monotonic()),
            quiet=True,
        )
        if check and r.rc != 0:
            raise PlaybookFailed(playbook, r)
        return r

    def client(self, timeout: float = 120) -> httpx.Client:
        """An HTTPS client for the load balancer that verifies it against the fleet's CA."""
        return httpx.Client(
            base_url=self.lb_url,
            verify=ssl.create_default_context(cafile=str(self.ca_file)),
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=timeout,
        )

    def host_get(self, host: str, port: int, path: str) -> str:
        """The body of GET http://127.0.0.1:<port><path>, read on the host itself (instances and exporters
        listen on its loopback), whatever the status."""
        script = (
            "import urllib.request,urllib.error,sys\n"
            f"try: r=urllib.request.urlopen('http://127.0.0.1:{port}{path}',timeout=10)\n"
            "except urllib.error.HTTPError as e: r=e\n"
            "sys.stdout.write(r.read().decode())\n"
        )
        return self.lab.exec(host, ["python3", "-c", script]).stdout

    def host_health(self, host: str, port: int = 8000) -> dict:
        """/healthz of an app instance."""
        return json.loads(self.host_get(host, port, "/healthz"))


def up(
    name: str,
    apps: int,
    state: Path,
    *,
    progress: Progress | None = None,
    extravars: dict | None = None,
    dbs: int = 1,
    lbs: int = 1,
) -> Fleet:
    """Boot `apps` app hosts, `lbs` load balancers (two or more: a pair sharing the service address through
    keepalived), one monitoring host (Prometheus, Alertmanager) and `dbs` job database hosts (PostgreSQL; two
    or more: under Patroni, with etcd on them and the monitoring host), then converge site.yml on them (CPU
    engine)."""
    state.mkdir(parents=True, exist_ok=True)
    os.chmod(state, 0o700)
    key_file = state / "api-key"
    if not key_file.exists():
        key_file.write_text("ocr_" + secrets.token_urlsafe(32) + "\n")
        os.chmod(key_file, 0o600)
    key = key_file.read_text().strip()
    require_model()
    if progress:
        progress(
            f"booting {apps} app hosts, {lbs} load balancer(s), monitoring and {dbs} database host(s) "
            f"(lab {name!r})"
        )
    hosts = (
        [f"app-{i}" for i in range(1, apps + 1)]
        + [f"lb-{i}" for i in range(1, lbs + 1)]
        + ["mon-1"]
        + [f"db-{i}" for i in range(1, dbs + 1)]
    )
    lab = L.up(name, hosts=hosts)
    fleet = Fleet(lab=lab, state=state, key=key)
    fleet.vars_file.write_text(json.dumps(fleet.extravars(), indent=2) + "\n")  # JSON is YAML
    os.chmod(fleet.vars_file, 0o600)
    fleet.playbook("site.yml", extravars, progress=progress)
    return fleet


def load(name: str, state: Path) -> Fleet:
    """The fleet of a running lab (after `up`)."""
    return Fleet(lab=load_lab(name), state=state, key=(state / "api-key").read_text().strip())


def down(name: str) -> None:
    L.down(name)
