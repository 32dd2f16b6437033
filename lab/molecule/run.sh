#!/usr/bin/env bash
# Run `molecule test` for the given roles' scenarios (`role` for its default one, `role/scenario` for another; by
# default every scenario of every role), OCRFLEET_MOLECULE_JOBS at a time
# (default 2). One scenario keeps about one core busy (Ansible's forks, the hosts' services) and spends the rest
# waiting on its hosts, so two lanes on a 2-core machine take about half the time of one. Each scenario is its
# own lab (lab-vars.yml), so lanes (and checkouts) share nothing but the image cache and the apt proxy, which
# the lab locks.
# A scenario's output goes to its own log, printed whole when it ends (never interleaved), with its duration.
# Keeps Ansible's and Molecule's state out of $HOME; needs root (the lab) and the venv on PATH.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
# Per checkout, as the labs are: two clones' runs of one role (a clean-clone CI run beside a working tree) would
# otherwise share Molecule's ephemeral directory (its inventory) and the scenario's log.
state="${OCRFLEET_MOLECULE_STATE:-/tmp/ocrfleet-molecule-$(printf %s "$root" | sha1sum | cut -c1-4)}"
jobs="${OCRFLEET_MOLECULE_JOBS:-2}"
export ANSIBLE_HOME="$state/ansible" ANSIBLE_REMOTE_TMP=/tmp/.ansible-tmp
export ANSIBLE_SSH_CONTROL_PATH_DIR="$state/cp" ANSIBLE_ROLES_PATH="$root/roles"
export ANSIBLE_CONFIG="$root/ansible.cfg" ANSIBLE_FORCE_COLOR=0 PY_COLORS=0
mkdir -p "$state/cp" "$state/log"
# The longest scenarios first, so the lanes end close together (measured 2026-12-01/02: ocr_model 437 s, ocr_lb
# 390, ocr_app 380, nvidia_driver 372, nginx_tls 247, postgresql 137; the others under 140 s; 2026-12-07, a faster
# machine: postgresql/patroni 326 s against postgresql's 100). A scenario not named here comes after them.
slow_first=(ocr_model ocr_lb ocr_app nvidia_driver postgresql/patroni nginx_tls postgresql)
roles=("$@")
if [ "${#roles[@]}" -eq 0 ]; then
  all=()
  # A role's scenario `default` is named by the role, another one as role/scenario (postgresql/patroni).
  for d in "$root"/roles/*/molecule/*/molecule.yml; do
    d="$(dirname "$d")"; r="$(basename "$(dirname "$(dirname "$d")")")"; s="$(basename "$d")"
    all+=("$r$([ "$s" = default ] || echo "/$s")")
  done
  for r in "${slow_first[@]}"; do [[ " ${all[*]} " == *" $r "* ]] && roles+=("$r"); done
  for r in "${all[@]}"; do [[ " ${slow_first[*]} " == *" $r "* ]] || roles+=("$r"); done
fi

stamp() {  # prefix each line with the seconds since the first (molecule's own status stays the pipeline's)
  python3 -u -c 'import sys, time
t0 = time.monotonic()
for line in sys.stdin:
    sys.stdout.write(f"{time.monotonic() - t0:7.1f} {line}")'
}
steps() {  # one line: each molecule step of a stamped log and the seconds it took
  awk '/\[[a-z_]+ > [a-z_]+\] Executing/ { match($0, /> [a-z_]+\]/); s = substr($0, RSTART + 2, RLENGTH - 3); t = $1 }
       /\[[a-z_]+ > [a-z_]+\] Executed/ { printf "%s %.0f s, ", s, $1 - t }' "$1" | sed 's/, $//'
}
declare -A role_of=() start_of=()
failed=()
finish() {  # $1: the pid that ended, $2: its status
  local r="${role_of[$1]}" log="$state/log/${role_of[$1]//\//-}.log"
  echo "=== molecule test: $r (log: $log)"
  cat "$log"
  echo "=== $r: $(( $(date +%s) - start_of[$1] )) s$( [ "$2" -eq 0 ] || echo ", FAILED (rc $2)") ($(steps "$log"))"
  [ "$2" -eq 0 ] || failed+=("$r")
  unset "role_of[$1]"
}
# A stopped run (Ctrl-C, CI's timeout) stops its scenarios too; their labs are torn down by the next `lab up`.
trap 'kill "${!role_of[@]}" 2>/dev/null || true' EXIT

for r in "${roles[@]}"; do
  while [ "${#role_of[@]}" -ge "$jobs" ]; do
    rc=0; wait -n -p pid "${!role_of[@]}" || rc=$?
    finish "$pid" "$rc"
  done
  echo "=== started: $r"
  # A fresh Molecule state: `create` always runs, and `lab up` replaces any host an interrupted run left, so the
  # scenarios start without a `destroy` (and without `syntax`: make lint's ansible-lint syntax-checks them).
  role="${r%%/*}"; scenario="${r#*/}"; [ "$scenario" != "$r" ] || scenario=default; name="${r//\//-}"
  rm -rf "$state/eph/$name"
  # Each line stamped with the seconds since the scenario started, so that the steps' times can be read back.
  (cd "$root/roles/$role" && MOLECULE_EPHEMERAL_DIRECTORY="$state/eph/$name" molecule test -s "$scenario" 2>&1 | stamp) \
    >"$state/log/$name.log" &
  role_of[$!]="$r"; start_of[$!]=$(date +%s)
done
while [ "${#role_of[@]}" -gt 0 ]; do
  rc=0; wait -n -p pid "${!role_of[@]}" || rc=$?
  finish "$pid" "$rc"
done
trap - EXIT
if [ "${#failed[@]}" -gt 0 ]; then
  echo "=== molecule: failed: ${failed[*]}"
  exit 1
fi
