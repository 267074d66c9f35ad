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
.PHONY: help setup run demo-store test test-fast kafka kafka-jars lint crds bench-store bench-runtime bench-relocation bench-failover bench-log bench-operator bench-restore bench-windows image clean

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

test: $(STAMP) kafka-jars control-plane ## Run every test, slow ones included (what CI runs)
	@scripts/check-prerequisites --java
	$(BIN)/pytest

test-fast: $(STAMP) ## Run the tests not marked slow
	$(BIN)/pytest -m "not slow"

kafka-jars: ## Fetch the pinned Apache Kafka release (tools/kafka/pom.xml) into .cache/kafka, once
	@scripts/kafka-jars >/dev/null

kafka: $(STAMP) kafka-jars ## Start one Kafka broker (KRaft) for trying eddyline by hand; prints its bootstrap address
	$(BIN)/python -m tests.support.kafka $(STATE_DIR)/kafka

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

bench-windows: $(STAMP) $(BYTEWAX_STAMP) ## Windows benchmark: 1-min tumbling (emit_final) and 30-min session counts, eddyline EOS vs bytewax with recovery, results checked equal (last line JSON)
	$(BIN)/python -m tests.bench.bench_windows

bench-relocation: $(STAMP) ## KIP-816: relocate 10,000 task directories after every ordinal shifted (last line JSON)
	$(BIN)/python tests/bench/bench_relocation.py

bench-failover: $(STAMP) ## Failover benchmark: SIGKILL an active replica; stale answer, promotion, records replayed (last line JSON)
	$(BIN)/python -m tests.bench.bench_failover

bench-operator: $(STAMP) ## Operator benchmark: apply -> children/Ready, pod killed -> stale answer/processing, topology upgrade vs reset-and-rebuild, on the emulated cluster (last line JSON)
	$(BIN)/python -m tests.bench.bench_operator

bench-log: $(STAMP) ## Log benchmark: produce/fetch rates, transaction commit latency; SQLite, Kafka if EDDYLINE_TEST_KAFKA_BOOTSTRAP is set (last line JSON)
	$(BIN)/python -m tests.bench.bench_log

bench-restore: $(STAMP) ## Restore benchmark: serial replay vs Spark build + SST ingest, 2M records (last line JSON)
	$(BIN)/python tests/bench/bench_restore.py

image: ## Build the one image of the operator and the runtime (needs a Docker engine)
	@docker info >/dev/null 2>&1 || { echo "error: no Docker engine reachable; start one (or build on a machine that has one)" >&2; exit 1; }
	docker build -t eddyline:dev .

clean: ## Remove virtual environments, caches and demo state
	rm -rf $(VENV) $(BENCH_VENV) $(BYTEWAX_VENV) .pytest_cache .mypy_cache .ruff_cache $(STATE_DIR)

.PHONY: control-plane cluster
control-plane: ## Build (or reuse) kube-apiserver, controller manager, scheduler and etcd (.cache/kubernetes)
	@scripts/build-control-plane >/dev/null

cluster: $(STAMP) control-plane ## Start the tests' real control plane and kubelet stand-in for your own kubectl (Ctrl-C stops)
	$(BIN)/python -m tests.support.control_plane
