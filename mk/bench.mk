# The peers benchmark (tools/bench/peers): statefleet next to Kafka Streams and Quix Streams
# on the same tally work. Its two peers are built once per machine into $(STATEFLEET_CACHE)
# (see the Makefile), so that a fresh clone builds neither, and linked into .local/ where the
# benchmark looks for them:
#
#   .local/bench/kstreams/   the Kafka Streams application jar and its lib/ (Maven), one
#                            build per content of its sources
#   .local/quix-venv/        Quix Streams in a virtualenv of its own, so that its pinned
#                            dependencies never meet the project's
#
# `make bench-peers ARGS="--events 100000 --rounds 1"` runs it; the smoke test in
# tests/integration/bench runs within `make test`, so `test` builds both first.

QUIXSTREAMS_VERSION ?= 3.28.1
KSTREAMS_SRC := tools/bench/peers/kstreams
KSTREAMS_SOURCES := $(KSTREAMS_SRC)/pom.xml $(sort $(shell find $(KSTREAMS_SRC)/src -type f 2>/dev/null))
KSTREAMS_DIGEST := $(shell cat $(KSTREAMS_SOURCES) | sha256sum | cut -c1-16)
KSTREAMS_CACHE := $(STATEFLEET_CACHE)/bench/kstreams-$(KSTREAMS_DIGEST)
KSTREAMS_JAR := $(KSTREAMS_CACHE)/statefleet-kstreams-tallies.jar
KSTREAMS_LINK := $(CURDIR)/.local/bench/kstreams
QUIX_VENV := $(STATEFLEET_CACHE)/bench/quix-venv-$(QUIXSTREAMS_VERSION)
QUIX_STAMP := $(QUIX_VENV)/.installed
QUIX_LINK := $(CURDIR)/.local/quix-venv

$(KSTREAMS_JAR):
	@$(call cached-maven-build,$(KSTREAMS_SRC)/pom.xml,$(KSTREAMS_CACHE),bench.build.dir,the Kafka Streams peer of bench-peers)

$(QUIX_STAMP):
	@command -v $(PYTHON) >/dev/null || { echo "bench-peers needs $(PYTHON) (Python 3.11+) for the Quix Streams peer"; exit 1; }
	@$(call cached-venv,$(QUIX_VENV),quixstreams==$(QUIXSTREAMS_VERSION))

# The links the benchmark and its smoke test find the peers by (tools/bench/peers/runner.py).
.PHONY: bench-peers-links
bench-peers-links: $(KSTREAMS_JAR) $(QUIX_STAMP)
	@mkdir -p $(dir $(KSTREAMS_LINK))
	@rm -rf $(KSTREAMS_LINK) $(QUIX_LINK)
	@ln -sfn $(KSTREAMS_CACHE) $(KSTREAMS_LINK)
	@ln -sfn $(QUIX_VENV) $(QUIX_LINK)

.PHONY: bench-peers-build
bench-peers-build: bench-peers-links ## Build the peers benchmark's Kafka Streams jar and Quix Streams venv (once per machine)

.PHONY: bench-peers
bench-peers: broker venv bench-peers-build ## statefleet vs Kafka Streams vs Quix Streams on the same tallies (ARGS="--events N --rounds R")
	$(PY) -m tools.bench peers $(ARGS)
	$(PY) -m tools.bench.report

# `make bench` runs every area, this one included; the suite runs its smoke test.
bench test-integration: bench-peers-build
test-ready:: bench-peers-build
