"""The hosts' image: a Debian rootfs built with debootstrap from the controller's mirror, customised, and
cached under a stamp of its recipe's hash, so that a changed recipe rebuilds and a half-built image is never
used."""

from __future__ import annotations

import contextlib
import hashlib
import json
import tempfile
import time
from pathlib import Path

from .apt import apt_proxy_url, apt_sources
from .base import LabError, cache_dir, locked, require_root, run, say, tail, umount_under
from .state import running_labs

SUITE = "bookworm"
# Everything Ansible and the roles' tests need on a bare host; the rest comes
# through the apt proxy at converge time, as on a real server.
INCLUDE = [
    "systemd",
    "systemd-sysv",
    "openssh-server",
    "python3",
    "sudo",
    "dbus",
    "iproute2",
    "python3-apt",
    "ca-certificates",
    "gnupg",
    "procps",
]
# Bump when the post-debootstrap steps change in a way the hash cannot see.
RECIPE_VERSION = 2


def image_sources(suite: str = SUITE) -> tuple[str, str]:
    """(debootstrap mirror, deb822 sources for the image) from the controller's own apt sources."""
    entries = []
    for e in apt_sources():
        suites = [
            s for s in e["suites"] if s == suite or s.startswith(suite + "-") or s.startswith(suite + "/")
        ]
        if suites and e["uris"]:
            entries.append({**e, "suites": suites})
    mirror = next((e["uris"][0] for e in entries if suite in e["suites"]), None)
    if not mirror:
        raise LabError(f"no apt source for suite {suite!r} in /etc/apt (needed as the debootstrap mirror)")
    # http only: the apt proxy does plain http and hosts have no other way out.
    text = "\n".join(
        f"Types: deb\nURIs: {' '.join(e['uris'])}\nSuites: {' '.join(e['suites'])}\n"
        f"Components: {' '.join(e['components'])}\n"
        f"Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
        for e in entries
    )
    return mirror, text


def _image_files() -> dict[str, str]:
    """Files written into the image after debootstrap (path -> content)."""
    return {
        "/etc/apt/apt.conf.d/01ocrlab-proxy": (
            "// ocrfleet lab: hosts have no route out; all apt traffic goes through the lab proxy.\n"
            f'Acquire::http::Proxy "{apt_proxy_url()}";\n'
            '// Fail in seconds, not minutes, when the proxy is down.\nAcquire::http::Timeout "30";\n'
        ),
        "/etc/ssh/sshd_config.d/ocrlab.conf": (
            "# ocrfleet lab: root by key only (the key is bind-mounted per lab).\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUseDNS no\n"
        ),
        "/etc/hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    }


def recipe(suite: str = SUITE) -> dict:
    mirror, sources = image_sources(suite)
    return {
        "version": RECIPE_VERSION,
        "suite": suite,
        "variant": "minbase",
        "include": INCLUDE,
        "mirror": mirror,
        "sources": sources,
        "files": _image_files(),
    }


def recipe_hash(suite: str = SUITE) -> str:
    return hashlib.sha256(json.dumps(recipe(suite), sort_keys=True).encode()).hexdigest()[:16]


def image_path(suite: str = SUITE) -> Path:
    return cache_dir() / "images" / f"debian-{suite}"


def _stamp_path(suite: str = SUITE) -> Path:
    return cache_dir() / "images" / f"debian-{suite}.stamp"


def image_ready(suite: str = SUITE) -> bool:
    try:
        stamp = json.loads(_stamp_path(suite).read_text())
    except (OSError, ValueError):
        return False
    return (
        stamp.get("recipe_hash") == recipe_hash(suite)
        and (image_path(suite) / "usr/lib/systemd/systemd").exists()
    )


def _rmtree(path: Path) -> None:
    if path.exists():
        umount_under(path)
        run(["rm", "-rf", "--one-file-system", str(path)], timeout=300)


def build_image(suite: str = SUITE, force: bool = False) -> Path:
    """Build (or reuse) the cached rootfs. Atomic: a half-built image is never marked good."""
    require_root()
    with locked():
        if image_ready(suite) and not force:
            return image_path(suite)
        if running_labs():
            raise LabError(
                f"labs are running on the image ({', '.join(running_labs())}); "
                "run `down --all` before rebuilding it"
            )
        rec = recipe(suite)
        h = recipe_hash(suite)
        images = cache_dir() / "images"
        images.mkdir(parents=True, exist_ok=True)
        for stale in images.glob(f".debian-{suite}.*"):  # leftovers of interrupted builds
            _rmtree(stale)
        tmp = Path(tempfile.mkdtemp(prefix=f".debian-{suite}.build-", dir=images))
        root = tmp / "rootfs"
        t0 = time.monotonic()
        try:
            say(f"debootstrap {suite} from {rec['mirror']} (a few minutes)...")
            cp = run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={','.join(INCLUDE)}",
                    suite,
                    str(root),
                    rec["mirror"],
                ],
                check=False,
                timeout=1800,
            )
            if cp.returncode != 0:
                log = root / "debootstrap/debootstrap.log"
                raise LabError(f"debootstrap failed (rc={cp.returncode}):\n{cp.stderr[-3000:]}\n{tail(log)}")
            _customise(root, rec)
            elapsed = time.monotonic() - t0
            stamp = tmp / "stamp"
            stamp.write_text(
                json.dumps(
                    {
                        "recipe_hash": h,
                        "suite": suite,
                        "built_at": time.time(),
                        "build_seconds": round(elapsed, 1),
                    },
                    indent=2,
                )
                + "\n"
            )
            # Swap: drop the old stamp first, so a crash mid-swap leaves "not ready", never "ready+half".
            _stamp_path(suite).unlink(missing_ok=True)
            old = images / f".debian-{suite}.old"
            if image_path(suite).exists():
                image_path(suite).rename(old)
            root.rename(image_path(suite))
            stamp.rename(_stamp_path(suite))
            _rmtree(old)
            say(f"image ready in {elapsed:.0f}s: {image_path(suite)}")
        finally:
            _rmtree(tmp)
        return image_path(suite)


def _customise(root: Path, rec: dict) -> None:
    """Post-debootstrap steps, done in a chroot-free way where possible."""
    (root / "etc/apt/sources.list").unlink(missing_ok=True)
    (root / "etc/apt/sources.list.d/debian.sources").write_text(rec["sources"])
    for path, content in rec["files"].items():
        p = root / path.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
    ssh = root / "root/.ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    (ssh / "authorized_keys").touch(mode=0o600)  # bind-mount target for the lab key
    # No /etc/hostname (debootstrap copies the controller's): systemd then keeps the
    # name nspawn's --hostname gave it, and Ansible's hostname module can still set one.
    (root / "etc/hostname").unlink(missing_ok=True)
    # Empty machine-id: each boot gets its own (from nspawn's --uuid), so hosts differ.
    (root / "etc/machine-id").write_text("")
    with contextlib.suppress(FileNotFoundError):
        (root / "var/lib/dbus/machine-id").unlink()
    # Units that only make sense on real hardware would leave the hosts "degraded".
    # apt-daily timers would take the dpkg lock in the middle of a converge.
    for unit in ("systemd-networkd-wait-online.service", "apt-daily.timer", "apt-daily-upgrade.timer"):
        link = root / "etc/systemd/system" / unit
        if not link.exists():
            link.symlink_to("/dev/null")
    run(["chroot", str(root), "apt-get", "clean"], timeout=120)
