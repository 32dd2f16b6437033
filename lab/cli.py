"""CLI: python3 -m lab {image,up,down,status,exec,ssh,instance-config,gpu} (see README.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from . import gpu, image, lab, state
from .base import LabError
from .procs import nsenter_argv


def _print(obj, as_json: bool) -> None:
    if as_json:
        print(json.dumps(obj, indent=2))
        return
    for d in obj if isinstance(obj, list) else [obj]:
        print(
            f"lab {d['name']}: bridge {d['bridge']} {d['bridge_ip']} ({d['subnet']}),"
            f" apt proxy {d['apt_proxy']}"
        )
        print(f"  key {d['key']}\n  inventory {d['inventory']}")
        for h in d["hosts"]:
            extra = f" {h.get('system_state', '')}" if "system_state" in h else ""
            print(f"  {h['name']:<20} {h['address']:<15} leader pid {h['leader']}{extra}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m lab", description=lab.__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("image", help="build/reuse the cached Debian rootfs")
    s.add_argument("--force", action="store_true", help="rebuild even if the cached one is current")
    s = sub.add_parser("up", help="boot a lab (tears down a stale lab of that name first)")
    s.add_argument("name")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--hosts", type=int, metavar="N", help="hosts NAME-1..NAME-N (default 1)")
    g.add_argument("--host", action="append", metavar="HOST", help="explicit host name (repeatable)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--keep-on-failure", action="store_true", help="leave a failed lab up to inspect it")
    s = sub.add_parser("down", help="tear down a lab, or --all; idempotent")
    s.add_argument("name", nargs="?")
    s.add_argument("--all", action="store_true")
    s = sub.add_parser("status", help="show labs")
    s.add_argument("name", nargs="?")
    s.add_argument("--json", action="store_true")
    s.add_argument("--leftovers", action="store_true", help="list anything the lab left on the machine")
    s = sub.add_parser("exec", help="run a command in a host via nsenter: exec NAME HOST -- CMD...")
    s.add_argument("name")
    s.add_argument("host")
    s.add_argument("command", nargs=argparse.REMAINDER)
    s = sub.add_parser("ssh", help="ssh into a host with the lab key: ssh NAME HOST [-- CMD...]")
    s.add_argument("name")
    s.add_argument("host")
    s.add_argument("command", nargs=argparse.REMAINDER)
    s = sub.add_parser("instance-config", help="print Molecule's molecule_instance_config (JSON list)")
    s.add_argument("name")
    s = sub.add_parser(
        "gpu", help="GPU stand-ins in a host (fake GPUs, NVSwitches, nvidia-smi, mokutil, reboot)"
    )
    s.add_argument("name")
    s.add_argument("host")
    s.add_argument("--gpus", type=int, help="GPUs (device nodes, PCI devices, nvidia-smi rows)")
    s.add_argument("--nvswitches", type=int, help="NVSwitches (PCI devices): an HGX baseboard")
    s.add_argument("--model", help="GPU name nvidia-smi reports")
    s.add_argument("--driver", help="driver version of a stand-in nvidia-smi not installed from a package")
    s.add_argument("--cuda", help="CUDA version nvidia-smi reports (default: its package's)")
    s.add_argument(
        "--loaded-module",
        dest="module",
        help="the loaded kernel module's version (mismatch if it is not the libraries')",
    )
    s.add_argument("--fail", choices=["on", "off"], help="nvidia-smi cannot talk to the driver")
    s.add_argument("--secure-boot", choices=["on", "off"], help="what mokutil --sb-state says")
    s.add_argument(
        "--enroll", metavar="CERT", help="a certificate (controller path) mokutil says is enrolled"
    )
    s.add_argument("--fabric-fault", choices=["on", "off"], help="nvidia-fabricmanager fails to start")
    s.add_argument(
        "--smi", action="store_true", help="install nvidia-smi in /usr/local/bin (no driver package)"
    )
    a = p.parse_args(argv)

    try:
        if a.cmd == "image":
            t0 = time.monotonic()
            path = image.build_image(force=a.force)
            print(
                json.dumps(
                    {
                        "image": str(path),
                        "recipe_hash": image.recipe_hash(),
                        "seconds": round(time.monotonic() - t0, 1),
                    }
                )
            )
        elif a.cmd == "up":
            result = lab.up(a.name, hosts=a.host, count=a.hosts, keep_on_failure=a.keep_on_failure)
            _print(result.to_dict(), a.json)
        elif a.cmd == "down":
            if not a.all and not a.name:
                p.error("down needs NAME or --all")
            lab.down(a.name, all=a.all)
        elif a.cmd == "status":
            if a.leftovers:
                print(json.dumps(lab.leftovers(), indent=2))
            else:
                _print(lab.status(a.name), a.json)
        elif a.cmd in ("exec", "ssh"):
            cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
            lb = state.load(a.name)
            if a.cmd == "exec":
                if not cmd:
                    p.error("exec needs a command after --")
                h = lb.host(a.host)
                argv = [*nsenter_argv(h.leader, (lb.name, h.name)), *cmd]
            else:
                argv = lb.ssh_argv(a.host, *cmd)
                if not cmd and sys.stdin.isatty():
                    argv.insert(1, "-t")
            os.execvp(argv[0], argv)  # noqa: S606 -- hand the terminal to ssh/nsenter
        elif a.cmd == "gpu":
            flags = {
                k: getattr(a, k) == "on" if getattr(a, k) else None
                for k in ("fail", "secure_boot", "fabric_fault")
            }
            print(
                json.dumps(
                    gpu.configure(
                        a.name,
                        a.host,
                        smi=a.smi,
                        gpus=a.gpus,
                        nvswitches=a.nvswitches,
                        model=a.model,
                        driver=a.driver,
                        cuda=a.cuda,
                        module=a.module,
                        enroll=a.enroll,
                        **flags,
                    )
                )
            )
        elif a.cmd == "instance-config":
            print(json.dumps(state.instance_config(a.name), indent=2))
    except LabError as exc:
        print(f"lab: error: {exc}", file=sys.stderr)
        return 1
    return 0
