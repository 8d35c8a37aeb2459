# Two entry points (see README): `make demo` and `make test`. Each creates .venv and installs Shale into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test bench clean

# setup.py compiles the cleaner's C loops (sidecar/log/_cleaner_kernel.c); a change to either reinstalls.
$(BIN)/.installed: pyproject.toml setup.py sidecar/log/_cleaner_kernel.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

demo: $(BIN)/.installed
	rm -rf demo-data
	$(BIN)/shale demo --workdir demo-data

# Debian's kcat (librdkafka 2.0.2) is the "old librdkafka" client of the protocol tests.
KCAT := $(shell command -v kcat 2>/dev/null)

test: $(BIN)/.installed
ifeq ($(KCAT),)
	apt-get install -y --no-install-recommends kcat >/dev/null || (apt-get update >/dev/null && apt-get install -y --no-install-recommends kcat >/dev/null)
endif
	$(BIN)/pytest -n 2 -q

bench: $(BIN)/.installed
	$(BIN)/python bench/log_engine.py
	$(BIN)/python bench/compaction.py
	$(BIN)/python bench/broker.py

clean:
	rm -rf $(VENV) demo-data .pytest_cache .hypothesis build sidecar/log/_cleaner_kernel.*.so
