# Commands for a fresh machine:
#   make run    installs everything into .venv and runs the main job on the default model
#   make test   installs everything into .venv and runs the test suite
#   make lint   ruff and mypy, as CI runs them before the tests (pyproject.toml: [tool.ruff], [tool.mypy])
# TORCH picks the PyTorch build; override it for a CUDA machine, e.g. make run TORCH=torch==2.11.0
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/kerneltriage triage

# two pytest processes (pytest-xdist), each test file whole in one of them so that a file's fixtures load once: on the
# 2-core machine 7 min 32 s against 10 min 43 s in one process (docs/journal.md, seventh session)
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV)
