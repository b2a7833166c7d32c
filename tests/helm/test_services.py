"""The stateful services: StatefulSets, per-pod DNS, probes, volumes, disruption and placement."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helm.chart import NAMESPACE, RELEASE, env_names, env_of

SERVICES = {"tallies": 8002, "validator": 8001, "retry-scheduler": 8003}


def sts_name(service: str) -> str:
    return f"{RELEASE}-statefleet-{service}"


def container(sts: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = sts["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("service,port", SERVICES.items())
def test_one_statefulset_per_service_runs_its_module(render, service, port):
    m = render()
    sts = m.get("StatefulSet", sts_name(service))
    c = container(sts)
    assert c["args"] == [f"services.{service.replace('-', '_')}"]
    assert c["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    assert sts["spec"]["replicas"] == 1
    env = env_of(c)
    assert env["STATEFLEET_HTTP_HOST"]["value"] == "0.0.0.0"
    assert env["STATEFLEET_HTTP_PORT"]["value"] == str(port)
    # the service then refuses to start with the development admin token
    assert env["STATEFLEET_ENV"]["value"] == "production"


def test_replicas_and_per_service_overrides(render):
    m = render("replicas")
    assert m.get("StatefulSet", sts_name("tallies"))["spec"]["replicas"] == 4
    assert m.get("StatefulSet", sts_name("validator"))["spec"]["replicas"] == 3
    tallies = container(m.get("StatefulSet", sts_name("tallies")))
    assert tallies["resources"]["requests"] == {"cpu": "1", "memory": "2Gi"}
    assert env_of(tallies)["STATEFLEET_CONSUMER_MAX_POLL_RECORDS"]["value"] == "20000"
    assert "STATEFLEET_CONSUMER_MAX_POLL_RECORDS" not in env_of(container(m.get("StatefulSet", sts_name("validator"))))


@pytest.mark.parametrize("service,port", SERVICES.items())
def test_advertised_url_is_the_pods_name_in_the_headless_service(render, service, port):
    m = render()
    sts = m.get("StatefulSet", sts_name(service))
    headless = m.get("Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert matches(headless["spec"]["selector"], sts["spec"]["template"]["metadata"]["labels"])

    c = container(sts)
    env = env_of(c)
    hl = headless["metadata"]["name"]
    assert env["STATEFLEET_ADVERTISED_URL"]["value"] == (f"http://$(POD_NAME).{hl}.$(POD_NAMESPACE).svc.cluster.local:{port}")
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    # $(VAR) expands only from variables defined earlier in the list.
    names = env_names(c)
    assert names.index("POD_NAME") < names.index("STATEFLEET_ADVERTISED_URL")
    assert names.index("POD_NAMESPACE") < names.index("STATEFLEET_ADVERTISED_URL")


def test_cluster_domain_is_part_of_the_advertised_url(render):
    m = render(sets=["clusterDomain=corp.internal"])
    url = env_of(container(m.get("StatefulSet", sts_name("tallies"))))["STATEFLEET_ADVERTISED_URL"]["value"]
    assert url.endswith(".svc.corp.internal:8002")


def test_static_membership_from_the_pod_name(render):
    c = container(render().get("StatefulSet", sts_name("tallies")))
    env = env_of(c)
    assert env["STATEFLEET_INSTANCE_ID"]["value"] == "$(POD_NAME)"
    assert env_names(c).index("POD_NAME") < env_names(c).index("STATEFLEET_INSTANCE_ID")
    assert env["STATEFLEET_STATIC_MEMBERSHIP"]["value"] == "true"
    assert env["STATEFLEET_STANDBY_REPLICAS"]["value"] == "1"


@pytest.mark.parametrize("service", SERVICES)
def test_probes_liveness_healthz_readiness_readyz_startup_long_enough_for_a_restore(render, service):
    c = container(render().get("StatefulSet", sts_name(service)))
    ports = {p["name"] for p in c["ports"]}
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["port"] in ports
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 3600, "a restore may take an hour"
    liveness = c["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 30


def test_startup_budget_follows_values(render):
    m = render(sets=["serviceDefaults.probes.startupFailureThreshold=720"])
    c = container(m.get("StatefulSet", sts_name("validator")))
    assert c["startupProbe"]["failureThreshold"] == 720


@pytest.mark.parametrize("service", SERVICES)
def test_rocksdb_data_dir_is_a_persistent_volume_claim_per_pod(render, service):
    sts = render().get("StatefulSet", sts_name(service))
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    c = container(sts)
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["data"] == env_of(c)["STATEFLEET_DATA_DIR"]["value"] == "/var/lib/statefleet"
    pod_volumes = {v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert "data" not in pod_volumes, "the claim template provides the data volume"
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}


def test_volume_size_and_class_from_values(render):
    sts = render("replicas").get("StatefulSet", sts_name("tallies"))
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert claim["spec"]["storageClassName"] == "fast-ssd"


def test_without_persistence_the_data_dir_is_an_empty_dir(render):
    sts = render("minimal").get("StatefulSet", sts_name("tallies"))
    assert "volumeClaimTemplates" not in sts["spec"]
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"] == {"name": "data", "emptyDir": {}}


def test_disabled_services_render_nothing(render):
    m = render("minimal")
    assert [s["metadata"]["name"] for s in m.all("StatefulSet")] == [sts_name("tallies")]
    assert {s["metadata"]["name"] for s in m.all("Service")} == {sts_name("tallies"), f"{sts_name('tallies')}-headless"}


@pytest.mark.parametrize("service", SERVICES)
def test_grace_period_allows_a_clean_leave(render, service):
    spec = render().get("StatefulSet", sts_name(service))["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] >= 60


@pytest.mark.parametrize("service", SERVICES)
def test_a_stopping_pod_keeps_answering_while_the_service_stops_routing_to_it(render, service):
    spec = render().get("StatefulSet", sts_name(service))["spec"]["template"]["spec"]
    [container] = spec["containers"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep" and 0 < int(command[1]) < spec["terminationGracePeriodSeconds"] / 4


@pytest.mark.parametrize("service,port", SERVICES.items())
def test_client_service_balances_over_the_pods(render, service, port):
    m = render()
    svc = m.get("Service", sts_name(service))
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"].get("clusterIP") != "None"
    assert svc["spec"]["ports"] == [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]
    pod_labels = m.get("StatefulSet", sts_name(service))["spec"]["template"]["metadata"]["labels"]
    assert matches(svc["spec"]["selector"], pod_labels)
    other = m.get("StatefulSet", sts_name("validator" if service != "validator" else "tallies"))
    assert not matches(svc["spec"]["selector"], other["spec"]["template"]["metadata"]["labels"])


@pytest.mark.parametrize("service", SERVICES)
def test_pod_disruption_budget_covers_exactly_the_service(render, service):
    m = render()
    pdb = m.get("PodDisruptionBudget", sts_name(service))
    assert pdb["spec"]["maxUnavailable"] == 1
    sts = m.get("StatefulSet", sts_name(service))
    assert pdb["spec"]["selector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]


def test_anti_affinity_prefers_one_pod_per_node_by_default(render):
    spec = render().get("StatefulSet", sts_name("tallies"))["spec"]["template"]["spec"]
    (term,) = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "tallies"


def test_hard_anti_affinity_and_zone_spread(render):
    spec = render("replicas").get("StatefulSet", sts_name("validator"))["spec"]["template"]["spec"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" in spec["affinity"]["podAntiAffinity"]
    (spread,) = spec["topologySpreadConstraints"]
    assert spread["topologyKey"] == "topology.kubernetes.io/zone"
    assert spread["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "validator"


def test_kafka_and_topic_settings_reach_every_service(render):
    m = render("replicas")
    for service in SERVICES:
        env = env_of(container(m.get("StatefulSet", sts_name(service))))
        assert env["STATEFLEET_KAFKA_BOOTSTRAP_SERVERS"]["value"].startswith("kafka-0.kafka-headless")
        assert env["STATEFLEET_TOPIC_PREFIX"]["value"] == "prod."
        assert env["STATEFLEET_TOPIC_PARTITIONS"]["value"] == "12"
        assert env["STATEFLEET_TOPIC_REPLICATION_FACTOR"]["value"] == "3"


def test_network_policy_admits_peers_clients_and_scrapers_only(render):
    m = render("replicas")
    pol = m.get("NetworkPolicy", sts_name("tallies"))
    assert pol["spec"]["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = pol["spec"]["ingress"]
    assert ingress["ports"] == [{"port": "http", "protocol": "TCP"}]
    sources = ingress["from"]
    assert sources[0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "tallies"
    namespaces = {
        s["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for s in sources if "namespaceSelector" in s
    }
    assert namespaces == {"frontend", "monitoring"}
    egress_ports = [p["port"] for rule in pol["spec"]["egress"] for p in rule["ports"]]
    assert 53 in egress_ports and 9092 in egress_ports and 8002 in egress_ports
    assert not render().all("NetworkPolicy"), "network policies are optional and off by default"


def test_service_monitor_only_when_the_prometheus_operator_is_there(render):
    assert not render().all("ServiceMonitor")
    m = render(api_versions=["monitoring.coreos.com/v1/ServiceMonitor"])
    monitors = m.all("ServiceMonitor")
    assert len(monitors) == 3
    mon = m.get("ServiceMonitor", sts_name("tallies"))
    assert mon["spec"]["endpoints"][0]["path"] == "/metrics"
    assert mon["spec"]["endpoints"][0]["port"] == "http"
    # It selects the headless Service only, so each pod is scraped once.
    selected = [s for s in m.all("Service") if matches(mon["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
    assert [s["metadata"]["name"] for s in selected] == [f"{sts_name('tallies')}-headless"]
    assert not render(sets=["serviceMonitor.enabled=false"], api_versions=["monitoring.coreos.com/v1/ServiceMonitor"]).all(
        "ServiceMonitor"
    )


def test_everything_lands_in_the_release_namespace(render, scenario):
    for doc in render(scenario).docs:
        assert doc["metadata"].get("namespace") == NAMESPACE, f"{doc['kind']}/{doc['metadata']['name']}"
