#!/usr/bin/env bash
# promtool for `make lint` (checks and unit-tests files/prometheus/): taken out of Debian's `prometheus` package
# with `apt-get download` + `dpkg-deb`, so nothing is installed and no Prometheus daemon is set up or started.
# Prints the path of the binary. Idempotent: reuses the cached one while it is the archive's current version.
#   OCRFLEET_PROMTOOL_DIR  cache directory (default /var/cache/ocrfleet/promtool as root, else ~/.cache/...)
set -euo pipefail

if [ "$(id -u)" = 0 ]; then
  dir="${OCRFLEET_PROMTOOL_DIR:-/var/cache/ocrfleet/promtool}"
else
  dir="${OCRFLEET_PROMTOOL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ocrfleet/promtool}"
fi

candidate() { apt-cache policy prometheus 2>/dev/null | awk '/Candidate:/ {print $2}'; }

version="$(candidate)"
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
  # No package lists yet (a fresh machine or container): fetch them once, as root.
  if [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    version="$(candidate)"
  fi
fi

bin="$dir/$version/promtool"
if [ -n "$version" ] && [ "$version" != "(none)" ] && [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
  # Offline or no lists: any promtool cached earlier will do.
  cached="$(find "$dir" -mindepth 2 -maxdepth 2 -name promtool -type f 2>/dev/null | sort | tail -n 1)"
  if [ -n "$cached" ]; then
    echo "$cached"
    exit 0
  fi
  echo "install-promtool.sh: Debian's prometheus package is not known to apt (run apt-get update as root)" >&2
  exit 1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# The download runs as the caller (no _apt sandbox: the temp directory is private).
(cd "$tmp" && apt-get download -q -o APT::Sandbox::User="$(id -un)" "prometheus=$version" >&2)
mkdir -p "$dir/$version.partial"
dpkg-deb --fsys-tarfile "$tmp"/prometheus_*.deb | tar -x -C "$tmp" ./usr/bin/promtool
install -m 0755 "$tmp/usr/bin/promtool" "$dir/$version.partial/promtool"
"$dir/$version.partial/promtool" --version >/dev/null
# Only a binary that runs is published; older versions are dropped.
find "$dir" -mindepth 1 -maxdepth 1 ! -name "$version.partial" -exec rm -rf {} +
mv "$dir/$version.partial" "$dir/$version"
echo "$bin"
