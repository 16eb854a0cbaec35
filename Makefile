# The README's two commands: `make demo` runs the product, `make test` passes the tests.
# Both set up everything on a fresh machine with Python 3.10+ and Node 20+: the venv, the
# system packages (PostgreSQL, Chromium: scripts/ensure-system-deps.sh) and JupyterHub's
# proxy, configurable-http-proxy, from npm into node_modules/ (package.json).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NODE_STAMP := node_modules/.installed
CHP := node_modules/.bin/configurable-http-proxy

.PHONY: setup node-deps labextension core demo test lint typecheck contracts docs lowest pytest uitest scenarios bench clean \
	cluster-bin cluster-up cluster-down

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml scripts/ensure-system-deps.sh | $(BIN)/python
	bash scripts/ensure-system-deps.sh
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

# `npm ci` when the lock file is there (reproducible), else `npm install` (writes it).
$(NODE_STAMP): package.json $(wildcard package-lock.json)
	@command -v npm >/dev/null 2>&1 || { echo "make: npm not found: install Node 20+" >&2; exit 1; }
	if [ -f package-lock.json ]; then npm ci --no-audit --no-fund --loglevel=error; \
	else npm install --no-audit --no-fund --loglevel=error; fi
	test -x $(CHP)
	touch $(NODE_STAMP)

node-deps: $(NODE_STAMP)

# The JupyterLab sidebar (labextension/), built with jlpm (JupyterLab's yarn, in the venv)
# from labextension/yarn.lock into jupyter_gpuaas/labextension/, and linked into the venv's
# share/jupyter/labextensions so the editable install serves the fresh build. Rebuilt only
# when its sources change. (A wheel build runs the same through hatch-jupyter-builder.)
LABEXT_STAMP := labextension/node_modules/.built
LABEXT_SRC := $(wildcard labextension/src/*.ts labextension/src/components/*.ts labextension/style/*) \
	labextension/package.json labextension/yarn.lock labextension/tsconfig.json
$(LABEXT_STAMP): $(LABEXT_SRC) | $(STAMP)
	cd labextension && PATH="$(CURDIR)/$(BIN):$$PATH" jlpm install --immutable
	cd labextension && PATH="$(CURDIR)/$(BIN):$$PATH" jlpm build:prod
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/jupyter labextension develop --overwrite . >/dev/null
	touch $(LABEXT_STAMP)

labextension: $(LABEXT_STAMP)

setup: $(STAMP) $(NODE_STAMP) $(LABEXT_STAMP)

# The admission core compiled with mypyc, in place (scripts/build_core.py). Phony: the
# script itself compares every compiled module with jupyter_gpuaas/admission/*.py and does
# nothing when they are current (a stamp here would lie after `build_core.py --clean`,
# GPUAAS_PURE=1 or a rebuild by tests/conftest.py). Without a C compiler, with
# GPUAAS_PURE=1 or when mypyc fails, the core runs as pure Python and this still succeeds.
# A compile takes a minute or two: the script says so when it starts, then prints a
# progress line every 15 s (mypy/mypyc, then the C compiler, step by step).
core: $(STAMP)
	$(BIN)/python scripts/build_core.py

# The local demo hub on http://127.0.0.1:8000 (override: make demo DEMO_ARGS="--port 9000").
DEMO_ARGS ?=
demo: setup core
	$(BIN)/jupyter-gpuaas demo $(DEMO_ARGS)

# The documentation site (Sphinx, MyST, the pydata theme) into build/docs/html, warnings as
# errors; its reference pages are written from the code first (docs/_ext/gpuaas_reference.py).
# Incremental: a second build reads only what changed (and the generated pages, which are
# rewritten only when the code changes them).
DOCS_OUT := build/docs
docs: $(STAMP)
	$(BIN)/python -m sphinx -W --keep-going -q -b html -d $(DOCS_OUT)/doctrees docs $(DOCS_OUT)/html

# The oldest versions the pins allow (issue 44): a second venv with the lowest version of
# every direct dependency (`uv pip install --resolution lowest-direct`; uv comes with the
# test extra), the package installed editable into it, and a smoke subset run against it:
# a gateway (its REST API), Hub spawns through the queue, a GPU kernel through the
# provisioner, and the kubernetes extra (every kubernetes_asyncio name our code calls, the
# KubeSpawner and provisioner subclasses, the pure pod and manifest builders; no cluster),
# and the sidebar. The editable install builds it (hatch-jupyter-builder's `build:prod`,
# with labextension/'s lockfile) into the venv's share/jupyter/labextensions, where the
# oldest JupyterLab the pins allow must list it enabled and compatible and show its GPUs
# panel behind the Hub in Chromium (Playwright, a test tool, comes at its newest); and
# scripts/lowest_sidebar_types.py type-checks its sources against that JupyterLab's own
# packages (from npm), the floor of the ranges in labextension/package.json.
# A failure here means a pin in pyproject.toml (or a range in labextension/package.json)
# must move up. Run once per change of pyproject.toml or of the sidebar's build (the
# stamp), since the install costs minutes; `make lowest` after `rm .venv-lowest/.passed`
# runs it again.
LOWEST := .venv-lowest
LOWEST_STAMP := $(LOWEST)/.passed
LOWEST_SMOKE := tests/gateway/test_api.py \
	tests/hub/test_hub_spawn.py::test_free_gpu_spawn_sees_exactly_its_devices \
	tests/hub/test_hub_spawn.py::test_second_spawn_queues_then_starts_when_the_first_stops \
	tests/server/test_gpu_kernels.py::test_second_kernel_waits_for_the_gpu_then_starts_on_it \
	tests/test_kubernetes_extra.py tests/kubernetes/test_pods.py \
	tests/ui/test_sidebar_installed.py tests/ui/test_lab_in_hub.py
$(LOWEST_STAMP): pyproject.toml $(LABEXT_STAMP) | setup core
	rm -rf $(LOWEST)
	$(BIN)/uv venv -q --python $(BIN)/python $(LOWEST)
	$(BIN)/uv pip install -q --python $(LOWEST)/bin/python --resolution lowest-direct \
		-e ".[postgres,kubernetes]" "pytest>=8.0" "pytest-asyncio>=0.23" "pytest-timeout>=2.3" \
		"pytest-jupyter[server]>=0.9"
	$(BIN)/uv pip install -q --python $(LOWEST)/bin/python "playwright>=1.40"
	@echo "lowest: $$($(BIN)/uv pip list --python $(LOWEST)/bin/python 2>/dev/null \
		| grep -E '^(jupyterhub|jupyter-server|jupyterlab|jupyter-client|tornado|traitlets|kubernetes-asyncio|jupyterhub-kubespawner|gateway-provisioners) ' | tr -s ' ' | paste -sd,)"
	$(LOWEST)/bin/python scripts/lowest_sidebar_types.py $(LOWEST)/sidebar-types
	PATH="$(CURDIR)/$(LOWEST)/bin:$$PATH" $(LOWEST)/bin/python -m pytest -q -p no:cacheprovider \
		$(LOWEST_SMOKE)
	touch $@

lowest: $(LOWEST_STAMP)

lint: $(STAMP)
	$(BIN)/ruff check jupyter_gpuaas tests benchmarks scripts
	$(BIN)/ruff format --check jupyter_gpuaas tests benchmarks scripts

contracts: $(STAMP)
	$(BIN)/lint-imports

# The whole package under mypy --strict ([tool.mypy] in pyproject.toml). It matters twice
# for the modules scripts/build_core.py compiles: mypyc builds only what mypy accepts, so a
# type error there would otherwise show up only as a silent fall-back to pure Python.
typecheck: $(STAMP)
	$(BIN)/mypy jupyter_gpuaas

# The real Kubernetes control plane of tests/kubernetes (scripts/cluster.py): its binaries
# built from the Go modules pinned in cluster/*/go.mod into ~/.cache/jupyter-gpuaas/cluster/
# (keyed by those pins: nothing is built twice), and a cluster on loopback for people,
# through kwokctl's binary runtime: .cluster/kubeconfig, .cluster/bin/ (kubectl beside the
# others), every component's log under .cluster/kwok/clusters/gpuaas/logs/.
CLUSTER_DIR ?= .cluster
cluster-bin: $(STAMP)
	$(BIN)/python scripts/cluster.py bin

cluster-up: cluster-bin
	$(BIN)/python scripts/cluster.py up --dir $(CLUSTER_DIR)

cluster-down: $(STAMP)
	$(BIN)/python scripts/cluster.py down --dir $(CLUSTER_DIR)

# The suite runs in PYTEST_WORKERS pytest-xdist workers at once (most of its time is spent
# waiting on processes, a control plane, events, not on the CPU, so 3 help even on 2 cores).
# `--dist loadfile` with the work units of tests/conftest.py (work_unit_of): a test file stays
# in one worker (its module fixtures start once), tests/kubernetes as a whole too (one
# control plane per session); each worker has its own tmp dirs, PostgreSQL and Hub.
# tests/kubernetes then runs on its own, one test at a time, once the rest has ended: its
# control plane (API server, etcd, controllers, Kueue, KWOK) shares the 2 cores, and beside
# two other workers its 60 s waits for Kueue's chain (Job, Workload, admission, pod) ran out
# in two fresh-clone runs out of two; alone it never did. Both parts always run; the target
# fails if either fails.
# `make pytest PYTEST_WORKERS=0` runs the rest in this process, one test at a time; one file
# alone: `.venv/bin/python -m pytest tests/test_ledger.py` (no -n: serial, as ever).
PYTEST_WORKERS ?= 3
pytest: setup core cluster-bin
	$(BIN)/python -m pytest -q --durations=25 -n $(PYTEST_WORKERS) --dist loadfile \
		--ignore=tests/kubernetes; rest=$$?; \
	$(BIN)/python -m pytest -q --durations=10 -p no:xdist tests/kubernetes; kube=$$?; \
	exit $$(( rest || kube ))

# The checks (lint, contracts, typecheck, docs) side by side with `lowest` in one `make -j`
# (--output-sync: each step's output is printed whole when it ends; make fails when any
# step fails, after the others end); they only read the sources. Then pytest, then the
# sidebar's tests, one after the other: `lowest`'s editable install rebuilds the sidebar in
# place (labextension/lib, jupyter_gpuaas/labextension), which their browsers and the
# packaging test read, and Galata's 20 s waits in the page ran out once beside pytest's
# three workers (a fresh-clone run), never alone.
test: setup core cluster-bin
	@echo "make test: $$(date -u +%T) UTC: lint, contracts, typecheck, docs beside lowest"
	$(MAKE) --no-print-directory -j --output-sync=target lint contracts typecheck docs lowest
	@echo "make test: $$(date -u +%T) UTC: pytest"
	$(MAKE) --no-print-directory pytest
	@echo "make test: $$(date -u +%T) UTC: uitest"
	$(MAKE) --no-print-directory uitest
	@echo "make test: $$(date -u +%T) UTC: passed"

# The sidebar's tests: Jest on its model, then Galata (Playwright on Debian's Chromium)
# against a real jupyter server and a real standalone gateway (tests/ui/run_galata.py).
uitest: setup core
	cd labextension && PATH="$(CURDIR)/$(BIN):$$PATH" jlpm test
	$(BIN)/python tests/ui/run_galata.py

scenarios: $(STAMP) core
	$(BIN)/python ../shared/tools/scenario_check.py "$(BIN)/jupyter-gpuaas" tests/scenarios/*.yaml

bench: $(STAMP) core
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf labextension/node_modules labextension/lib jupyter_gpuaas/labextension
	rm -rf $(VENV) $(LOWEST) node_modules .mypy_cache .ruff_cache .pytest_cache build/mypyc build/docs
	rm -f jupyter_gpuaas/admission/*.so jupyter_gpuaas/admission/*.pyd
