"""`make demo`: a local OCR fleet in the lab — app hosts behind an HAProxy load balancer, real systemd
hosts (systemd-nspawn) converged with site.yml and the CPU engine — then an OCR through the load balancer.

    scripts/demo.py up [--apps N] [--dbs N] [--lbs N]
                                      build what is missing, boot, converge, OCR a sample (root)
    scripts/demo.py down              tear the demo's hosts down (`make demo-down`)

make test-fleet brings its fleet up with this script too (`--lab fleet --apps 3`).

The fleet's CA and API key stay in .demo/fleet/ so that you can keep using it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab import fleet as F  # noqa: E402
from lab.image import build_image, image_ready  # noqa: E402
from scripts.demo_local import sample_document  # noqa: E402


def say(msg: str) -> None:
    print(f"==> {msg}", flush=True)


class Progress:
    """One status line rewritten in place on a terminal; one line per step otherwise (CI logs)."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.width = shutil.get_terminal_size((100, 20)).columns - 1

    def __call__(self, line: str) -> None:
        if self.tty and "PLAY " not in line and "failed on" not in line:
            print("\r" + line[: self.width].ljust(self.width), end="", flush=True)
        else:
            print(("\r" + " " * self.width + "\r" if self.tty else "") + line, flush=True)

    def done(self) -> None:
        if self.tty:
            print("\r" + " " * self.width + "\r", end="", flush=True)


def up(args: argparse.Namespace) -> int:
    state = Path(args.state)
    started = time.monotonic()
    if not image_ready():
        say("building the lab's Debian image (once; cached in /var/cache/ocrfleet-lab)")
        build_image()
    progress = Progress()
    dbs = "a job database host" if args.dbs == 1 else f"{args.dbs} job database hosts (Patroni)"
    lbs = "a load balancer" if args.lbs == 1 else f"{args.lbs} load balancers (keepalived)"
    say(
        f"booting {args.apps} app hosts, {lbs}, a monitoring host and {dbs}, then converging "
        "site.yml (CPU engine)"
    )
    try:
        fleet = F.up(args.lab, args.apps, state, progress=progress, dbs=args.dbs, lbs=args.lbs)
    except F.PlaybookFailed as err:
        progress.done()
        say(str(err))
        say(f"the hosts stay up to look at (`python3 -m lab ssh {args.lab} app-1`); `make demo-down`")
        return 1
    progress.done()
    say(f"fleet converged in {time.monotonic() - started:.0f} s")

    say("OCR of a sample invoice through the load balancer:")
    with fleet.client() as c:
        r = c.post("/v1/ocr", content=sample_document(), headers={"Content-Type": "image/png"})
    if r.status_code != 200:
        say(f"OCR failed: HTTP {r.status_code} {r.text[:500]}")
        return 1
    body = r.json()
    print("\n" + body["pages"][0]["text"] + "\n")
    apps = ", ".join(f"{h} {fleet.lab.host(h).address}" for h in fleet.apps)
    print(
        f"""  Load balancer: {fleet.lb_url}   (web page: {fleet.lb_url}/, API docs: {fleet.lb_url}/docs)
  App hosts:     {apps}
  CA:            {fleet.ca_file}
  API key:       {fleet.key}   (also in {state / "api-key"})
  Try:           curl --cacert {fleet.ca_file} -H 'Authorization: Bearer {fleet.key}' \\
                   -H 'Content-Type: image/png' --data-binary @page.png {fleet.lb_url}/v1/ocr
  Upgrade:       make wheelhouse   (after changing the app; bump its version in pyproject.toml), then
                 OCRFLEET_LAB_NAME={args.lab} .venv/bin/ansible-playbook -i inventory/lab \\
                   playbooks/upgrade.yml -e @{fleet.vars_file}
  Hosts:         python3 -m lab ssh {args.lab} app-1   (journalctl -u 'ocr-app@*')
  Monitoring:    python3 -m lab ssh {args.lab} mon-1   (Prometheus on 127.0.0.1:9090, Alertmanager on :9093)
  Job database:  python3 -m lab ssh {args.lab} db-1    (PostgreSQL 15; nightly pg_dump in /var/backups{
            "" if args.dbs == 1 else "; patronictl -c /etc/patroni/config.yml list"
        })
  Stop:          {"make demo-down" if args.lab == "demo" else f"scripts/demo.py --lab {args.lab} down"}
"""
    )
    return 0


def down(args: argparse.Namespace) -> int:
    F.down(args.lab)
    say(f"lab {args.lab!r} is down ({args.state} keeps the CA and the key)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", default=str(ROOT / ".demo" / "fleet"), help="the fleet's CA and API key")
    ap.add_argument("--lab", default="demo", help="the lab's name (default demo)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("up", help="boot and converge the demo fleet, then OCR a sample through it")
    p.add_argument("--apps", type=int, default=2, help="app hosts behind the load balancer (default 2)")
    p.add_argument(
        "--dbs", type=int, default=1, help="job database hosts (default 1; 2: replicated, Patroni and etcd)"
    )
    p.add_argument("--lbs", type=int, default=1, help="load balancers (default 1; 2: a pair, keepalived)")
    sub.add_parser("down", help="tear the demo fleet down")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("the demo boots systemd-nspawn hosts: run it as root (sudo make demo)")
    return up(args) if args.cmd == "up" else down(args)


if __name__ == "__main__":
    sys.exit(main())
