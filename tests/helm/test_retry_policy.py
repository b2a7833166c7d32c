"""The retry policy as chart values: a ConfigMap mounted as the scheduler's policy file, checked by the schema."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from services.retry_scheduler.domain import parse_policy_document
from tests.helm.chart import CHART, RenderError, run_helm

STS = "sf-statefleet-retry-scheduler"
CONFIGMAP = "sf-statefleet-retry-scheduler-policy"
POLICY_FILE = "/etc/statefleet/retry-policy/policy.yaml"


def container(sts: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = sts["spec"]["template"]["spec"]["containers"][0]
    return c


def test_rules_are_a_config_map_mounted_as_the_policy_file_the_scheduler_reads(render):
    m = render("replicas")
    text = m.get("ConfigMap", CONFIGMAP)["data"]["policy.yaml"]
    sections = parse_policy_document(yaml.safe_load(text), "chart")  # what the worker accepts at start-up
    assert [r.name for r in sections.rules] == ["payments-timeouts", "orders"]
    assert sections.rules[0].error_classes == ("TimeoutException", "java.net.*")
    sts = m.get("StatefulSet", STS)
    c = container(sts)
    assert {"name": "STATEFLEET_RETRY_POLICY_FILE", "value": POLICY_FILE} in c["env"]
    mount = next(v for v in c["volumeMounts"] if v["name"] == "retry-policy")
    assert mount == {"name": "retry-policy", "mountPath": "/etc/statefleet/retry-policy", "readOnly": True}
    volume = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "retry-policy")
    assert volume["configMap"]["name"] == CONFIGMAP
    # only the retry scheduler gets it
    other = container(m.get("StatefulSet", "sf-statefleet-tallies"))
    assert all(e["name"] != "STATEFLEET_RETRY_POLICY_FILE" for e in other["env"])


def test_a_change_of_the_rules_rolls_the_pods(render):
    def checksum(sets: list[str]) -> str:
        sts = render(sets=sets).get("StatefulSet", STS)
        return str(sts["spec"]["template"]["metadata"]["annotations"]["checksum/retry-policy"])

    one = checksum(
        [
            "services.retryScheduler.policy.rules[0].origin_topic=payments",
            "services.retryScheduler.policy.rules[0].max_attempts=3",
        ]
    )
    two = checksum(
        [
            "services.retryScheduler.policy.rules[0].origin_topic=payments",
            "services.retryScheduler.policy.rules[0].max_attempts=4",
        ]
    )
    assert one != two


def test_no_rules_no_config_map(render):
    m = render()
    assert not m.has("ConfigMap", CONFIGMAP)
    c = container(m.get("StatefulSet", STS))
    assert all(e["name"] != "STATEFLEET_RETRY_POLICY_FILE" for e in c["env"])
    assert all(v["name"] != "retry-policy" for v in c["volumeMounts"])


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (["services.retryScheduler.policy.rules[0].max_attempts=0"], "/services/retryScheduler/policy/rules/0/max_attempts"),
        (["services.retryScheduler.policy.rules[0].jitter=half"], "/services/retryScheduler/policy/rules/0/jitter"),
        (["services.retryScheduler.policy.rules[0].max_attempt=3"], "additional properties 'max_attempt' not allowed"),
        (
            ["services.retryScheduler.policy.rules[0].origin_topic=bad topic"],
            "/services/retryScheduler/policy/rules/0/origin_topic",
        ),
        (["services.retryScheduler.policy.rule=x"], "additional properties 'rule' not allowed"),
    ],
)
def test_the_schema_refuses_a_bad_rule(sets: list[str], expected: str) -> None:
    with pytest.raises(RenderError) as err:
        run_helm(CHART, [], sets, [])
    assert expected in str(err.value)
