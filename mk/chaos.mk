# The chaos run (tools/chaos): the whole fleet, 2 instances of each service, on a broker of
# its own (port 29092, services on ports 28001-28013 or the next free ones; .local/chaos), a
# seeded load through the public contract while instances and the broker are SIGKILLed;
# then everything checked against a reference model of the contract (docs/reliability.md).

SEED ?= 1
SECONDS ?= 120
# at_least_once or exactly_once: the fleet's processing guarantee; with exactly_once the topics
# are read read_committed and a single duplicate delivered fails the run.
GUARANTEE ?= at_least_once
# KRaft nodes of the run's broker: with more than one, the node leading the most partitions (or
# a coordinator's) is SIGKILLed and started again a few seconds later, again and again.
BROKERS ?= 1
# The short runs `make test` includes, one per guarantee: seeded, so a failure is rerun as it was.
CHAOS_TEST_SEED ?= 16
CHAOS_TEST_SECONDS ?= 90
CHAOS_TEST_EOS_SEED ?= 17
CHAOS_TEST_EOS_SECONDS ?= 60
# The short 3-node runs (leader moves under load), one per guarantee.
CHAOS_TEST_NODES_SEED ?= 18
CHAOS_TEST_NODES_SECONDS ?= 60

.PHONY: chaos
chaos: venv ## The fleet under SIGKILLs and broker kills, checked against the contract (SECONDS=600 SEED=n GUARANTEE=exactly_once BROKERS=3)
	$(PY) -m tools.chaos --seconds $(SECONDS) --seed $(SEED) --guarantee $(GUARANTEE) --brokers $(BROKERS)

.PHONY: test-chaos
test-chaos: venv ## The short seeded chaos runs that make test includes (one broker, then three nodes; each guarantee)
	$(PY) -m tools.chaos --seconds $(CHAOS_TEST_SECONDS) --seed $(CHAOS_TEST_SEED) --guarantee at_least_once
	$(PY) -m tools.chaos --seconds $(CHAOS_TEST_EOS_SECONDS) --seed $(CHAOS_TEST_EOS_SEED) --guarantee exactly_once
	$(PY) -m tools.chaos --seconds $(CHAOS_TEST_NODES_SECONDS) --seed $(CHAOS_TEST_NODES_SEED) --guarantee at_least_once --brokers 3
	$(PY) -m tools.chaos --seconds $(CHAOS_TEST_NODES_SECONDS) --seed $(CHAOS_TEST_NODES_SEED) --guarantee exactly_once --brokers 3

test-extra:: test-chaos
