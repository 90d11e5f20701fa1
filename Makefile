# Two commands on a fresh machine: `make run` (the main job) and `make test` (the tests).
# Each bootstraps .venv, installs the project and builds the region catalog when missing.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: run test test-slow test-all lint catalog install clean-catalog

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

catalog: $(STAMP)
	$(BIN)/optw catalog build --if-missing

run: catalog
	$(BIN)/optw catalog list

test: catalog
	$(BIN)/python -m pytest

test-slow: catalog
	$(BIN)/python -m pytest -m slow

test-all: catalog
	$(BIN)/python -m pytest -m "slow or not slow"

lint: $(STAMP)
	$(BIN)/ruff check platform tests jobs benchmarks

clean-catalog:
	rm -f region_catalog/*.parquet region_catalog/manifest.json
