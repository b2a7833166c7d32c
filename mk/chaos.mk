# The chaos run (tools/chaos): the whole fleet, 2 instances of each service, on a broker of
# its own (port 29092, services on ports 28001-28013 or the next free ones; .local/chaos), a
# seeded load through the public contract while instances and the broker are SIGKILLed;
# then everything checked against a reference model of the contract (docs/reliability.md).

SEED ?= 1
SECONDS ?= 120
# The short run `make test` includes: seeded, so a failure is rerun as it was.
CHAOS_TEST_SEED ?= 16
CHAOS_TEST_SECONDS ?= 90

.PHONY: chaos
chaos: venv ## The fleet under SIGKILLs and a broker kill, checked against the contract (SECONDS=600 SEED=n)
	$(PY) -m tools.chaos --seconds $(SECONDS) --seed $(SEED)

.PHONY: test-chaos
test-chaos: venv ## The short seeded chaos run that make test includes
	$(PY) -m tools.chaos --seconds $(CHAOS_TEST_SECONDS) --seed $(CHAOS_TEST_SEED)

test-extra:: test-chaos
