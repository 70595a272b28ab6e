# sandflow's front door. `make test` and `make run` install what they need.
SHELL := /bin/bash
CARGO ?= cargo
# Reuse one build cache across clones (CI and local); override to taste.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/sandflow-target
export CARGO_TERM_COLOR ?= never

DATA_DIR ?= ./sandflow-data
# The Python example component's builder (pinned: its output is tested).
COMPONENTIZE_PY ?= 0.25.1

.PHONY: setup build test lint deps unit run bench fmt clean-data examples

## Installs the toolchain pieces the build needs (idempotent).
setup:
	@rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
	@command -v protoc >/dev/null || { (apt-get update -qq || true) && apt-get install -y -qq protobuf-compiler; }
	@command -v psql >/dev/null || { (apt-get update -qq || true) && apt-get install -y -qq postgresql-client; }
	@test -f /usr/share/java/postgresql.jar || { (apt-get update -qq || true) && apt-get install -y -qq libpostgresql-jdbc-java; }
	@python3 -c 'import psycopg, psycopg2' 2>/dev/null || python3 -m pip install -q "psycopg[binary]" psycopg2-binary
	@command -v mysql >/dev/null || { (apt-get update -qq || true) && apt-get install -y -qq default-mysql-client; }
	@command -v openssl >/dev/null || { (apt-get update -qq || true) && apt-get install -y -qq openssl; }
	@command -v curl >/dev/null || { (apt-get update -qq || true) && apt-get install -y -qq curl; }
	@command -v etcd >/dev/null || { (apt-get update -qq || true) && apt-get install -y -qq etcd-server; }
	@test -x /usr/sbin/nats-server || command -v nats-server >/dev/null || { (apt-get update -qq || true) && apt-get install -y -qq nats-server; }
	@python3 -c 'import pymysql, mysql.connector' 2>/dev/null || python3 -m pip install -q pymysql mysql-connector-python
	@componentize-py --version 2>/dev/null | grep -qx 'componentize-py $(COMPONENTIZE_PY)' || python3 -m pip install -q componentize-py==$(COMPONENTIZE_PY)

## Builds the server (release) with the guest component embedded.
build: setup
	$(CARGO) build --release --bin sandflow

## Formatting, lints, then every test: unit, engine, end-to-end.
test: setup examples lint unit

## The SDK's example components (the end-to-end tests upload them): top-k in
## Rust, and a per-key anomaly score in Python built with componentize-py
## (--stub-wasi: it imports nothing but the contract).
examples: setup
	$(CARGO) build -p sandflow-example-topk --target wasm32-wasip2 --release
	@mkdir -p $(CARGO_TARGET_DIR)/wasm32-wasip2/release
	cd guest/sdk/examples/anomaly-py && componentize-py -d ../../../../wit -w flow-engine componentize \
		--stub-wasi -p . anomaly -o $(CARGO_TARGET_DIR)/wasm32-wasip2/release/sandflow_example_anomaly.wasm

lint: setup deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## The crates' dependencies point one way (see ARCHITECTURE.md).
deps:
	@if $(CARGO) tree -p sandflow-flows -e normal --prefix none | grep -Eq '^(datafusion|redb|tokio|wasmtime)'; then \
		echo "sandflow-flows must not depend on datafusion, redb, tokio or wasmtime:"; \
		$(CARGO) tree -p sandflow-flows -e normal -i datafusion -i redb -i tokio -i wasmtime 2>/dev/null | head -20; exit 1; fi
	@if $(CARGO) tree -p sandflow-sandbox -e normal --prefix none | grep -Eq '^(datafusion|redb)'; then \
		echo "sandflow-sandbox must not depend on datafusion or redb"; exit 1; fi
	@if $(CARGO) tree -p sandflow-contract -e normal --prefix none --no-default-features | grep -Eq '^(datafusion|redb|tokio|wasmtime)'; then \
		echo "sandflow-contract must not depend on datafusion, redb, tokio or wasmtime"; exit 1; fi
	@if $(CARGO) tree -p sandflow-cluster -e normal --prefix none | grep -Eq '^(datafusion|redb|wasmtime)'; then \
		echo "sandflow-cluster must not depend on datafusion, redb or wasmtime"; exit 1; fi
	@if grep -rqE 'crate::(catalog|flow|sql|session|database)\b' host/db/src/storage; then \
		echo "host/db/src/storage must not use the catalog, flows, SQL or sessions:"; \
		grep -rnE 'crate::(catalog|flow|sql|session|database)\b' host/db/src/storage; exit 1; fi
	@if grep -rqE 'sandflow::(storage|catalog)\b' host/server/src; then \
		echo "host/server must use the sandflow library's database API, not its storage or catalog:"; \
		grep -rnE 'sandflow::(storage|catalog)\b' host/server/src; exit 1; fi
	@echo "dependencies point one way"

unit: setup
	$(CARGO) test --workspace -- --test-threads=2

## Starts the server with defaults (psql -h 127.0.0.1 -p 4003, HTTP on :4000).
run: build
	$(CARGO_TARGET_DIR)/release/sandflow start --data-dir $(DATA_DIR) --auth none

## The benchmarks: the reference workload in wasm and natively, the guest's part
## of a back-fill (both engines, rows in time and in series order), recovery, many
## flows, the change log, joins against differential-dataflow, user components,
## then the whole path (the release server) against PostgreSQL 15, and a
## flow on a flow node (etcd, NATS JetStream) against one node, and failover.
bench: setup examples build
	@test -x /usr/lib/postgresql/15/bin/initdb || { (apt-get update -qq || true) && apt-get install -y -qq postgresql-15; }
	$(CARGO) bench -p sandflow-tests --features dd --bench engine --bench backfill --bench recovery --bench flows_scale --bench pull_log --bench joins --bench components
	python3 tests/benches/whole_path.py --sandflow $(CARGO_TARGET_DIR)/release/sandflow
	python3 tests/benches/cluster.py --sandflow $(CARGO_TARGET_DIR)/release/sandflow

fmt:
	$(CARGO) fmt --all

clean-data:
	rm -rf $(DATA_DIR)
