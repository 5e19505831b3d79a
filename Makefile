# The two commands of the README: `make demo` and `make test`.
# Both create .venv with this project's own files (pyproject.toml), so a fresh
# machine with Python 3.11 and make needs nothing else.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: demo test lint typecheck unit bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# installed marker files: re-install only when pyproject.toml changes
$(VENV)/.core: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.dev: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[dev]'
	touch $@ $(VENV)/.core

demo: $(VENV)/.core
	$(BIN)/dumbwaiter demo

lint: $(VENV)/.dev
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples

typecheck: $(VENV)/.dev
	$(BIN)/mypy

unit: $(VENV)/.dev
	$(BIN)/pytest

test: lint typecheck unit

bench: $(VENV)/.dev
	benchmarks/run.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
