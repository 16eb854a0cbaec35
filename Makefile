# The README's two commands: `make demo` runs the product, `make test` passes the tests.
# Both set up everything on a fresh machine with Python 3.10+ (and, later, Node 20+).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint typecheck contracts pytest scenarios bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml scripts/ensure-system-deps.sh | $(BIN)/python
	bash scripts/ensure-system-deps.sh
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/jupyter-gpuaas simulate hub_config/examples/two-teams.yaml

lint: $(STAMP)
	$(BIN)/ruff check jupyter_gpuaas tests benchmarks
	$(BIN)/ruff format --check jupyter_gpuaas tests benchmarks

contracts: $(STAMP)
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy jupyter_gpuaas/admission

pytest: $(STAMP)
	$(BIN)/python -m pytest -q

test: lint contracts typecheck pytest

scenarios: $(STAMP)
	$(BIN)/python ../shared/tools/scenario_check.py "$(BIN)/jupyter-gpuaas" tests/scenarios/*.yaml

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
