# ocrfleet: `make demo` runs the service locally; `make test` sets everything up and runs every check.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP_VERSION := 26.3
# Rebuilt whenever the pinned dependencies change.
VENV_STAMP := $(VENV)/.ocrfleet-$(shell sha256sum pyproject.toml | cut -c1-12)

.PHONY: help demo test test-app test-lab lint bench venv system-deps lab-deps clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(VENV_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check pip==$(PIP_VERSION)
	$(BIN)/pip install --quiet -e '.[cpu,dev,bench]'
	rm -f $(VENV)/.ocrfleet-*
	touch $@

venv: $(VENV_STAMP)  ## the virtualenv with the app and its tools

system-deps:  ## Debian packages for the tests and the demo (fonts, venv)
	scripts/install-system-deps.sh

lab-deps:  ## what the nspawn lab needs on this machine (root)
	tests/lab/install-deps.sh

demo: system-deps venv  ## run the OCR service locally with the CPU engine and OCR a sample
	$(BIN)/python scripts/demo.py

lint: venv  ## ruff, formatting and yamllint
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/yamllint --strict .

test-app: system-deps venv  ## the service's tests (no root needed)
	$(BIN)/pytest -m "not lab" tests

test-lab: lab-deps venv  ## the nspawn lab's self-test (root)
	$(BIN)/pytest -m lab tests/lab

test: system-deps lab-deps venv lint  ## everything, from nothing: lint, the app, the lab
	$(BIN)/pytest tests

bench: system-deps venv  ## throughput and latency ratios, measured side by side
	$(BIN)/python -m bench.run

clean:  ## remove the virtualenv and caches (the lab's image cache stays)
	rm -rf $(VENV) .pytest_cache .ruff_cache .demo
