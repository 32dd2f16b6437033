#!/usr/bin/env bash
# Build the wheelhouse the `ocr_app` role installs from: the app and ALL its runtime dependencies as wheels
# for the target hosts (Debian 12: CPython 3.11, x86_64, glibc 2.36 -> manylinux_2_36 and older), because
# hosts have no internet. Runs on the control node with the repo venv's pip (PyPI reachable from here).
#
#   scripts/build-wheelhouse.sh OUTDIR [EXTRAS]        e.g. scripts/build-wheelhouse.sh build/wheelhouse cpu,vllm
#
# Writes into OUTDIR (replaced atomically, never half-written):
#   ocr_app-<version>-py3-none-any.whl and every dependency's wheel,
#   uv-<UV_VERSION>-*.whl  the installer the ocr_app role installs releases with (not a dependency),
#   requirements.txt  exact pins (with sha256 hashes) of what is in OUTDIR:
#                     pip install --no-index --find-links OUTDIR -r OUTDIR/requirements.txt
#   SHA256SUMS        `sha256sum -c` format, every file above
#   .stamp            hash of the inputs; when it matches and SHA256SUMS verifies, nothing is rebuilt
#
# Environment:
#   OCR_WHEELHOUSE_EXTRAS       extras to include (default "cpu"; the EXTRAS argument wins), comma-separated
#   OCR_WHEELHOUSE_PYTHON       target CPython version (default 3.11)
#   OCR_WHEELHOUSE_GLIBC        the hosts' glibc (default 2.36, Debian 12; Ubuntu 22.04: 2.35) and
#   OCR_WHEELHOUSE_ARCH         their architecture (default x86_64): wheels tagged manylinux_2_17 up to that
#                               glibc (and manylinux2014/2010/1) are accepted
#   OCR_WHEELHOUSE_CONSTRAINTS  "venv" (default): pin transitive dependencies to the versions in the repo
#                               venv, where the app's tests ran; "none": let pip resolve them; or a file path
#   OCR_WHEELHOUSE_FORCE=1      rebuild even when up to date
#   VENV                        the venv whose pip is used (default .venv)
set -euo pipefail

usage() { echo "usage: $0 OUTDIR [EXTRAS]" >&2; exit 64; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
outdir="$1"
case "$outdir" in /*) ;; *) outdir="$root/$outdir" ;; esac
extras="${2:-${OCR_WHEELHOUSE_EXTRAS:-cpu}}"
pyver="${OCR_WHEELHOUSE_PYTHON:-3.11}"
glibc="${OCR_WHEELHOUSE_GLIBC:-2.36}"
arch="${OCR_WHEELHOUSE_ARCH:-x86_64}"
constraints="${OCR_WHEELHOUSE_CONSTRAINTS:-venv}"
venv="${VENV:-.venv}"
# The hosts' installer (roles/ocr_app: a release's venv and packages). One pin, here.
uv_version=0.13.8
pip="$venv/bin/pip"
python="$venv/bin/python"
[ -x "$pip" ] || { echo "$0: $pip not found: run 'make venv' first" >&2; exit 1; }
[[ "$extras" =~ ^[A-Za-z0-9_,-]*$ ]] || { echo "$0: bad extras: $extras" >&2; exit 64; }
[[ "$glibc" =~ ^2\.[0-9]+$ ]] || { echo "$0: bad glibc version: $glibc" >&2; exit 64; }
abi="cp${pyver/./}"
# pip does not expand manylinux_2_X to the older tags by itself (only manylinux2014 -> 2010 -> 1).
platform="manylinux_${glibc/./_}_$arch"
platforms=()
for ((minor = ${glibc#2.}; minor >= 5; minor--)); do platforms+=(--platform "manylinux_2_${minor}_$arch"); done
platforms+=(--platform "manylinux2014_$arch" --platform "manylinux2010_$arch" --platform "manylinux1_$arch")

# Inputs: everything that changes the result. The source tree (tracked or not, minus caches), the
# build recipe, the target and the constraints source.
inputs_hash() {
  {
    echo "extras=$extras python=$pyver platform=$platform constraints=$constraints uv=$uv_version"
    sha256sum pyproject.toml "$0"
    find ocr_app -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | LC_ALL=C sort -z \
      | xargs -0 sha256sum
    case "$constraints" in
      venv) "$pip" freeze --exclude-editable --disable-pip-version-check 2>/dev/null ;;
      none) ;;
      *) sha256sum "$constraints" ;;
    esac
  } | sha256sum | cut -d' ' -f1
}

stamp="$(inputs_hash)"
if [ "${OCR_WHEELHOUSE_FORCE:-0}" != 1 ] && [ -f "$outdir/.stamp" ] && [ "$(cat "$outdir/.stamp")" = "$stamp" ] \
   && (cd "$outdir" && sha256sum --quiet --strict -c SHA256SUMS >/dev/null 2>&1); then
  echo "wheelhouse $outdir is up to date ($(ls "$outdir"/ocr_app-*.whl | xargs -n1 basename))"
  exit 0
fi

mkdir -p "$(dirname "$outdir")"
tmp="$(mktemp -d "$(dirname "$outdir")/.wheelhouse.XXXXXX")"
cleanup() { rm -rf "$tmp"; }
trap cleanup EXIT
mkdir "$tmp/out"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 315532800)}"
pipq=(--disable-pip-version-check --no-input ${OCR_WHEELHOUSE_VERBOSE:+-v} --quiet)

echo "building the app wheel"
# From a clean copy of the sources: an in-tree setuptools build leaves build/lib behind, and stale files
# there would end up in the next wheel.
mkdir "$tmp/src"
cp pyproject.toml README.md "$tmp/src/"
tar -cf - --exclude=__pycache__ --exclude='*.pyc' ocr_app | tar -xf - -C "$tmp/src"
"$pip" wheel "${pipq[@]}" --no-deps --wheel-dir "$tmp/app" "$tmp/src"
app_whl="$(ls "$tmp"/app/ocr_app-*.whl)"
[ "$(echo "$app_whl" | wc -l)" = 1 ] || { echo "$0: expected one app wheel, got: $app_whl" >&2; exit 1; }
cp "$app_whl" "$tmp/out/"
app_whl="$tmp/out/$(basename "$app_whl")"
version="$(basename "$app_whl" | cut -d- -f2)"

cons=()
case "$constraints" in
  venv)
    # The venv's versions of everything but the app itself (and pip's own tooling).
    "$pip" freeze --exclude-editable --disable-pip-version-check \
      | grep -viE '^(ocr[-_]app|pip|setuptools|wheel)[=@ ]' | grep -v ' @ ' >"$tmp/constraints.txt" || true
    cons=(--constraint "$tmp/constraints.txt") ;;
  none) ;;
  *) cons=(--constraint "$constraints") ;;
esac

# The registry sometimes answers an index page short right after a venv's install (pip then finds "no matching
# distribution" for a version that is there, as a clean clone's make test did twice): a download that fails is
# tried again, 20 and then 60 seconds later.
again() {
  local wait
  for wait in 20 60; do
    "$@" && return 0
    echo "$0: the download failed; trying again in $wait s" >&2
    sleep "$wait"
  done
  "$@"
}

# The dependencies' wheels and uv depend only on the pins, the extras and the target: kept under
# $OCRFLEET_CACHE/wheelhouse-deps/<key> (the three newest keys), so that a clean clone's make test downloads
# them once per change of the pins, not once per clone. Skipped where that directory cannot be written.
cache_root="${OCRFLEET_CACHE:-/var/cache/ocrfleet}/wheelhouse-deps"
deps_key="$(
  {
    echo "extras=$extras python=$pyver platform=$platform constraints=$constraints uv=$uv_version"
    sha256sum <pyproject.toml
    sha256sum <"$0"
    [ "${#cons[@]}" -eq 0 ] || sha256sum <"${cons[1]}"
  } | sha256sum | cut -c1-16
)"
cache="$cache_root/$deps_key"
if [ -f "$cache/SHA256SUMS" ] && (cd "$cache" && sha256sum --quiet --strict -c SHA256SUMS >/dev/null 2>&1); then
  echo "the dependencies' wheels and uv $uv_version from $cache"
  cp "$cache"/*.whl "$tmp/out/"
else
  echo "downloading the dependencies for cp$pyver $platform (extras: ${extras:-none})"
  spec="$app_whl"
  [ -n "$extras" ] && spec="$app_whl[$extras]"
  again "$pip" download "${pipq[@]}" --dest "$tmp/out" --only-binary=:all: \
    --python-version "$pyver" --implementation cp --abi "$abi" --abi abi3 --abi none \
    "${platforms[@]}" "${cons[@]}" "$spec"

  echo "downloading uv $uv_version, the hosts' installer"
  again "$pip" download "${pipq[@]}" --dest "$tmp/out" --only-binary=:all: --no-deps \
    --python-version "$pyver" --implementation cp --abi "$abi" --abi abi3 --abi none \
    "${platforms[@]}" "uv==$uv_version"

  if mkdir -p "$cache_root" 2>/dev/null && [ -w "$cache_root" ]; then
    new="$(mktemp -d "$cache_root/.new.XXXXXX")"
    (cd "$tmp/out" && find . -maxdepth 1 -name '*.whl' ! -name 'ocr_app-*' -exec cp {} "$new/" \;)
    (cd "$new" && sha256sum -- *.whl >SHA256SUMS)
    # Whole or not at all; another build that got there first wins.
    rm -rf "$cache" && mv -T "$new" "$cache" || rm -rf "$new"
    ls -1dt "$cache_root"/*/ | tail -n +4 | xargs -r rm -rf
  fi
fi

# Nothing but wheels, each for the target.
shopt -s nullglob
for f in "$tmp"/out/*; do
  case "$(basename "$f")" in
    *-py3-none-any.whl | *-py2.py3-none-any.whl | *-"$abi"-*.whl | *-abi3-*.whl | *-none-*linux*.whl) ;;
    *) echo "$0: unexpected file for the target: $(basename "$f")" >&2; exit 1 ;;
  esac
done

# requirements.txt (name==version --hash for every wheel; the app with its extras) and SHA256SUMS.
"$python" "$root/scripts/wheelhouse_index.py" "$tmp/out" "$extras"
echo "$stamp" >"$tmp/out/.stamp"

# Swap into place: the old wheelhouse stays whole until the new one is complete.
if [ -e "$outdir" ]; then
  mv "$outdir" "$tmp/old"
fi
mv "$tmp/out" "$outdir"
count="$(ls "$outdir"/*.whl | wc -l)"
echo "wheelhouse $outdir: ocr-app $version, $((count - 2)) dependencies and uv $uv_version ($(du -sh "$outdir" | cut -f1))"
