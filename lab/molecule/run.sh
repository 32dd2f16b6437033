#!/usr/bin/env bash
# Run `molecule test` for the given roles (default: every role with a scenario), one after another.
# Keeps Ansible's and Molecule's state out of $HOME; needs root (the lab) and the venv on PATH.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
state="${OCRFLEET_MOLECULE_STATE:-/tmp/ocrfleet-molecule}"
export ANSIBLE_HOME="$state/ansible" ANSIBLE_REMOTE_TMP=/tmp/.ansible-tmp
export ANSIBLE_SSH_CONTROL_PATH_DIR="$state/cp" ANSIBLE_ROLES_PATH="$root/roles"
export ANSIBLE_CONFIG="$root/ansible.cfg" ANSIBLE_FORCE_COLOR=0 PY_COLORS=0
mkdir -p "$state/cp"
roles=("$@")
if [ "${#roles[@]}" -eq 0 ]; then
  for d in "$root"/roles/*/molecule/default; do roles+=("$(basename "$(dirname "$(dirname "$d")")")"); done
fi
for r in "${roles[@]}"; do
  echo "=== molecule test: $r"
  start=$(date +%s)
  (cd "$root/roles/$r" && MOLECULE_EPHEMERAL_DIRECTORY="$state/eph/$r" molecule test)
  echo "=== $r: $(( $(date +%s) - start )) s"
done
