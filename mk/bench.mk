# The peers benchmark (tools/bench/peers): statefleet next to Kafka Streams and Quix Streams
# on the same tally work. Its two peers are built once into .local/ (git-ignored):
#
#   .local/bench/kstreams/   the Kafka Streams application jar and its lib/ (Maven)
#   .local/quix-venv/        Quix Streams in a virtualenv of its own, so that its pinned
#                            dependencies never meet the project's
#
# `make bench-peers ARGS="--events 100000 --rounds 1"` runs it; the smoke test in
# tests/integration/bench runs within `make test`, so `test` builds both first.

QUIXSTREAMS_VERSION ?= 3.28.1
KSTREAMS_SRC := tools/bench/peers/kstreams
KSTREAMS_OUT := $(CURDIR)/.local/bench/kstreams
KSTREAMS_JAR := $(KSTREAMS_OUT)/statefleet-kstreams-tallies.jar
QUIX_VENV := $(CURDIR)/.local/quix-venv
QUIX_STAMP := $(QUIX_VENV)/.installed-quixstreams-$(QUIXSTREAMS_VERSION)

$(KSTREAMS_JAR): $(KSTREAMS_SRC)/pom.xml $(shell find $(KSTREAMS_SRC)/src -type f 2>/dev/null)
	@command -v java >/dev/null || { echo "bench-peers builds the Kafka Streams peer: install Java 17+"; exit 1; }
	@command -v mvn >/dev/null || { echo "bench-peers builds the Kafka Streams peer with Maven: install Maven 3.8+"; exit 1; }
	@echo "building the Kafka Streams tally into $(KSTREAMS_OUT)"
	rm -rf $(KSTREAMS_OUT)
	mvn -q -B -f $(KSTREAMS_SRC)/pom.xml package -Dbench.build.dir=$(KSTREAMS_OUT)
	@touch $@

$(QUIX_STAMP):
	@command -v $(PYTHON) >/dev/null || { echo "bench-peers needs $(PYTHON) (Python 3.11+) for the Quix Streams peer"; exit 1; }
	@echo "installing quixstreams $(QUIXSTREAMS_VERSION) into $(QUIX_VENV) (first run only)"
	rm -rf $(QUIX_VENV)
	env -u PYTHONPATH $(PYTHON) -m venv $(QUIX_VENV)
	env -u PYTHONPATH $(QUIX_VENV)/bin/pip install -q --disable-pip-version-check quixstreams==$(QUIXSTREAMS_VERSION)
	@touch $@

.PHONY: bench-peers-build
bench-peers-build: $(KSTREAMS_JAR) $(QUIX_STAMP) ## Build the peers benchmark's Kafka Streams jar and Quix Streams venv (.local/)

.PHONY: bench-peers
bench-peers: broker venv bench-peers-build ## statefleet vs Kafka Streams vs Quix Streams on the same tallies (ARGS="--events N --rounds R")
	$(PY) -m tools.bench peers $(ARGS)

# `make bench` runs every area, this one included; the suite runs its smoke test.
bench test test-integration: bench-peers-build
