"""The operator console: a stateless Deployment and a Service that read the services through their client Services."""

from __future__ import annotations

from typing import Any

from tests.helm.chart import NAMESPACE, RELEASE, env_of

CONSOLE = f"{RELEASE}-statefleet-console"
URL_SETTINGS = {
    "validator": "STATEFLEET_CONSOLE_VALIDATOR_URL",
    "tallies": "STATEFLEET_CONSOLE_TALLIES_URL",
    "retry-scheduler": "STATEFLEET_CONSOLE_RETRY_SCHEDULER_URL",
}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any]
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_a_deployment_and_a_service_without_state(render):
    m = render()
    deployment = m.get("Deployment", CONSOLE)
    c = container(deployment)
    assert c["args"] == ["services.console"]
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    pod = deployment["spec"]["template"]["spec"]
    assert {v["name"] for v in pod["volumes"]} == {"tmp"}, "no data volume: it holds no state"
    assert not [e for e in c["env"] if "valueFrom" in e], "no Secret: the operator enters the admin token"
    svc = m.get("Service", CONSOLE)
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    assert matches(svc["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    assert not m.has("StatefulSet", CONSOLE)


def test_it_reads_every_service_through_its_client_service(render):
    m = render()
    env = env_of(container(m.get("Deployment", CONSOLE)))
    assert env["STATEFLEET_HTTP_HOST"]["value"] == "0.0.0.0"
    for service, setting in URL_SETTINGS.items():
        client = m.get("Service", f"{RELEASE}-statefleet-{service}")
        port = client["spec"]["ports"][0]["port"]
        assert client["spec"].get("clusterIP") != "None"
        assert env[setting]["value"] == f"http://{RELEASE}-statefleet-{service}.{NAMESPACE}.svc.cluster.local:{port}"


def test_services_not_deployed_are_left_out(render):
    m = render(sets=["services.validator.enabled=false", "services.retryScheduler.enabled=false"])
    env = env_of(container(m.get("Deployment", CONSOLE)))
    assert env["STATEFLEET_CONSOLE_TALLIES_URL"]["value"].startswith(f"http://{RELEASE}-statefleet-tallies.")
    assert env["STATEFLEET_CONSOLE_VALIDATOR_URL"]["value"] == ""
    assert env["STATEFLEET_CONSOLE_RETRY_SCHEDULER_URL"]["value"] == ""


def test_port_replicas_and_switch_from_values(render):
    m = render(sets=["console.port=9000", "console.replicas=2"])
    deployment = m.get("Deployment", CONSOLE)
    assert deployment["spec"]["replicas"] == 2
    assert env_of(container(deployment))["STATEFLEET_HTTP_PORT"]["value"] == "9000"
    off = render(sets=["console.enabled=false"])
    assert not off.has("Deployment", CONSOLE) and not off.has("Service", CONSOLE)


def test_network_policies_let_the_console_reach_the_services(render):
    m = render("replicas")
    console_labels = m.get("Deployment", CONSOLE)["spec"]["template"]["metadata"]["labels"]
    for service in URL_SETTINGS:
        policy = m.get("NetworkPolicy", f"{RELEASE}-statefleet-{service}")
        peers = [peer for rule in policy["spec"]["ingress"] for peer in rule["from"]]
        assert any(matches(p.get("podSelector", {}).get("matchLabels", {}), console_labels) for p in peers), service
    own = m.get("NetworkPolicy", CONSOLE)
    assert own["spec"]["ingress"] == [], "closed until console.allowFrom names who may open it"
    egress_ports = {p["port"] for rule in own["spec"]["egress"] for p in rule["ports"]}
    assert {8001, 8002, 8003, 53} <= egress_ports
