#!/usr/bin/env bash
# Debian packages that `make test` and `make demo` need on the controller. Idempotent.
#   scripts/install-system-deps.sh            the base set
#   scripts/install-system-deps.sh browser    plus a headless browser for make test-web (~380 MB)
#   scripts/install-system-deps.sh bench      plus Tesseract 5 for make bench's development set
set -euo pipefail

pkgs=(
  python3-venv        # the project's virtualenv
  fonts-dejavu-core   # Latin test documents
  fonts-wqy-microhei  # Chinese and Japanese test documents
  postgresql          # the job store: make test-app starts a throw-away cluster with its server binaries
  poppler-utils       # tests/test_pdf_format.py: pdftotext reads format=pdf's text layer back
  qpdf                # tests/test_pdf_format.py: qpdf --check, format=pdf's structure
  tesseract-ocr       # tests/test_ocrmypdf_plugin.py: OCRmyPDF 17 will not start without it, whatever its engine
)
if [ "${1:-}" = browser ]; then
  pkgs+=(
    chromium          # make test-web: the web page in a real (headless) browser,
    chromium-driver   # driven by selenium through chromedriver
  )
elif [ "${1:-}" = bench ]; then
  pkgs+=(
    # poppler-utils (base set): bench/devset.py's pdftoppm renders its pages, pdftotext their ground truth
    # tesseract-ocr (base set): bench/devset.py's reference, bench/ocrmypdf.py's OCRmyPDF side
    tesseract-ocr-eng
  )
fi

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
