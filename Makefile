# cachescale developer tasks. `make help` lists them.
# Everything runs from a local virtualenv that `make setup` creates, so a fresh clone
# needs only python3 (>= 3.11) with venv, and make.

VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
CRD    := crds/cachescalingpolicies.cachescale.dev.yaml

.DEFAULT_GOAL := help
.PHONY: help setup system-deps lint types imports unit test e2e generate demo clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-18s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

setup: $(STAMP) ## create .venv and install cachescale with its dev tools

lint: setup ## ruff lint and format check
	$(BIN)/ruff check operator tests e2e
	$(BIN)/ruff format --check operator tests e2e

types: setup ## mypy --strict on the package
	$(BIN)/mypy

imports: setup ## import-linter: the pure layers import no I/O
	$(BIN)/lint-imports

# The integration tests run a real Prometheus (Debian package `prometheus`, with promtool)
# and openssl. Installed here when missing and we are root; otherwise those tests skip
# with a hint (under CI=true they fail instead).
system-deps: ## install prometheus, promtool and openssl from Debian when missing (as root)
	@if command -v prometheus >/dev/null && command -v promtool >/dev/null \
	        && command -v openssl >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update && apt-get install -y --no-install-recommends prometheus openssl; \
	else echo "note: prometheus/promtool/openssl missing; integration tests will skip"; fi

unit: setup system-deps ## the pytest suite
	$(BIN)/pytest

test: lint types imports unit ## everything CI runs: lint, types, import contracts, tests

e2e: setup ## end-to-end tests against the cluster in KUBECONFIG (skip without one)
	$(BIN)/pytest e2e

generate: setup ## regenerate the CRD from the API models
	$(BIN)/cachescale crd > $(CRD)

demo: setup ## set up and run the main job: the simulator on its default (the incident)
	$(BIN)/cachescale simulate

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
