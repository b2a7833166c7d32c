# statefleet — `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
export PYTHONPATH := $(CURDIR)
# Builds and installs that outlive a clone (the cluster's binaries, helm, the linters): a
# fresh clone on the same machine reuses them.
export STATEFLEET_CACHE ?= $(HOME)/.cache/statefleet
# $(call cached-venv,DIR,PACKAGES): a recipe that installs PACKAGES into a virtualenv of
# their own at DIR (in the cache), so that their pinned dependencies never meet the
# project's: one install at a time per DIR (flock), and DIR/.installed, the stamp a rule
# targets, written only once it is complete.
cached-venv = mkdir -p $(dir $(1)) && flock $(1).lock bash -c 'test -e $(1)/.installed && exit 0; \
	echo "installing $(2) into $(1) (once per machine)"; rm -rf $(1) \
	&& env -u PYTHONPATH $(PYTHON) -m venv $(1) \
	&& env -u PYTHONPATH $(1)/bin/pip install -q --disable-pip-version-check $(2) \
	&& touch $(1)/.installed'

# $(call cached-maven-build,POM,DIR,PROPERTY,WHAT): a recipe that runs `mvn package` of POM
# with its build directory (the property PROPERTY) in a new folder beside DIR (in the cache),
# then moves that folder to DIR: a second clone building at the same time never sees half a
# build, and the one that loses the race keeps the winner's.
cached-maven-build = command -v java >/dev/null || { echo "building $(4) needs Java 17+"; exit 1; }; \
	command -v mvn >/dev/null || { echo "building $(4) needs Maven 3.8+"; exit 1; }; \
	echo "building $(4) into $(2) (once per machine and source)"; \
	mkdir -p $(dir $(2)) && work=$$(mktemp -d $(2).XXXXXX) && trap 'rm -rf "$$work"' EXIT \
	&& mvn -q -B -f $(1) package -D$(3)=$$work && { mv -T $$work $(2) 2>/dev/null || test -e $(2); }

# Instances per service for `make up` (e.g. `make up TALLIES=3`).
TALLIES ?= 1
VALIDATOR ?= 1
RETRY_SCHEDULER ?= 1
# KRaft nodes of the broker `make broker` starts (e.g. `make broker BROKERS=3`; empty: as many
# as its storage was formatted with, else 1).
BROKERS ?=
BROKERS_ARG = $(if $(BROKERS),--brokers $(BROKERS))
# Port of the operator console `make up` starts (0: none).
CONSOLE_PORT ?= 8000
# The domain `make up` runs (e.g. `make up DOMAIN=orders`; empty: the accounts domain): its
# validator domain and tallies projection, as the services' STATEFLEET_VALIDATOR_DOMAIN and
# STATEFLEET_TALLIES_PROJECTION (pkg.module:attr).
DOMAIN ?=
DOMAIN_ENV_orders := STATEFLEET_VALIDATOR_DOMAIN=examples.orders.domain:ORDERS \
	STATEFLEET_TALLIES_PROJECTION=examples.orders.projection:PROJECTION
DOMAINS := orders
DOMAIN_ENV = $(if $(DOMAIN),$(if $(filter $(DOMAIN),$(DOMAINS)),$(DOMAIN_ENV_$(DOMAIN)),\
	$(error DOMAIN=$(DOMAIN): unknown; one of: $(DOMAINS), or empty for the accounts domain)))

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# requirements.lock pins every package, with its hashes (make lock writes it from
# pyproject.toml); the project itself goes in editable, with nothing resolved anew.
LOCK := requirements.lock
# The image installs only what it runs (runtime and spark), pinned as in requirements.lock.
IMAGE_LOCK := requirements-image.lock
PIP_TOOLS_VERSION ?= 7.6.2

$(STAMP): pyproject.toml $(LOCK)
	@command -v $(PYTHON) >/dev/null || { echo "Python 3.11+ is required: install python3"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	@# no -q: a first install downloads several hundred MB (pyspark), and its progress shows
	$(PIP) install --upgrade pip
	$(PIP) install --require-hashes -r $(LOCK)
	$(PIP) install --no-deps -e .
	@touch $(STAMP)

.PHONY: lock
lock: ## Re-resolve requirements.lock and requirements-image.lock from pyproject.toml (PIP_COMPILE_ARGS=--upgrade for the newest allowed)
	@test -x $(PIP) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q pip-tools==$(PIP_TOOLS_VERSION)
	$(VENV)/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-find-links \
		--extra spark --extra dev $(PIP_COMPILE_ARGS) --output-file $(LOCK) pyproject.toml
	@# What the image runs (no dev extra), at exactly the versions of the full lock.
	$(VENV)/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-find-links \
		--extra spark --constraint $(LOCK) --output-file $(IMAGE_LOCK) pyproject.toml

.PHONY: venv
venv: $(STAMP) ## Create the virtualenv and install the packages

.PHONY: broker
broker: venv ## Resolve Kafka's jars (Maven), format KRaft storage once, start the broker on 127.0.0.1:9092 (BROKERS=3: a cluster)
	$(PY) -m tools.kafka_broker start $(BROKERS_ARG)

.PHONY: up
up: broker ## Start the broker, every service and the console (http://127.0.0.1:8000) in the background (TALLIES=n ... CONSOLE_PORT=p, DOMAIN=orders)
	$(DOMAIN_ENV) $(PY) -m tools.fleet up --tallies $(TALLIES) --validator $(VALIDATOR) --retry-scheduler $(RETRY_SCHEDULER) \
		--console-port $(CONSOLE_PORT)

.PHONY: down
down: ## Stop the services and the broker
	-$(PY) -m tools.fleet down
	$(PY) -m tools.kafka_broker stop $(BROKERS_ARG)

.PHONY: status
status: venv ## Show what is running
	@# the broker's status exits 1 when it is stopped: an answer, not an error
	@$(PY) -m tools.kafka_broker status $(BROKERS_ARG) || [ $$? -eq 1 ]
	@$(PY) -m tools.fleet status

.PHONY: demo
demo: up ## Start the fleet, send sample traffic, print what the APIs answer
	$(PY) -m tools.demo

.PHONY: lint
lint: venv ## ruff and mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy $(wildcard services shared spark_jobs tools tests examples)

.PHONY: test-unit
test-unit: venv ## Unit tests (no Kafka)
	$(VENV)/bin/pytest -q tests/unit

# The gate to run before pushing a change: what needs no broker (lint, types, the unit tests,
# the services' handlers on the topology driver), in about a minute or two on 2 cores.
# make test stays the whole suite and what CI runs.
.PHONY: check
check: venv ## The fast gate, no broker: ruff, mypy, unit and topology-driver tests (under 3 minutes)
	$(MAKE) lint
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) -m "not spark" tests/unit

.PHONY: test-integration
test-integration: broker ## Integration and end-to-end tests on the real broker
	$(VENV)/bin/pytest -q tests/integration tests/e2e

# Test processes the main suite is spread over (pytest-xdist; one module's tests stay in one
# process). Most of a test's time is spent waiting on Kafka and on service processes, so two
# keep a two-core machine busy; 0 runs the suite in pytest's own process. Modules go out in
# the order collected (the slow e2e ones first), not largest first, so none is left for the end.
TEST_WORKERS ?= 2

# The brokers a test run starts (the main one, the secure one, the chaos runs' and the
# cluster's) live for minutes, not days: compiled with the JVM's quick compiler only, such a
# broker used 41 % less CPU to start and 46 % less under the integration suites of the
# validator and the retry scheduler (the broker's CPU from /proc/<pid>/stat, 2026-11-27). make
# broker and make bench keep the JVM's full JIT.
test: export STATEFLEET_BROKER_JAVA_OPTS ?= -XX:TieredStopAtLevel=1

.PHONY: test
test: ## The whole suite: lint, unit, integration, e2e, helm checks (what CI runs)
	$(MAKE) test-early
	$(MAKE) broker test-ready
	$(MAKE) lint
	$(VENV)/bin/pytest -q --durations=15 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not spark" \
		--ignore=tests/helm --ignore=tests/image --ignore=tests/kube tests
	$(MAKE) test-extra
	$(MAKE) test-last

.PHONY: bench
bench: broker ## Benchmarks against the raw aiokafka baseline; figures to docs/bench-results.jsonl, table in docs/benchmarks.md
	$(PY) -m tools.bench $(BENCH_ARGS)
	$(PY) -m tools.bench.report

# Area makefiles add targets (spark-join, backfill, helm-check, ...) and extend test-extra;
# test-early starts slow preparations in the background that the suites overlap. It comes
# before the virtualenv: on a cold machine the builds then use the core that pip's
# downloads leave idle. Its tools (tools/background.py, tools/image_build.py,
# tools/kube_cluster) use only the standard library and run on $(PYTHON). test-ready then
# builds what the suites need besides the virtualenv and the broker. test-last holds the
# checks that wait for a background build (the cluster's): on a cold machine the others run
# while it finishes, instead of after it on cores the check leaves idle.
.PHONY: test-extra test-early test-ready test-last
test-extra::
	@true
test-last::
	@true
test-early::
	@true
test-ready::
	@true

-include mk/*.mk
