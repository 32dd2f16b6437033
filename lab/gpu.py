"""GPU stand-ins for lab hosts: `python3 -m lab gpu NAME HOST [options]`.

Lab hosts have no GPU. This gives one the parts of an NVIDIA host the kit reads, so the roles' GPU paths run
unchanged: device nodes /dev/nvidia0..N-1 and /dev/nvidiactl (ocr_app counts them; opening one gives ENXIO,
there is no driver), a PCI tree with the GPUs and NVSwitches (vendor 0x10de) at PCI_DIR for nvidia_driver's
detection (its nvidia_driver_pci_devices_dir), and stand-ins for the tools: nvidia-smi (per device, fabric
state, the driver/library mismatch), mokutil (Secure Boot, MOK enrolment) and a reboot command. Their state is
one file in the host, /etc/ocrfleet-lab/gpu.json; each call changes only the options it is given.

Stand-ins live here, never in the roles: a scenario points a role's path variables at them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .state import load

STANDINS = Path(__file__).resolve().parent / "standins"
STATE = "/etc/ocrfleet-lab/gpu.json"
# The PCI tree, the loaded module's version, the reboot command (point the roles' variables at them).
PCI_DIR = "/run/ocrfleet-lab/pci/devices"
MODULE_VERSION = "/run/ocrfleet-lab/nvidia/version"
REBOOT_COMMAND = "/usr/local/sbin/ocrfleet-lab-reboot"

# Runs inside the host (python3 -c) with {"state": STATE, "change": {...}, "files": {path: [text, mode]}, ...}
# on stdin.
_SETUP = r"""
import json, os, re, shutil, stat, sys
req = json.load(sys.stdin)
path = req["state"]
try:
    st = json.load(open(path))
except (OSError, ValueError):
    st = {"gpus": 0, "nvswitches": 0}
module = req["change"].pop("module", None)
enroll = req["change"].pop("enroll", None)
st.update(req["change"])
if enroll:
    st["enrolled"] = sorted(set(st.get("enrolled", [])) | {enroll})
# One GPU per PCI bus as on an HGX baseboard; NVSwitches after them.
st["bus_ids"] = ["%04x:%02x:00.0" % (0, 0x17 + 0x10 * i) for i in range(st["gpus"])]
switches = ["%04x:%02x:00.0" % (0, 0xa0 + i) for i in range(st["nvswitches"])]
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path + ".tmp", "w") as f:
    json.dump(st, f, indent=1)
os.replace(path + ".tmp", path)
pci = req["pci_dir"]
shutil.rmtree(pci, ignore_errors=True)
devices = [(b, "0x10de", "0x030200", "0x2330") for b in st["bus_ids"]]
devices += [(b, "0x10de", "0x068000", "0x22a3") for b in switches]
devices.append(("0000:00:00.0", "0x8086", "0x060000", "0x09a2"))  # a host bridge: not NVIDIA
for bus, vendor, klass, device in devices:
    d = os.path.join(pci, bus)
    os.makedirs(d)
    for name, value in (("vendor", vendor), ("class", klass), ("device", device)):
        with open(os.path.join(d, name), "w") as f:
            f.write(value + "\n")
for name in os.listdir("/dev"):
    if re.fullmatch(r"nvidia([0-9]+|ctl)", name):
        os.unlink("/dev/" + name)
nodes = [("/dev/nvidia%d" % i, i) for i in range(st["gpus"])]
nodes += [("/dev/nvidiactl", 255)] if st["gpus"] else []
for node, minor in nodes:
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(195, minor))
    os.chmod(node, 0o666)  # as nvidia-modprobe makes them (mknod's mode goes through the umask)
if module is not None:
    os.makedirs(os.path.dirname(req["module_file"]), exist_ok=True)
    with open(req["module_file"], "w") as f:
        f.write(module + "\n")
for dest, (text, mode) in req["files"].items():
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with open(dest + ".tmp", "w") as f:
        f.write(text)
    os.chmod(dest + ".tmp", mode)
    os.replace(dest + ".tmp", dest)
print(json.dumps(st))
"""


def configure(lab_name: str, host: str, *, smi: bool = False, **change) -> dict:
    """Change the host's GPU stand-ins (keys: gpus, nvswitches, model, driver, cuda, fail, secure_boot,
    fabric_fault, module = the loaded kernel module's version, enroll = a certificate's path here);
    returns the new state."""
    change = {k: v for k, v in change.items() if v is not None}
    if "enroll" in change:
        change["enroll"] = hashlib.sha256(Path(change["enroll"]).read_bytes()).hexdigest()
    files = {
        "/usr/local/bin/mokutil": [(STANDINS / "mokutil").read_text(), 0o755],
        REBOOT_COMMAND: [(STANDINS / "reboot").read_text(), 0o755],
    }
    if smi:
        files["/usr/local/bin/nvidia-smi"] = [(STANDINS / "nvidia-smi").read_text(), 0o755]
    req = {"state": STATE, "change": change, "files": files}
    req |= {"pci_dir": PCI_DIR, "module_file": MODULE_VERSION}
    out = load(lab_name).exec(host, ["python3", "-c", _SETUP], input=json.dumps(req))
    return json.loads(out.stdout)
