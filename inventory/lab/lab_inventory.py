#!/usr/bin/env python3
"""Ansible inventory of a running nspawn lab (lab/): `ansible-playbook -i inventory/lab site.yml`.

The lab is `$OCRFLEET_LAB_NAME` (default `site`). Hosts are grouped by name: `app-N` -> ocr_servers,
`lb-N` -> ocr_lb (two or more: a pair sharing the service address), `mon-N` -> monitoring, `db-N` -> ocr_db
(two or more: groups etcd and pgbackrest_repo too). Connection settings come from the lab's own state (key,
addresses, apt proxy).
"""

import ipaddress
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from lab.base import LabError  # noqa: E402
from lab.net import lb_service_address  # noqa: E402
from lab.state import load  # noqa: E402

GROUPS = {"app": "ocr_servers", "lb": "ocr_lb", "mon": "monitoring", "db": "ocr_db"}


def inventory() -> dict:
    name = os.environ.get("OCRFLEET_LAB_NAME", "site")
    try:
        lab = load(name)
    except LabError as err:
        # An empty inventory with the reason, rather than a traceback in Ansible's output.
        print(f"lab_inventory: {err}", file=sys.stderr)
        return {"_meta": {"hostvars": {}}}
    groups: dict[str, list[str]] = {g: [] for g in GROUPS.values()}
    hostvars = {}
    for h in lab.hosts:
        group = GROUPS.get(h.name.rsplit("-", 1)[0])
        if group:
            groups[group].append(h.name)
        hostvars[h.name] = {"ansible_host": h.address}
    # Two or more database hosts: a replicated job database (Patroni), whose etcd members are the database
    # hosts and the first monitoring host (an odd number: one more database host than that is left out).
    # The same layout keeps pgBackRest's repository on the first monitoring host (WAL archiving, backups).
    if len(groups["ocr_db"]) >= 2:
        members = groups["ocr_db"] + groups["monitoring"][:1]
        groups["etcd"] = members if len(members) % 2 else members[:-1]
        groups["pgbackrest_repo"] = groups["monitoring"][:1]
    else:
        groups["etcd"] = []
        groups["pgbackrest_repo"] = []
    group_vars: dict[str, dict] = {g: {} for g in groups}
    # Two or more LBs: keepalived holds the service address on one of them; their certificates name it.
    if len(groups["ocr_lb"]) >= 2:
        address = lb_service_address(lab.subnet)
        prefix = ipaddress.ip_network(lab.subnet).prefixlen
        group_vars["ocr_lb"] = {
            "keepalived_virtual_address": f"{address}/{prefix}",
            "ocr_lb_server_names": [address],
        }
    return {
        **{g: {"hosts": hosts, "vars": group_vars[g]} for g, hosts in groups.items()},
        "all": {
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": lab.key,
                "ansible_ssh_common_args": (
                    "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o IdentitiesOnly=yes"
                ),
                "ansible_python_interpreter": "/usr/bin/python3",
                "lab_name": lab.name,
                "lab_controller_address": lab.bridge_ip,
                "lab_subnet": lab.subnet,
                # Where lab/fleet.py writes the model revisions the lab installs (group_vars/ocr_servers).
                "lab_models_dir": str(ROOT / "build" / "models"),
            }
        },
        "_meta": {"hostvars": hostvars},
    }


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--host":
        print("{}")
    else:
        print(json.dumps(inventory(), indent=2))
