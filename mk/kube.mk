# The chart in a real single-node Kubernetes cluster on this machine (tools/kube_cluster,
# docs/kubernetes.md#a-cluster-on-this-machine). Needs root: a bridge, iptables rules,
# mounts and cgroups.
#
#   make cluster-up     build the binaries once into $(STATEFLEET_CACHE)/kube (Kubernetes
#                       v1.37.2, etcd, containerd, CoreDNS, crictl, the pause image), start
#                       the cluster and the Kafka broker its pods reach (198.18.0.1:9096:
#                       SASL_SSL only, a principal per service, ACLs)
#   make cluster-down   stop both and restore the host (links, routes, iptables, sysctls)
#   make kube-check     against a running cluster: install the chart with the image
#                       `make image` built, traffic, kills, upgrade, scale, Spark, uninstall
#   make kube-test      cluster-up, kube-check, cluster-down (part of `make test`)

KUBE_HOME ?= $(CURDIR)/.local/kube
# The cluster's broker: the project's secure one (as a managed Kafka is), bound to the pod
# bridge's address, beside the test brokers on 127.0.0.1.
KUBE_BROKER_ENV := STATEFLEET_SECURE_BROKER_HOST=198.18.0.1 STATEFLEET_SECURE_BROKER_PORT=9096 \
	STATEFLEET_SECURE_BROKER_CONTROLLER_PORT=9097 STATEFLEET_SECURE_BROKER_HOME=$(CURDIR)/.local/broker-kube-secure
KUBE_ENV := STATEFLEET_KUBE_HOME=$(KUBE_HOME)

.PHONY: cluster-up
cluster-up: venv ## Start a single-node Kubernetes cluster here (root; builds its binaries once) and a broker its pods reach
	$(KUBE_ENV) $(PY) -m tools.kube_cluster up
	$(KUBE_BROKER_ENV) $(PY) -m tools.kafka_broker --secure start
	@echo "cluster up: export KUBECONFIG=$(KUBE_HOME)/admin.kubeconfig; Kafka for pods: 198.18.0.1:9096 (SASL_SSL; its users in .local/broker-kube-secure/credentials.json)"

.PHONY: cluster-down
cluster-down: ## Stop the cluster and its broker; restore the host as it was
	-$(KUBE_BROKER_ENV) $(PY) -m tools.kafka_broker --secure stop
	$(KUBE_ENV) $(PY) -m tools.kube_cluster down

.PHONY: kube-check
kube-check: image $(HELM_LINK) ## The chart in the running cluster: install, traffic, kills, upgrade, scale, Spark, uninstall
	@start=$$(date +%s); \
	$(KUBE_ENV) $(PY) -m tools.kube_cluster load-image $$(cat $(IMAGE_ID_FILE)) --tag $(IMAGE) \
	&& $(KUBE_ENV) $(KUBE_BROKER_ENV) STATEFLEET_HELM=$(HELM) KUBECONFIG=$(KUBE_HOME)/admin.kubeconfig \
		$(VENV)/bin/pytest -q -p no:cacheprovider --durations=0 --timeout 1800 tests/kube \
	&& echo "kube-check: passed in $$(( $$(date +%s) - start ))s"

.PHONY: kube-test
kube-test: ## cluster-up, kube-check, cluster-down (what `make test` runs)
	@rc=0; $(MAKE) cluster-up && $(MAKE) kube-check || rc=1; \
	$(MAKE) cluster-down || rc=1; exit $$rc

# A cold cache's build (about 1,800 CPU-seconds, 15 min of 2 cores) starts with `make test`,
# before the virtualenv, at the lowest priority, and overlaps the suites; cluster-up waits
# for it to finish.
.PHONY: kube-prebuild
kube-prebuild: ## Start building the cluster's missing binaries in the background (lowest CPU and I/O priority)
	@$(PYTHON) -m tools.kube_cluster build --background

# The image's copy into the cluster's containerd (about 40 s of the check's time) happens
# beside the suites too, once the image and the binaries are built; cluster-up waits for it.
.PHONY: kube-preload
kube-preload: ## Build the image and load it into the containerd of the cluster to come, in the background
	@$(KUBE_ENV) $(PYTHON) -m tools.kube_cluster preload --background --tag $(IMAGE) --bases $(IMAGE_BASES) --iidfile $(IMAGE_ID_FILE)

test-early:: kube-prebuild kube-preload

test-last:: kube-test
