# The engine's dependency ranges (pyproject.toml; shared/engine/_versions.py checks them at
# start) hold at their lowest end too: a virtualenv with every locked version except
# faust-streaming and aiokafka, which are at the lowest of their ranges, runs the unit and
# topology-driver tests and one end-to-end file of crash tests. The project runs from the
# clone (PYTHONPATH), so one virtualenv per machine (per lock and this file) serves every clone.
LOWEST_PINS := faust-streaming==0.15.3 aiokafka==0.13.0
LOWEST_E2E ?= tests/e2e/tallies/test_tallies_crash.py
LOWEST_KEY := $(shell cat $(LOCK) mk/lowest.mk | sha256sum | cut -c1-12)
LOWEST_VENV := $(STATEFLEET_CACHE)/venv-lowest-$(LOWEST_KEY)
LOWEST_REQS := .local/lowest-requirements.txt

$(LOWEST_VENV)/.installed:
	@mkdir -p $(dir $(LOWEST_REQS))
	@# The lock's pins without their hashes, less the two moved to their lowest.
	@grep -E '^[A-Za-z0-9_.-]+==' $(LOCK) | sed 's/ *\\$$//' \
		| grep -v -E '^(faust-streaming|aiokafka)==' > $(LOWEST_REQS)
	@for pin in $(LOWEST_PINS); do echo $$pin; done >> $(LOWEST_REQS)
	$(call cached-venv,$(LOWEST_VENV),--no-deps -r $(CURDIR)/$(LOWEST_REQS))

.PHONY: test-lowest
test-lowest: $(LOWEST_VENV)/.installed broker ## Unit, driver and one e2e file on the lowest supported faust-streaming and aiokafka
	$(LOWEST_VENV)/bin/python -c 'import aiokafka, faust; print("on faust-streaming", faust.__version__, "and aiokafka", aiokafka.__version__)'
	$(LOWEST_VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) -m "not spark" -p no:cacheprovider tests/unit $(LOWEST_E2E)

test-extra:: test-lowest
