"""The real app as a real process: `ocr-app serve` on a free loopback port."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

OCR_APP = shutil.which("ocr-app", path=str(Path(sys.executable).parent)) or "ocr-app"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def add_key(keys_file: Path, name: str, command: tuple[str, ...] = (OCR_APP,)) -> str:
    out = subprocess.run(
        [*command, "keys", "add", name, "--file", str(keys_file)], capture_output=True, text=True, check=True
    )
    return out.stdout.strip().splitlines()[-1]


class Server:
    command: tuple[str, ...] = (OCR_APP,)  # how to run `ocr-app`

    def __init__(self, workdir: Path, **settings):
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.keys_file = workdir / "keys.txt"
        self.drain_file = workdir / "drain"
        self.shadow_file = workdir / "shadow.json"  # never the host's /run/ocr-app/shadow.json
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.key = add_key(self.keys_file, "tests", self.command)
        self.config = {
            "port": self.port,
            "api_keys_file": str(self.keys_file),
            "drain_file": str(self.drain_file),
            "shadow_file": str(self.shadow_file),
            "rapidocr_workers": 1,
            "log_level": "info",
            **settings,
        }
        self.config_file = workdir / "config.yml"
        self.config_file.write_text(yaml.safe_dump(self.config))
        self.log_file = workdir / "server.log"
        self.proc: subprocess.Popen | None = None

    def start(self, wait_ready: bool = True, timeout: float = 120, env: dict | None = None) -> Server:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("OCR_APP_", "NOTIFY_", "WATCHDOG_"))
        } | (env or {})
        self.proc = subprocess.Popen(
            [*self.command, "serve", "--config", str(self.config_file)],
            stdout=self.log_file.open("ab"),
            stderr=subprocess.STDOUT,
            env=env,
        )
        if wait_ready:
            self.wait_status("ready", timeout)
        return self

    def health(self) -> httpx.Response | None:
        try:
            return httpx.get(self.url + "/healthz", timeout=5)
        except httpx.TransportError:
            return None

    def wait_status(self, status: str, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.logs()[-3000:]}")
            r = self.health()
            if r is not None and r.json()["status"] == status:
                return r.json()
            time.sleep(0.05)  # polling interval, not a timing assumption
        raise TimeoutError(f"server not {status} within {timeout}s:\n{self.logs()[-3000:]}")

    def wait_until(self, predicate, timeout: float = 60) -> dict:
        """Poll /healthz until predicate(body) holds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.health()
            if r is not None and predicate(r.json()):
                return r.json()
            time.sleep(0.02)
        raise TimeoutError(f"condition not met within {timeout}s")

    def client(self, key: str | None = "default", **kw) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.key if key == 'default' else key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=kw.pop("timeout", 120), **kw)

    def ocr(self, data: bytes, content_type: str, key: str | None = "default", **kw) -> httpx.Response:
        headers = {"Content-Type": content_type, **kw.pop("headers", {})}
        with self.client(key) as c:
            return c.post("/v1/ocr", content=data, headers=headers, **kw)

    def metrics(self) -> dict[str, float]:
        from prometheus_client.parser import text_string_to_metric_families

        out = {}
        text = httpx.get(self.url + "/metrics", timeout=10).text
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out

    def logs(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def log_records(self, predicate, timeout: float = 30) -> list[dict]:
        """The JSON log records matching predicate, once there is one: a request's access line is
        written after its answer has gone out, so a client may read the log before it is there."""
        deadline = time.monotonic() + timeout
        while True:
            records = [json.loads(line) for line in self.logs().splitlines() if line.startswith("{")]
            found = [r for r in records if predicate(r)]
            if found or time.monotonic() >= deadline:
                return found
            time.sleep(0.02)  # polling interval, not a timing assumption

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


class StallServer(Server):
    """`ocr-app` with the test engine a test can hold or wedge (tests/stall_engine.py: its control files)."""

    command = (sys.executable, str(Path(__file__).parent / "stall_engine.py"))
