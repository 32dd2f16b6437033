# ocrfleet: `make demo` boots a local fleet in the lab; `make test` sets everything up and runs every check.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP_VERSION := 26.3
# Rebuilt whenever the pinned dependencies change.
VENV_STAMP := $(VENV)/.ocrfleet-$(shell sha256sum pyproject.toml | cut -c1-12)

.PHONY: help browser-deps demo demo-down demo-local test test-fleet test-app test-web test-vllm test-lab test-roles lint lint-ansible lint-code bench bench-vllm mutate gpu-check venv vllm-venv system-deps lab-deps wheelhouse clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(VENV_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check pip==$(PIP_VERSION)
	$(BIN)/pip install --quiet -e '.[cpu,dev,bench,kit]'
	rm -f $(VENV)/.ocrfleet-*
	touch $@

venv: $(VENV_STAMP)  ## the virtualenv with the app and its tools

system-deps:  ## Debian packages for the tests and the demo (fonts, venv, postgresql)
	scripts/install-system-deps.sh

browser-deps:  ## Debian's chromium and chromedriver, for make test-web
	scripts/install-system-deps.sh browser

lab-deps:  ## what the nspawn lab needs on this machine (root)
	lab/install-deps.sh

demo: system-deps lab-deps venv wheelhouse  ## a local fleet: 2 app hosts + HAProxy + Prometheus in the lab, OCR through it (root)
	$(BIN)/python scripts/demo.py up

demo-down:  ## tear the demo fleet down
	$(BIN)/python scripts/demo.py down

demo-local: system-deps venv  ## just the service on this machine (no root), one OCR, until Ctrl-C
	$(BIN)/python scripts/demo_local.py

# ansible-lint takes most of lint's time on one core: the other checks run beside it, each part's output whole.
lint: venv  ## ruff, formatting, yamllint, ansible-lint (production profile), promtool on the alert rules, mypy (strict) on ocr_app/
	@$(MAKE) --no-print-directory -j2 --output-sync=target lint-ansible lint-code

lint-ansible: venv
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/ansible-lint --profile production -q

lint-code: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/yamllint --strict .
	promtool="$$(scripts/install-promtool.sh)"; \
	  "$$promtool" check rules files/prometheus/ocrfleet-alerts.yml; \
	  "$$promtool" test rules files/prometheus/ocrfleet-alerts.test.yml
	$(BIN)/mypy

# Two worker processes, one test file each at a time: the app's tests keep about one core busy alone.
TEST_APP_WORKERS ?= 2

test-app: system-deps venv  ## the service's tests (no root needed), TEST_APP_WORKERS processes
	$(BIN)/pytest -n $(TEST_APP_WORKERS) --dist loadfile --durations=12 -m "not lab and not browser" tests

test-web: system-deps browser-deps venv  ## the web page at / in headless Chromium, against the real app (no root needed)
	$(BIN)/pytest -m browser tests/web

# vLLM's CPU build, cached outside the repo by a hash of the pins (tests/vllm/venv.py); the app runs from
# the checkout. The test workarounds (tests/vllm/sitecustomize.py) come in through PYTHONPATH.
VLLM_RUN = venv="$$($(PYTHON) tests/vllm/venv.py)"; PYTHONPATH="$(CURDIR):$(CURDIR)/tests/vllm" "$$venv/bin/python"

vllm-venv:  ## the vLLM (CPU build) test venv: built once (~5 min), then reused while the pins hold
	$(PYTHON) tests/vllm/venv.py

test-vllm: system-deps  ## engine vllm on vLLM's CPU build with a tiny LightOnOCR model, real HTTP (no root)
	$(VLLM_RUN) -m pytest --durations=8 tests/vllm

test-lab: lab-deps venv  ## the nspawn lab's self-test (root)
	$(BIN)/pytest -m lab tests/lab

# The stages, in groups run one after another. A group's stages (joined by +) run side by side, each one's output
# printed whole as it ends: alone, each keeps less than a core busy (lint, test-vllm, test-web, test-lab); test-roles
# takes both cores; test-fleet leaves about a sixth of them idle, most of it while its hosts come up, which
# test-app (both cores for about 4 minutes) fills (tests/fleet/conftest.py runs the fleet's untimed tests first,
# and its timed tests once the stages beside it have ended).
# Each stage's duration is printed as it ends, each group's too, and all of them at the end, so the 45-minute
# budget stays visible.
TEST_GROUPS := lint+test-vllm+test-web+test-lab test-roles test-app+test-fleet

test: system-deps browser-deps lab-deps venv wheelhouse  ## everything, from nothing: lint, app, vllm, web, lab, roles, fleet
	@times="$$(mktemp)"; trap 'rm -f "$$times" "$$times.ended"' EXIT; total=$$(date +%s); \
	for group in $(TEST_GROUPS); do \
	  start=$$(date +%s); \
	  side=(); [[ "$$group" != *+* ]] || side=(-j4 --output-sync=target); \
	  OCRFLEET_BESIDE="$${group//+/ }" OCRFLEET_STAGES_ENDED="$$times.ended" \
	    $(MAKE) --no-print-directory "$${side[@]}" TEST_TIMES="$$times" $$(printf 'timed-%s ' $${group//+/ }); \
	  took=$$(( $$(date +%s) - start )); \
	  [[ "$$group" != *+* ]] || echo "$$group (side by side) $$took s" >> "$$times"; \
	  echo "=== [make test] $$group: $$took s (so far $$(( $$(date +%s) - total )) s)"; \
	done; \
	echo "=== [make test] stages:"; sed 's/^/    /' "$$times"; \
	echo "=== [make test] total: $$(( $$(date +%s) - total )) s (setup before the stages not counted)"

# One stage of make test, timed (TEST_TIMES: the file that collects the durations). Its name goes to
# $(TEST_TIMES).ended as it ends, passed or failed: test-fleet's timed tests wait for the stages beside it.
timed-%:
	@trap 'echo $* >> "$(TEST_TIMES).ended"' EXIT; start=$$(date +%s); $(MAKE) --no-print-directory $*; took=$$(( $$(date +%s) - start )); \
	echo "=== [make test] $*: $$took s"; echo "$* $$took s" >> "$(TEST_TIMES)"

test-fleet: lab-deps venv wheelhouse  ## make demo's fleet with 3 app hosts (3+1+1+1 lab hosts): site.yml from outside, an alert, crashes and rolling upgrades under load (root)
	$(BIN)/pytest -s --durations=30 -m lab tests/fleet

bench: system-deps venv  ## throughput and latency ratios, measured side by side; the development set's CER
	scripts/install-system-deps.sh bench
	$(BIN)/python -m bench.run

bench-vllm: system-deps  ## engine vllm in-process vs `vllm serve` (same install, model, client): ratio at c=1, 4
	$(VLLM_RUN) -m bench.vllm

# Mutation testing of the modules that guard the service, on a copy of the working tree; sessions and the report
# in build/mutate/. MODULE=auth (or several, space-separated) for some; MUTATE_BUDGET bounds the run (seconds);
# MUTATE_JOBS modules are mutated at once, each on its own copy.
MODULE ?=
MUTATE_BUDGET ?= 14400
MUTATE_JOBS ?= 2
mutate: system-deps venv  ## mutation testing (cosmic-ray) of the guard modules, MODULE=auth for one; not in make test
	nice -n 10 $(BIN)/python scripts/mutate.py --budget $(MUTATE_BUDGET) --jobs $(MUTATE_JOBS) $(MODULE)

# A Python with the app and its vllm extra: on a GPU host, a release's (/opt/ocr-app/current/bin/python).
GPU_PYTHON ?= $(BIN)/python
gpu-check:  ## on a GPU host only: gpu-metrics vs nvidia-smi, the app's NVML probe, CUDA device per instance
	$(GPU_PYTHON) scripts/gpu-check.py

clean:  ## remove the virtualenv and caches (the lab's image cache stays)
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .demo

wheelhouse: venv  ## the app and all its dependencies as wheels for the hosts (build/wheelhouse)
	scripts/build-wheelhouse.sh build/wheelhouse

test-roles: lab-deps venv wheelhouse  ## every role's Molecule scenario on nspawn hosts, two at a time (OCRFLEET_MOLECULE_JOBS) (root)
	PATH="$(abspath $(BIN)):$$PATH" lab/molecule/run.sh
