# eddyline — every entry point a developer or CI needs. `make help` lists them.
# The first target that needs Python creates .venv and installs eddyline into it;
# re-running is instant until pyproject.toml changes.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed
# quixstreams is the benchmark's yardstick only; it pins pydantic < 2.14, so it
# lives in its own environment and never constrains the project's pins.
QUIXSTREAMS := quixstreams==3.28.1
# bytewax is bench-runtime's yardstick, in an environment of its own for the same reason.
BYTEWAX_VENV := .venv-bytewax
BYTEWAX_STAMP := $(BYTEWAX_VENV)/.installed
BYTEWAX := bytewax==0.21.1
STATE_DIR ?= $(CURDIR)/.eddyline-state

.DEFAULT_GOAL := help
.PHONY: help setup run demo-store graphviz topology-pictures test test-fast test-realnode soak-e2e kafka kafka-jars spark-kafka-jars lint crds bench-store bench-runtime bench-relocation bench-failover bench-log bench-operator bench-restore bench-kafka bench-joins bench-windows bench-backfill clean

help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# helm-sdkpy (Helm's Go library: chart lint and render) declares Python >= 3.12 but
# runs on 3.11, hence --ignore-requires-python.
$(STAMP): pyproject.toml
	@scripts/check-prerequisites
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,operator,spark]'
	$(BIN)/python -m pip install --quiet --ignore-requires-python 'helm-sdkpy==0.1.32'
	@touch $(STAMP)

setup: $(STAMP) ## Create .venv and install eddyline with its development tools

run: $(STAMP) ## The main job: word count on the embedded log (generate, process exactly once, verify, report)
	$(BIN)/eddyline demo wordcount --state-dir $(STATE_DIR)/wordcount-demo

demo-store: $(STAMP) ## The store engine on its own: write, crash, reopen, query at both isolation levels
	$(BIN)/eddyline demo store --state-dir $(STATE_DIR)/demo

test: $(STAMP) kafka-jars spark-kafka-jars control-plane test-images node-components graphviz prometheus ## Run every test, slow ones included (what CI runs)
	@scripts/check-prerequisites --java
	$(BIN)/pytest

test-fast: $(STAMP) ## Run the tests not marked slow
	$(BIN)/pytest -m "not slow"

# SOAK_ARGS: e.g. "--rounds 1" or "--modules scale_in --no-hog" (tests/soak/soak_e2e.py --help).
soak-e2e: $(STAMP) kafka-jars control-plane ## The scale-in, quickstart, autoscale and upgrade e2e modules 10 rounds in a row beside a CPU hog; passes and failures per module (hours; SOAK_ARGS="--rounds 1")
	$(BIN)/python -m tests.soak.soak_e2e $(SOAK_ARGS)

test-realnode: $(STAMP) control-plane node-components ## Run only the real-node tier: pods on real kubelets and containerd (root; docs/nodes.md)
	$(BIN)/pytest -m realnode

kafka-jars: ## Fetch the pinned Apache Kafka release (tools/kafka/pom.xml) into .cache/kafka, once
	@scripts/kafka-jars >/dev/null

spark-kafka-jars: $(STAMP) ## Fetch Spark's Kafka source at the installed PySpark's version (tools/spark-kafka/pom.xml) into .cache/spark-kafka, once
	@scripts/spark-kafka-jars $(BIN)/python >/dev/null

kafka: $(STAMP) kafka-jars ## Start one Kafka broker (KRaft) for trying eddyline by hand; prints its bootstrap address
	$(BIN)/python -m tests.support.kafka $(STATE_DIR)/kafka

graphviz: ## Install Graphviz's dot (Debian package graphviz; root), which `eddyline describe --format svg` draws with
	@scripts/apt-ensure graphviz

topology-pictures: $(STAMP) graphviz ## Redraw the topology pictures the docs show (docs/images/*-topology.svg)
	$(BIN)/eddyline describe examples/page_views/streamapp.yaml --format svg > docs/images/page-views-topology.svg

crds: $(STAMP) ## Generate the StreamApp CRD from the pydantic model into crds/ and the chart
	$(BIN)/python -m eddyline_operator.crd --root .

lint: $(STAMP) ## ruff, mypy --strict on src, and the import contracts
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

$(BENCH_STAMP): pyproject.toml
	@scripts/check-prerequisites
	@test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install --quiet -e . '$(QUIXSTREAMS)'
	@touch $(BENCH_STAMP)

bench-store: $(BENCH_STAMP) ## Store benchmark: eddyline vs raw rocksdict vs Quix Streams (last line JSON)
	$(BENCH_VENV)/bin/python tests/bench/bench_store.py

$(BYTEWAX_STAMP):
	@scripts/check-prerequisites
	@test -x $(BYTEWAX_VENV)/bin/python || $(PYTHON) -m venv $(BYTEWAX_VENV)
	$(BYTEWAX_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BYTEWAX_VENV)/bin/python -m pip install --quiet '$(BYTEWAX)'
	@touch $(BYTEWAX_STAMP)

bench-runtime: $(STAMP) $(BYTEWAX_STAMP) ## Runtime benchmark: word count EOS vs ALOS vs bytewax, restart after SIGKILL, restore rate (last line JSON)
	$(BIN)/python -m tests.bench.bench_runtime

bench-windows: $(STAMP) $(BYTEWAX_STAMP) $(BENCH_STAMP) kafka-jars ## Windows benchmark: 1-min tumbling (emit_final) and 30-min session counts, eddyline EOS vs bytewax with recovery; tumbling on Kafka vs Quix Streams EOS; results checked equal (last line JSON; BENCH_WINDOWS_ARGS="--events N --skip bytewax")
	$(BIN)/python -m tests.bench.bench_windows $(BENCH_WINDOWS_ARGS)

bench-relocation: $(STAMP) ## KIP-816: relocate 10,000 task directories after every ordinal shifted (last line JSON)
	$(BIN)/python tests/bench/bench_relocation.py

bench-failover: $(STAMP) ## Failover benchmark: SIGKILL an active replica; stale answer, promotion, records replayed (last line JSON)
	$(BIN)/python -m tests.bench.bench_failover

bench-operator: $(STAMP) kafka-jars control-plane ## Operator benchmark on the real control plane: apply -> children/Ready, pod killed -> stale answer/processing, topology upgrade vs reset-and-rebuild; the pod kill again on a kafka:// log (last line JSON)
	@mkdir -p $(STATE_DIR)
	$(BIN)/python -m tests.bench.bench_operator | tee $(STATE_DIR)/bench-operator.out
	$(BIN)/python -m tests.bench.bench_operator_kafka --merge $(STATE_DIR)/bench-operator.out

bench-log: $(STAMP) kafka-jars ## Log benchmark: produce/fetch rates, transaction commit latency; SQLite and Kafka (the project's broker, or EDDYLINE_TEST_KAFKA_BOOTSTRAP's) (last line JSON)
	$(BIN)/python -m tests.bench.bench_log

bench-backfill: $(STAMP) ## Backfill benchmark (first slice): a windowed count's store by the PySpark backfill vs a replay through the engine, results checked equal (last line JSON; BENCH_BACKFILL_ARGS="--records N --partitions P")
	$(BIN)/python -m tests.bench.bench_backfill $(BENCH_BACKFILL_ARGS)

bench-restore: $(STAMP) ## Restore benchmark: serial replay vs Spark build + SST ingest, 2M records, then restore Jobs with 1 and 2 executor pods on the real nodes (root; last line JSON)
	$(BIN)/python tests/bench/bench_restore.py

KSTREAMS_CLASSES := .cache/kstreams-bench
# BENCH_KAFKA_ARGS: e.g. "--words 200000 --keys 200000" for a quicker run than the issue's 1M.
bench-kafka: $(STAMP) kafka-jars ## Kafka benchmark: word count in eddyline vs Kafka Streams on one broker, EOS words/s, CPU, SIGKILL -> first output (last line JSON)
	@mkdir -p $(KSTREAMS_CLASSES)
	javac -d $(KSTREAMS_CLASSES) -cp "$$(scripts/kafka-jars)/*" tests/bench/kstreams/WordCount.java
	$(BIN)/python -m tests.bench.bench_kafka --classes $(KSTREAMS_CLASSES) $(BENCH_KAFKA_ARGS)

bench-joins: $(STAMP) kafka-jars ## Joins benchmark: a foreign-key join in eddyline vs Kafka Streams on one broker, EOS joined records/s, CPU (last line JSON)
	@mkdir -p $(KSTREAMS_CLASSES)
	javac -d $(KSTREAMS_CLASSES) -cp "$$(scripts/kafka-jars)/*" tests/bench/kstreams/FkJoin.java
	$(BIN)/python -m tests.bench.bench_joins --classes $(KSTREAMS_CLASSES) $(BENCH_JOINS_ARGS)

# Images: built by the project's own container engine (scripts/container-engine: Debian's
# docker.io, installed and started on first use, as root), tagged under the names the chart
# and the examples' manifests use; docs/containers.md. IMAGE_BASES=standin builds on the
# test-only stand-ins for python:3.11-slim and the Maven stage (scripts/base-images), which
# is how `make test` builds them where no image registry is reachable.
IMAGE_BASES ?= upstream
BUILD_IMAGES := scripts/build-images --bases $(IMAGE_BASES)

.PHONY: image examples-image restore-image test-images container-engine
container-engine: ## Install (once) and start the project's container engine; prints its DOCKER_HOST
	@scripts/container-engine

image: ## Build the one image of the operator and the runtime: eddyline:dev, ghcr.io/eddyline/eddyline:<appVersion>
	@$(BUILD_IMAGES) eddyline >/dev/null

examples-image: image ## Build the examples' image the examples' cluster manifests run: ghcr.io/eddyline/examples:<version>
	@$(BUILD_IMAGES) examples >/dev/null

restore-image: image ## Build the Spark restore-job image: eddyline-restore:dev, ghcr.io/eddyline/eddyline-restore:<appVersion>
	@$(BUILD_IMAGES) restore >/dev/null

test-images: ## The three images on the test-only stand-in bases, as `make test` builds them (sizes, times)
	@scripts/build-images --bases standin --quiet eddyline examples restore >/dev/null

clean: ## Remove virtual environments, caches and demo state
	rm -rf $(VENV) $(BENCH_VENV) $(BYTEWAX_VENV) .pytest_cache .mypy_cache .ruff_cache $(STATE_DIR)

.PHONY: control-plane node-components cluster real-cluster
control-plane: ## Build (or reuse) kube-apiserver, controller manager, scheduler and etcd (.cache/kubernetes)
	@scripts/build-control-plane >/dev/null

node-components: ## Build (or reuse) kubelet and kube-proxy of the same release, for the real-node tier (.cache/kubernetes)
	@scripts/build-control-plane --node >/dev/null

cluster: $(STAMP) control-plane ## Start the tests' real control plane and kubelet stand-in for your own kubectl (Ctrl-C stops)
	$(BIN)/python -m tests.support.control_plane

real-cluster: $(STAMP) control-plane node-components ## Start the control plane with three real kubelets on containerd for your own kubectl (root; Ctrl-C stops and cleans up)
	$(BIN)/python -m tests.support.realnode

.PHONY: monitoring-crds prometheus
prometheus: ## Build (or reuse) Prometheus and promtool from their Go module, pinned by tools/prometheus (.cache/prometheus)
	@scripts/build-prometheus >/dev/null

monitoring-crds: ## Fetch the Prometheus Operator's PodMonitor/ServiceMonitor/PrometheusRule CRDs (Go module, pinned in the script) into .cache/prometheus-operator, once
	@scripts/monitoring-crds >/dev/null

.PHONY: bench-scale
# BENCH_SCALE_ARGS: e.g. "--keys 50000 --skip autoscale" for a quick run (the default loads 1M keys).
bench-scale: $(STAMP) control-plane ## Scaling benchmark on the real control plane: word count with 1M keys under steady input, scale 3->6->3 and evict, warm-ups vs cold moves, then the autoscaler under 3x load (last line JSON; BENCH_SCALE_ARGS="--keys N --rate W --skip autoscale")
	$(BIN)/python -m tests.bench.bench_scale $(BENCH_SCALE_ARGS)

.PHONY: bench-queries
# BENCH_QUERIES_ARGS: e.g. "--keys 1000000 --log kafka" for the issue's size (the default, 50,000
# keys on the embedded log, takes about 10 minutes on a loaded 2-core machine).
bench-queries: $(STAMP) kafka-jars control-plane ## Queries through every operation on the real control plane: word count, 8 partitions, 3 pods, 1 standby, live input, query clients through the query Service; upgrade (Rolling, and Recreate side by side), rolling restart, scale out/in, evict, node loss (kafka only), pod kill, wiped restore; failed/wrong/p99/staleness per operation (last line JSON; BENCH_QUERIES_ARGS="--keys N --log kafka")
	$(BIN)/python -m tests.bench.bench_queries $(BENCH_QUERIES_ARGS)
