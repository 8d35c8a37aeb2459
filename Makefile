# Two entry points (see README): `make demo` and `make test`. Each creates .venv and installs Shale into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

demo: $(BIN)/.installed
	rm -rf demo-data
	$(BIN)/shale demo --data-dir demo-data

test: $(BIN)/.installed
	$(BIN)/pytest -n 2 -q

bench: $(BIN)/.installed
	$(BIN)/python bench/log_engine.py

clean:
	rm -rf $(VENV) demo-data .pytest_cache .hypothesis
