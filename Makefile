# The two commands of the README: `make demo` and `make test`.
# Both create .venv with this project's own files (pyproject.toml), so a fresh
# machine with Python 3.11 and make needs nothing else.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: demo test lint typecheck unit bench clean chromium

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# installed marker files: re-install only when pyproject.toml changes
$(VENV)/.core: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e .
	touch $@

# the demo sends its mail and webhooks with dumbwaiter.mail and dumbwaiter.webhooks
$(VENV)/.demo: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[mail,webhooks]'
	touch $@ $(VENV)/.core

$(VENV)/.dev: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[dev]'
	touch $@ $(VENV)/.core $(VENV)/.demo

# the dashboard's browser tests drive Debian's Chromium (never a browser of
# Playwright's own); install it where it is missing and apt-get can
chromium:
	@test -x /usr/bin/chromium || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] \
	  && (apt-get update -qq && apt-get install -y -qq chromium) \
	  || echo "chromium missing: the browser tests will skip (they fail in CI)"; }

demo: $(VENV)/.demo
	$(BIN)/dumbwaiter demo

lint: $(VENV)/.dev
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples

typecheck: $(VENV)/.dev
	$(BIN)/mypy

# The suite mostly waits on servers: PYTEST_WORKERS pytest processes
# (pytest-xdist) run it side by side, the heavy tests on one of them, one
# after another (tests/conftest.py, SERIAL).  PYTEST_WORKERS=0 runs it in
# this process, as a plain `pytest` does.
PYTEST_WORKERS ?= 3

unit: $(VENV)/.dev chromium
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadgroup

test: lint typecheck unit

bench: $(VENV)/.dev
	benchmarks/run.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
