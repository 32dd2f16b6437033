"""The servers the bench starts: our `ocr-app serve` and rapidocr-api, each its own process on a free loopback
port, logging to a file, waited for until it answers, and always stopped."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from ocr_app.config import Settings, load_settings

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_status_kb(pid: int, key: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def clean_env() -> dict[str, str]:
    """This process's environment less any OCR_APP_* setting: a server reads its own config alone."""
    return {k: v for k, v in os.environ.items() if not k.startswith("OCR_APP_")}


class Process:
    """A server process we started: log to a file, wait until it answers, always stopped."""

    def __init__(self, name: str, argv: list[str], workdir: Path, health_path: str, port: int):
        self.name = name
        self.argv = argv
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.health_path = health_path
        self.log_file = workdir / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 300) -> Process:
        with self.log_file.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=clean_env())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.logs()[-3000:]}")
            try:
                r = httpx.get(self.url + self.health_path, timeout=5)
                if r.status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{self.name} not ready within {timeout}s:\n{self.logs()[-3000:]}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def logs(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def check_alive(self) -> None:
        """Raise, with the exit status and the log's tail, when the server has died under us."""
        if self.proc is not None and self.proc.poll() is not None:
            rc = self.proc.returncode
            how = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"
            raise RuntimeError(
                f"{self.name} (pid {self.proc.pid}) died: {how}; log tail:\n{self.logs()[-2000:]}"
            )

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def ocr_app_argv() -> list[str]:
    exe = shutil.which("ocr-app", path=str(BIN))
    return [exe] if exe else [sys.executable, "-m", "ocr_app.cli"]


def peer_argv(port: int) -> list[str]:
    exe = shutil.which("rapidocr_api", path=str(BIN))
    base = [exe] if exe else [sys.executable, "-m", "rapidocr_api.main"]
    return [*base, "--ip", "127.0.0.1", "-p", str(port)]


class OurService:
    """`ocr-app serve` with a fresh key, a YAML config, on a free loopback port."""

    def __init__(self, workdir: Path, overrides: dict):
        workdir.mkdir(parents=True, exist_ok=True)
        keys_file = workdir / "keys.txt"
        out = subprocess.run(
            [*ocr_app_argv(), "keys", "add", "bench", "--file", str(keys_file)],
            capture_output=True,
            text=True,
            check=True,
            env=clean_env(),
        )
        self.key = out.stdout.strip().splitlines()[-1]
        self.port = free_port()
        config = {
            "port": self.port,
            "api_keys_file": str(keys_file),
            "drain_file": str(workdir / "drain"),
            "log_level": "warning",
            **overrides,
        }
        self.config_file = workdir / "config.yml"
        self.config_file.write_text(yaml.safe_dump(config))
        self.settings: Settings = load_settings(self.config_file)
        self.process = Process(
            "ocr-app",
            [*ocr_app_argv(), "serve", "--config", str(self.config_file)],
            workdir,
            "/healthz",
            self.port,
        )

    def start(self) -> OurService:
        self.process.start()
        return self

    def stop(self) -> None:
        self.process.stop()
