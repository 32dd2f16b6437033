"""A throw-away PostgreSQL cluster (`make demo-local`'s job database, and the tests'): Debian's server
binaries, a unix socket in a short temporary directory and no TCP, durability off, removed when stopped.
With `port`, it also listens on 127.0.0.1:port (tests that dial hosts and ports: a multi-host URL); with
`start(standby_of=...)`, it is a streaming hot standby of that cluster (pg_basebackup -R), not a new one.

PostgreSQL refuses to run as root: under root the server alone runs as `nobody`, its files in a temporary
directory (`nobody` may not reach the one asked for)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path


def server_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError(
            "PostgreSQL's server binaries are missing: run `make system-deps` (Debian: postgresql)"
        )
    return Path(found[-1]).parent


class Cluster:
    def __init__(self, data: Path | None = None, port: int | None = None) -> None:
        self.bin = server_bin()
        self.port = port
        self.dir = Path(tempfile.mkdtemp(prefix="ocr-pg-"))  # short: a socket path holds at most 107 bytes
        self.as_server: list[str] = []
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            os.chown(self.dir, nobody.pw_uid, nobody.pw_gid)
            self.as_server = ["runuser", "-u", "nobody", "--"]
            data = None
        self.data = data or self.dir / "data"

    def _run(self, *args: str) -> None:
        subprocess.run([*self.as_server, *args], check=True, capture_output=True, cwd=self.dir)

    def start(self, standby_of: Cluster | None = None) -> Cluster:
        shutil.rmtree(self.data, ignore_errors=True)  # throw-away: a fresh cluster each time
        if standby_of is None:
            self._run(
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "ocr",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
            )
        else:  # initdb's pg_hba lets the local socket replicate (trust)
            self._run(
                str(self.bin / "pg_basebackup"),
                "-h",
                str(standby_of.dir),
                *(["-p", str(standby_of.port)] if standby_of.port else []),
                "-U",
                "ocr",
                "-D",
                str(self.data),
                "-R",
                "--checkpoint=fast",  # else it waits for the primary's next checkpoint (minutes)
                "--no-sync",
            )
        listen = f"-c listen_addresses=127.0.0.1 -p {self.port}" if self.port else "-c listen_addresses=''"
        opts = f"-k {self.dir} {listen} -c fsync=off -c synchronous_commit=off"
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.dir / "log"),
            "-o",
            opts,
            "-w",
            "start",
        )
        return self

    def url(self, database: str) -> str:
        port = f"&port={self.port}" if self.port else ""
        return f"postgresql://ocr@/{database}?host={self.dir}{port}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
            shutil.rmtree(self.data, ignore_errors=True)
