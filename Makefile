# kubesweep — developer and CI entry points. `make demo` and `make test` work on a fresh machine.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS ?= job,tracking,export,k8s,tune,dev
UV := $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: help setup demo test lint typecheck unit bench-plan cluster-tools cluster-up cluster-down clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

$(UV):
	python3 -m pip install --quiet --user --disable-pip-version-check "uv>=0.5"

$(STAMP): pyproject.toml | $(UV)
	test -x $(PY) || $(UV) venv --quiet --python python3.11 $(VENV)
	$(UV) pip install --quiet --python $(PY) -e ".[$(EXTRAS)]"
	rm -f $(VENV)/.installed-* && touch $(STAMP)

setup: $(STAMP)  ## create .venv with kubesweep and every extra (uv; wheels cached in ~/.cache/uv)

demo: setup  ## run the CPU smoke sweep on the local backend and print its results
	$(VENV)/bin/sweep submit sweeps/smoke.yaml --backend local

lint: setup  ## ruff
	$(VENV)/bin/ruff check kubesweep tests bench

typecheck: setup  ## mypy (strict)
	$(VENV)/bin/mypy

unit: setup  ## fast tests only (no cluster, no training)
	$(PY) -m pytest tests/unit tests/backends -q $(PYTEST_ARGS)

test: setup lint typecheck  ## everything CI runs: lint, types, all tests
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench-plan: setup  ## planner speed (10,000 trials)
	$(PY) bench/plan_scale.py

clean:  ## remove the virtualenv and caches in the tree
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
