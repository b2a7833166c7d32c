"""`helm test`: the hook pod asks each enabled service's client Service and the console."""

from __future__ import annotations

from tests.helm.conftest import Render


def test_the_test_pod_asks_every_enabled_service_and_the_console(render: Render) -> None:
    pod = render().get("Pod", "sf-statefleet-test")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    args = pod["spec"]["containers"][0]["args"]
    for service, port in (("tallies", 8002), ("validator", 8001), ("retry-scheduler", 8003)):
        assert f"http://sf-statefleet-{service}:{port}/readyz" in args, args
    assert "http://sf-statefleet-console:8000/healthz" in args, args
    # It runs as the services do: no token, the chart's user, a read-only root.
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_test_pod_skips_disabled_services(render: Render) -> None:
    args = render("minimal").get("Pod", "sf-statefleet-test")["spec"]["containers"][0]["args"]
    assert args == ["http://sf-statefleet-tallies:8002/readyz", "http://sf-statefleet-tallies:8002/openapi.json"], args
