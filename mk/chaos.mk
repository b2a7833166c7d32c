# The chaos run (tools/chaos): the whole fleet, 2 instances of each service, on a broker of
# its own (port 29092, services on ports 28001-28013 or the next free ones; .local/chaos), a
# seeded load through the public contract while instances and the broker are SIGKILLed;
# then everything checked against a reference model of the contract (docs/reliability.md).

SEED ?= 1
SECONDS ?= 120
# at_least_once or exactly_once: the fleet's processing guarantee; with exactly_once the topics
# are read read_committed and a single duplicate delivered fails the run.
GUARANTEE ?= at_least_once
# The short runs `make test` includes, one per guarantee: seeded, so a failure is rerun as it was.
CHAOS_TEST_SEED ?= 16
CHAOS_TEST_SECONDS ?= 90
CHAOS_TEST_EOS_SEED ?= 17
CHAOS_TEST_EOS_SECONDS ?= 60

.PHONY: chaos
chaos: venv ## The fleet under SIGKILLs and a broker kill, checked against the contract (SECONDS=600 SEED=n GUARANTEE=exactly_once)
	$(PY) -m tools.chaos --seconds $(SECONDS) --seed $(SEED) --guarantee $(GUARANTEE)

.PHONY: test-chaos
test-chaos: venv ## The short seeded chaos runs that make test includes (at_least_once, then exactly_once)
	$(PY) -m tools.chaos --seconds $(CHAOS_TEST_SECONDS) --seed $(CHAOS_TEST_SEED) --guarantee at_least_once
	$(PY) -m tools.chaos --seconds $(CHAOS_TEST_EOS_SECONDS) --seed $(CHAOS_TEST_EOS_SEED) --guarantee exactly_once

test-extra:: test-chaos
