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
# Spark (the PySpark data source's tests, tests/pipeline) runs on a Java 17+ runtime.
JAVA := $(shell command -v java 2>/dev/null)

# promtool (tests/k8s/test_alerts.py runs the chart's alerts through it): taken out of Debian's prometheus
# package into the venv, so that no Prometheus server gets installed or started.
PROMTOOL := $(shell command -v promtool 2>/dev/null || echo $(BIN)/promtool)

$(BIN)/promtool: | $(BIN)/.installed
	rm -rf $(VENV)/prometheus-deb && mkdir -p $(VENV)/prometheus-deb
	cd $(VENV)/prometheus-deb && (apt-get download prometheus >/dev/null 2>&1 || (apt-get update >/dev/null && apt-get download prometheus >/dev/null))
	dpkg-deb -x $(VENV)/prometheus-deb/prometheus_*.deb $(VENV)/prometheus-deb/root
	cp $(VENV)/prometheus-deb/root/usr/bin/promtool $@
	rm -rf $(VENV)/prometheus-deb

test: $(BIN)/.installed $(PROMTOOL)
ifeq ($(KCAT),)
	apt-get install -y --no-install-recommends kcat >/dev/null || (apt-get update >/dev/null && apt-get install -y --no-install-recommends kcat >/dev/null)
endif
ifeq ($(JAVA),)
	apt-get install -y --no-install-recommends openjdk-17-jre-headless >/dev/null || (apt-get update >/dev/null && apt-get install -y --no-install-recommends openjdk-17-jre-headless >/dev/null)
endif
	$(BIN)/pytest -n 2 -q

bench: $(BIN)/.installed
	$(BIN)/python bench/log_engine.py
	$(BIN)/python bench/compaction.py
	$(BIN)/python bench/broker.py
	$(BIN)/python bench/spark_read.py
	$(BIN)/python bench/state_backup.py --profile --also-dirty-ratio 0.9

clean:
	rm -rf $(VENV) demo-data .pytest_cache .hypothesis build sidecar/log/_cleaner_kernel.*.so
