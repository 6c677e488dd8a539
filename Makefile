# kubesweep — developer and CI entry points. `make demo` and `make test` work on a fresh machine.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS ?= job,tracking,export,k8s,tune,dev
UV := $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)
# Found by path, not by PATH (a fresh login shell lacks ~/.local/bin): exported to every recipe, where the image
# build's wheel step and the tests use it (kubesweep.images.build.find_uv also looks in ~/.local/bin itself).
export UV
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: help setup demo test lint typecheck unit system-deps cluster-tools cluster-up cluster-down test-cluster \
	crd images bench-plan mutation clean
SYSTEM_TOOLS := chromium buildah skopeo docker-registry mmdebstrap runc iptables conntrack openssl ip ipset
# Debian packages for those commands, plus the CNI plugins of the test cluster's real node (/usr/lib/cni)
SYSTEM_PACKAGES := chromium buildah skopeo docker-registry mmdebstrap runc iptables conntrack openssl iproute2 \
	containernetworking-plugins ipset
# `make test` runs on PYTEST_WORKERS pytest-xdist workers where the machine has two cores or more (each shared
# component stays on one worker: tests/conftest.py); `make test PYTEST_XDIST=` runs it in one process. Three on two
# cores: much of the suite waits (for a scheduler, a kubelet, a CPU-limited pod, a server), and a third worker runs
# in those waits.
PYTEST_WORKERS ?= 3
PYTEST_XDIST ?= $(if $(filter 0 1,$(shell nproc 2>/dev/null || echo 1)),,-n $(PYTEST_WORKERS) --dist loadgroup)

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

$(UV):
	python3 -m pip install --quiet --user --disable-pip-version-check "uv>=0.5"

# Bytecode is compiled once, at install: uv writes none, and where PYTHONDONTWRITEBYTECODE is set (as it is in many
# container images) no process writes what it compiles, so each one that imports torch, transformers or mlflow
# would compile them again (about 10 s of CPU each on a 2-core machine). compileall writes regardless. A few
# packages ship files that are not Python 3.11 (a test of torch's in 3.12 syntax); compileall says nothing of them
# (-qq) and goes on. The packages' own tests are left out (-x); Python compiles anything left when it imports it.
$(STAMP): pyproject.toml | $(UV)
	test -x $(PY) || $(UV) venv --quiet --python python3.11 $(VENV)
	$(UV) pip install --quiet --python $(PY) -e ".[$(EXTRAS)]"
	$(PY) -m compileall -qq -j 0 -x '/site-packages/.*/(tests?|testing)/' \
	  "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" kubesweep tests bench || true
	rm -f $(VENV)/.installed-* && touch $(STAMP)

setup: $(STAMP)  ## create .venv with kubesweep and every extra (uv; wheels cached in ~/.cache/uv)

demo: setup  ## run the CPU smoke sweep on the local backend and print its results
	$(VENV)/bin/sweep submit sweeps/smoke.yaml --backend local

system-deps:  ## Debian packages the tests use: chromium (browser), buildah/skopeo/registry (images), runc/CNI/ipset (real node)
	@missing=; for t in $(SYSTEM_TOOLS); do command -v $$t >/dev/null || missing="$$missing $$t"; done; \
	test -x /usr/lib/cni/bridge || missing="$$missing cni-plugins"; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_PACKAGES) >/dev/null; fi

cluster-tools:  ## build the test control plane and real node from Go modules (cached in ~/.cache/kubesweep-test)
	bash tests/cluster/build-tools.sh

cluster-up: cluster-tools system-deps  ## start the test Kubernetes cluster (kwok GPU nodes, one real node)
	tests/cluster/up --real-node

cluster-down:  ## delete the test cluster
	tests/cluster/down

test-cluster: setup system-deps cluster-tools  ## only the tests against the real control plane (marker cluster)
	$(PY) -m pytest tests -m cluster -q $(PYTEST_ARGS)

crd: setup  ## regenerate the checked-in Sweep CRD from the spec model
	$(PY) -m kubesweep.crd > manifests/crd/kubesweep.io.yaml
	cp manifests/crd/kubesweep.io.yaml charts/kubesweep/crds/

images: setup  ## build, push and lock the job and operator images: make images REGISTRY=registry.example/team
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" images/build.sh $(IMAGES_ARGS)

lint: setup  ## ruff
	$(VENV)/bin/ruff check kubesweep tests bench

# mypy's cache lives beside the other build caches, so a fresh clone checks only what changed (a file whose path or
# time differs is matched by its hash): about 100 s of CPU a fresh clone, 3 s warm.
MYPY_CACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/kubesweep/mypy
export MYPY_CACHE_DIR

typecheck: setup  ## mypy (strict; cache in ~/.cache/kubesweep/mypy)
	$(VENV)/bin/mypy

# Tests choose their environment by marker (pyproject.toml), not by directory: tests/ mirrors the package.
FAST_MARKERS := not cluster and not realnode and not images and not browser and not gpu and not slow

unit: setup  ## fast tests only: no cluster, images, browser or GPU, nothing marked slow
	$(PY) -m pytest tests -m "$(FAST_MARKERS)" -q $(PYTEST_ARGS)

# On a fresh machine, building takes most of the first `make test`: the test cluster's binaries from Go modules and
# the images (a multi-GB PyTorch stand-in base). When the binaries are not cached, their build starts first, in the
# background (log: $(TOOLS_LOG)), before anything else: it is the longest step, and it needs only go, gcc and
# python3, so the virtualenv, the Debian packages, lint, types and the images (tests/images/prepare.py) are made
# while it runs. The tests start once both builds are done, so no test waits on a build. A warm run finds the
# binaries and goes straight on.
TOOLS_LOG := build/build-tools.log
# `make test` prints when each of its steps ended, counted from its start (the build's log has its own steps).
STEP = echo "make test: $(1) at $$(( $$(date +%s) - t_start ))s"

test:  ## everything CI runs: lint, types, all tests (a fresh machine first builds the cluster and images)
	@set -u; tools=; rc=0; t_start=$$(date +%s); \
	if ! bash tests/cluster/build-tools.sh --check; then \
	  mkdir -p "$$(dirname "$(TOOLS_LOG)")"; \
	  echo "building the test cluster's binaries in the background (log: $(TOOLS_LOG)); the rest meanwhile"; \
	  setsid bash tests/cluster/build-tools.sh >"$(TOOLS_LOG)" 2>&1 </dev/null & tools=$$!; \
	  trap 'kill -- -'"$$tools"' 2>/dev/null' INT TERM; \
	fi; \
	$(MAKE) --no-print-directory setup system-deps || rc=$$?; \
	[ $$rc = 0 ] && { $(call STEP,set-up done); $(MAKE) --no-print-directory lint typecheck || rc=$$?; }; \
	[ $$rc = 0 ] && $(call STEP,lint and types done); \
	if [ -n "$$tools" ]; then \
	  if [ $$rc = 0 ]; then $(PY) -m tests.images.prepare || echo "images: the image tests will build them"; \
	    $(call STEP,images done); \
	  else kill -- -$$tools 2>/dev/null; fi; \
	  t0=$$(date +%s); wait $$tools; brc=$$?; \
	  if [ $$brc != 0 ] && [ $$rc = 0 ]; then \
	    tail -n 40 "$(TOOLS_LOG)"; echo "building the test cluster's binaries failed (exit $$brc)"; exit 1; fi; \
	  [ $$rc = 0 ] || exit $$rc; \
	  echo "cluster binaries: $$(tail -n 2 "$(TOOLS_LOG)" | head -n 1 | sed 's/^\[build-tools [0-9:]*\] //')" \
	       "(waited $$(( $$(date +%s) - t0 ))s for them)"; \
	fi; \
	[ $$rc = 0 ] || exit $$rc; \
	$(call STEP,tests start); \
	echo "$(PY) -m pytest -q $(PYTEST_XDIST) $(PYTEST_ARGS)"; \
	$(PY) -m pytest -q $(PYTEST_XDIST) $(PYTEST_ARGS) || rc=$$?; \
	$(call STEP,tests done); \
	exit $$rc

# Not part of `make test`: on demand (one core; bench/results/mutation.md says how long). MUTATION_ARGS: modules to mutate, --pending, --report, --children N.
mutation: setup  ## mutation score of the pure core under its fast tests (mutmut; bench/results/mutation.md)
	$(PY) bench/mutation.py $(MUTATION_ARGS)

bench-plan: setup  ## planner speed (10,000 trials)
	$(PY) bench/plan_scale.py

clean:  ## remove the virtualenv and caches in the tree
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
