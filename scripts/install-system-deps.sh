#!/usr/bin/env bash
# Debian packages that `make test` and `make demo` need on the controller. Idempotent.
set -euo pipefail

pkgs=(
  python3-venv        # the project's virtualenv
  fonts-dejavu-core   # Latin test documents
  fonts-wqy-microhei  # Chinese and Japanese test documents
)

sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing: ${missing[*]}"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
