"""The recording and alert rules (helm/statefleet/prometheus/rules.yaml): valid for promtool, their
unit tests pass (each alert firing and not), they query metrics the services define, and the chart
renders them as a PrometheusRule only when asked (or, with "auto", when the operator is there)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helm.chart import CHART
from tests.helm.metric_names import defined_metric_names, used_metric_names

RULES_DIR = CHART / "prometheus"
RULES = RULES_DIR / "rules.yaml"
RULES_TEST = RULES_DIR / "rules_test.yaml"
ALERTS = {
    "StatefleetConsumerLagGrowing",
    "StatefleetInstanceDown",
    "StatefleetParkingLotGrowing",
    "StatefleetLocalStateDiscarded",
}
PROMETHEUS_RULE_API = "monitoring.coreos.com/v1/PrometheusRule"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian's prometheus package; .ci/run installs it)")
    return found


def run_promtool(*args: str, cwd: Path = RULES_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=120)


def rules() -> list[dict[str, object]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_promtool_accepts_the_rules():
    proc = run_promtool("check", "rules", RULES.name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_the_rules_unit_tests_pass():
    proc = run_promtool("test", "rules", RULES_TEST.name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_each_alert_has_a_firing_and_a_quiet_case():
    cases = [case for test in yaml.safe_load(RULES_TEST.read_text())["tests"] for case in test.get("alert_rule_test", [])]
    for alert in ALERTS:
        mine = [case for case in cases if case["alertname"] == alert]
        assert any(case["exp_alerts"] for case in mine), f"{alert} is never expected to fire"
        assert any(not case["exp_alerts"] for case in mine), f"{alert} is never expected to stay quiet"


def test_alerts_say_what_happened_and_what_to_do():
    alerts = {str(rule["alert"]): rule for rule in rules() if "alert" in rule}
    assert set(alerts) == ALERTS
    for name, rule in alerts.items():
        annotations = rule["annotations"]
        assert isinstance(annotations, dict)
        assert {"summary", "description", "runbook"} <= set(annotations), name
        assert isinstance(rule["labels"], dict) and rule["labels"]["severity"] in ("warning", "critical"), name


def test_the_rules_query_metrics_the_services_define():
    defined = defined_metric_names()
    for rule in rules():
        used = used_metric_names(str(rule["expr"]))
        assert used <= defined, f"{rule.get('record') or rule.get('alert')}: {sorted(used - defined)} are not defined"


def test_the_prometheus_rule_is_off_by_default_and_carries_the_rules_file(render):
    assert not render().all("PrometheusRule")
    assert not render(api_versions=[PROMETHEUS_RULE_API]).all("PrometheusRule")
    assert not render(sets=["prometheusRule.enabled=auto"]).all("PrometheusRule")
    for m in (
        render(sets=["prometheusRule.enabled=auto"], api_versions=[PROMETHEUS_RULE_API]),
        render(sets=["prometheusRule.enabled=true", "prometheusRule.labels.release=kube-prometheus"]),
    ):
        [rule] = m.all("PrometheusRule")
        assert rule["spec"] == yaml.safe_load(RULES.read_text())
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"


def test_the_replicas_example_ships_the_rules_next_to_its_service_monitors(render):
    m = render("replicas")
    [rule] = m.all("PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == m.all("ServiceMonitor")[0]["metadata"]["labels"]["release"]
    cm = m.get("ConfigMap", "sf-statefleet-dashboard")
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Streaming"}
