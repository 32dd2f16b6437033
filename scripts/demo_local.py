"""`make demo-local`: the OCR service on this machine with the CPU engine, a fresh API key, and one OCR; bulk
jobs on a throw-away PostgreSQL cluster of its own (in <state>/pg, removed at the end; scripts/pg_cluster.py).

Runs until Ctrl-C, then stops the service gracefully. `--once` stops after the first OCR.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import socket
import subprocess
import sys
import time
from io import BytesIO
from pathlib import Path

import httpx
import yaml
from pg_cluster import Cluster  # scripts/, beside this file
from PIL import Image, ImageDraw, ImageFont

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SAMPLE = [
    "ocrfleet demo invoice No. 2048",
    "Bill to: Ada Lovelace, 12 Analytical Lane",
    "2 x GPU server maintenance    1,980.00 EUR",
    "Total due within 30 days      1,980.00 EUR",
]


def say(msg: str) -> None:
    print(f"==> {msg}", flush=True)


def sample_document() -> bytes:
    font_file = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
    font = ImageFont.truetype(str(font_file), 34) if font_file.exists() else ImageFont.load_default(34)
    page = Image.new("RGB", (1240, 420), "white")
    draw = ImageDraw.Draw(page)
    for i, line in enumerate(SAMPLE):
        draw.text((60, 60 + i * 80), line, fill="black", font=font)
    buf = BytesIO()
    page.save(buf, "PNG")
    return buf.getvalue()


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--state", default=str(ROOT / ".demo"), help="where the demo keeps its config and keys")
    ap.add_argument("--once", action="store_true", help="stop after the first OCR")
    args = ap.parse_args()

    state = Path(args.state)
    state.mkdir(parents=True, exist_ok=True)
    port = args.port
    if port == 0 or not port_free(port):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if args.port:
            say(f"port {args.port} is busy; using {port}")

    keys = state / "keys.txt"
    keys.unlink(missing_ok=True)  # a fresh key per demo run
    ocr_app = shutil.which("ocr-app", path=str(BIN)) or "ocr-app"
    key = subprocess.run(
        [ocr_app, "keys", "add", "demo", "--file", str(keys)], capture_output=True, text=True, check=True
    ).stdout.splitlines()[-1]
    say("starting a throw-away PostgreSQL cluster for bulk jobs")
    cluster = Cluster(state / "pg").start()
    try:
        return serve(ocr_app, state, port, keys, key, cluster, args.once)
    finally:
        cluster.stop()


def run_job(url: str, key: str) -> str:
    """Submit the sample as a bulk job, wait for it (bounded), and say how it ended."""
    auth = {"Authorization": f"Bearer {key}"}
    r = httpx.post(f"{url}/v1/jobs", content=sample_document(), headers={**auth, "Content-Type": "image/png"})
    status_url = url + r.raise_for_status().json()["status_url"]  # relative to the service
    deadline = time.monotonic() + 120
    while (job := httpx.get(status_url, headers=auth).raise_for_status().json())["status"] in (
        "queued",
        "running",
    ):
        if time.monotonic() > deadline:
            raise SystemExit(f"the demo's job is still {job['status']} after 120 s")
        time.sleep(0.25)
    return (
        f"job {job['job_id']} {job['status']}, {job['pages']['done']} of {job['pages']['total']} pages read"
    )


def serve(ocr_app: str, state: Path, port: int, keys: Path, key: str, cluster: Cluster, once: bool) -> int:
    config = state / "config.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "host": "127.0.0.1",
                "port": port,
                "engine": "rapidocr",
                "api_keys_file": str(keys),
                "drain_file": str(state / "drain"),
                "database_url": cluster.create_database("ocr"),
            }
        )
    )
    # The schema, as the ocr_app role brings it up before a release runs.
    subprocess.run([ocr_app, "db", "upgrade", "--config", str(config)], check=True, capture_output=True)
    log = state / "server.log"
    say(f"starting ocr-app (CPU engine, PP-OCRv6); JSON logs in {log}")
    server = subprocess.Popen(
        [ocr_app, "serve", "--config", str(config)], stdout=log.open("wb"), stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        status = None
        while status != "ready":
            if server.poll() is not None:
                print(log.read_text()[-2000:], file=sys.stderr)
                raise SystemExit(f"ocr-app exited with {server.returncode}")
            if time.monotonic() > deadline:
                raise SystemExit("ocr-app did not become ready within 180 s")
            try:
                new = httpx.get(f"{url}/healthz", timeout=2).json()["status"]
            except httpx.TransportError:
                new = "starting"
            if new != status:
                say(f"service: {new}")
                status = new
            time.sleep(0.25)

        say("OCR of a sample invoice the demo rendered:")
        r = httpx.post(
            f"{url}/v1/ocr",
            content=sample_document(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "image/png"},
            timeout=120,
        )
        r.raise_for_status()
        body = r.json()
        print()
        print(body["pages"][0]["text"])
        print()
        t = body["timings_ms"]
        say(f"{len(body['pages'][0]['lines'])} lines in {t['total']:.0f} ms (engine {body['engine']})")
        say(f"the same page as a bulk job: {run_job(url, key)}")
        print(
            f"""
  Service:   {url}        API docs: {url}/docs
  API key:   {key}
  Try:       curl -H 'Authorization: Bearer {key}' -H 'Content-Type: image/png' \\
               --data-binary @page.png {url}/v1/ocr
  Or:        .venv/bin/ocr-app ocr page.png --url {url} --key {key}
  Bulk jobs: export OCR_APP_URL={url} OCR_APP_KEY={key}
             .venv/bin/ocr-app jobs submit scan.pdf --follow --output scan.jsonl   (docs/api.md: Bulk jobs)
"""
        )
        if once:
            return 0
        say("serving; press Ctrl-C to stop")
        server.wait()
        return 0 if server.returncode == 0 else 1
    except KeyboardInterrupt:
        return 0
    finally:
        say("stopping ocr-app")
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupt)
    sys.exit(main())
