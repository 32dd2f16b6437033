#!/usr/bin/env bash
# Install what the nspawn lab needs on the controller. Idempotent; safe to rerun.
# The controller has no systemd as PID 1, so no package may start a service:
# apt-cacher-ng is started and stopped by the lab itself (lab/apt.py).
set -euo pipefail

[ "$(id -u)" = 0 ] || { echo "install-deps.sh: must run as root" >&2; exit 1; }

pkgs=(
  debootstrap          # builds the Debian rootfs
  systemd-container    # systemd-nspawn
  apt-cacher-ng        # package proxy for the hosts (they have no route out)
  iproute2             # ip link/addr for the bridge and veths
  util-linux           # nsenter
  openssh-client       # ssh/ssh-keygen
  nftables             # only to prove the controller's ruleset is untouched
  debian-archive-keyring
  gpg apt-utils        # the signed fake NVIDIA repository (tests/fixtures/nvidia_repo)
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done

if [ "${#missing[@]}" -gt 0 ]; then
  # policy-rc.d 101 stops postinst scripts from starting daemons (apt-cacher-ng's
  # init script would otherwise listen on every interface). Only install ours if
  # there is none, and always remove it again.
  own_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  trap '[ "$own_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d' EXIT
  export DEBIAN_FRONTEND=noninteractive
  # Tunnels through the proxy (CONNECT) stay off: hosts only need plain http apt.
  echo 'apt-cacher-ng apt-cacher-ng/tunnelenable boolean false' | debconf-set-selections
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Defence in depth: should anything start apt-cacher-ng from its packaged config,
# it listens on loopback only. The lab always passes BindAddress on the command
# line (the lab network address), which overrides this file.
conf=/etc/apt-cacher-ng/zz-ocrfleet-lab.conf
want='# Written by ocrfleet lab/install-deps.sh: never listen on public interfaces.
BindAddress: 127.0.0.1'
if [ "$(cat "$conf" 2>/dev/null)" != "$want" ]; then
  printf '%s\n' "$want" > "$conf"
fi

# A daemon started by a postinst before this script existed would hold port 3142.
if [ -r /run/apt-cacher-ng/pid ] && kill -0 "$(cat /run/apt-cacher-ng/pid)" 2>/dev/null; then
  echo "install-deps.sh: note: a packaged apt-cacher-ng (pid $(cat /run/apt-cacher-ng/pid)) is running;" \
       "stop it with: kill $(cat /run/apt-cacher-ng/pid)" >&2
fi

echo "install-deps.sh: ok (${#missing[@]} package(s) installed)"
