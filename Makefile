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

.PHONY: help demo test test-app test-lab test-roles test-site lint bench venv system-deps lab-deps wheelhouse clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(VENV_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check pip==$(PIP_VERSION)
	$(BIN)/pip install --quiet -e '.[cpu,dev,bench,kit]'
	rm -f $(VENV)/.ocrfleet-*
	touch $@

venv: $(VENV_STAMP)  ## the virtualenv with the app and its tools

system-deps:  ## Debian packages for the tests and the demo (fonts, venv)
	scripts/install-system-deps.sh

lab-deps:  ## what the nspawn lab needs on this machine (root)
	tests/lab/install-deps.sh

demo: system-deps venv  ## run the OCR service locally with the CPU engine and OCR a sample
	$(BIN)/python scripts/demo.py

lint: venv  ## ruff, formatting, yamllint and ansible-lint (production profile)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/yamllint --strict .
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/ansible-lint --profile production -q

test-app: system-deps venv  ## the service's tests (no root needed)
	$(BIN)/pytest -m "not lab" tests

test-lab: lab-deps venv  ## the nspawn lab's self-test (root)
	$(BIN)/pytest -m lab tests/lab

test: system-deps lab-deps venv wheelhouse  ## everything, from nothing: lint, app, lab, roles, site
	$(MAKE) lint
	$(MAKE) test-app
	$(MAKE) test-lab
	$(MAKE) test-roles
	$(MAKE) test-site

test-site: lab-deps venv wheelhouse  ## site.yml on two lab hosts, verified from outside (root)
	$(BIN)/pytest -s -m lab tests/site

bench: system-deps venv  ## throughput and latency ratios, measured side by side
	$(BIN)/python -m bench.run

clean:  ## remove the virtualenv and caches (the lab's image cache stays)
	rm -rf $(VENV) .pytest_cache .ruff_cache .demo

wheelhouse: venv  ## the app and all its dependencies as wheels for the hosts (build/wheelhouse)
	scripts/build-wheelhouse.sh build/wheelhouse

test-roles: lab-deps venv wheelhouse  ## every role's Molecule scenario on nspawn hosts (root)
	PATH="$(abspath $(BIN)):$$PATH" tests/molecule/run.sh
