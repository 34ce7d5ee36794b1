# Flotilla: the two commands a new machine needs are `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
# e.g. DEMO_ARGS="--timeout 300" (flotilla demo --help); `make down` takes the same --state and --repo
DEMO_ARGS ?=
BIN    := $(VENV)/bin

.PHONY: demo down test unit e2e venv venv-demo deps cluster-up cluster-down crds bench clean

## demo: set everything up and run Flotilla on its embedded defaults (local cluster, fake GPU nodes, examples/,
## a short scenario), then keep it running until Ctrl-C. It installs only what the demo needs (no PyTorch).
demo: venv-demo
	scripts/install-system-deps.sh --demo
	$(BIN)/flotilla demo $(DEMO_ARGS)

## down: stop everything `make demo` started, the local cluster included
down:
	$(BIN)/flotilla demo --stop $(DEMO_ARGS)

## test: the whole test suite from nothing (unit, integration, e2e on a throw-away local cluster)
test:
	scripts/test.sh

## unit: unit and integration tests only (no cluster)
unit: venv
	$(BIN)/python -m pytest tests

## e2e: e2e tests against the cluster in KUBECONFIG
e2e: venv
	$(BIN)/python -m pytest e2e

venv: $(VENV)/.installed

venv-demo: $(VENV)/.installed-demo

# The demo's environment: Flotilla and its runtime dependencies only. `make test` adds the test extras
# (PyTorch among them) to the same .venv.
$(VENV)/.installed-demo: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

deps:
	scripts/install-system-deps.sh

cluster-up:
	e2e/cluster.sh up

cluster-down:
	e2e/cluster.sh down

## crds: regenerate crds/ (and the chart's copy) from src/flotilla/resources
crds: venv
	$(BIN)/flotilla crds --write crds
	$(BIN)/flotilla crds --write charts/flotilla/crds

clean:
	-e2e/cluster.sh down
	rm -rf $(VENV) .flotilla
