"""The Grafana dashboard the chart ships: a ConfigMap Grafana's sidecar loads, whose panels
query metrics the services define."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.helm.chart import CHART, NAMESPACE, RELEASE
from tests.helm.metric_names import defined_metric_names, used_metric_names

CONFIGMAP = f"{RELEASE}-statefleet-dashboard"


def dashboard(render: Any, sets: tuple[str, ...] = ()) -> dict[str, Any]:
    cm = render(sets=sets).get("ConfigMap", CONFIGMAP)
    return dict(json.loads(cm["data"]["statefleet.json"]))


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in board["panels"] if p["type"] != "row"]


def test_the_dashboard_configmap_carries_the_sidecar_label_and_the_chart_file(render):
    cm = render().get("ConfigMap", CONFIGMAP)
    assert cm["metadata"]["namespace"] == NAMESPACE
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["labels"]["app.kubernetes.io/part-of"] == "statefleet"
    assert "annotations" not in cm["metadata"]
    # the file as it is in the chart, byte for byte apart from the last newline
    assert cm["data"]["statefleet.json"] == (CHART / "dashboards" / "statefleet.json").read_text().rstrip("\n")


def test_the_sidecar_label_and_annotations_are_configurable(render):
    cm = render(
        sets=[
            "grafanaDashboard.labels.grafana_dashboard=null",
            "grafanaDashboard.labels.dashboards=statefleet",
            "grafanaDashboard.annotations.grafana_folder=Streaming",
        ]
    ).get("ConfigMap", CONFIGMAP)
    assert cm["metadata"]["labels"]["dashboards"] == "statefleet"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Streaming"}
    assert not render(sets=["grafanaDashboard.enabled=false"]).has("ConfigMap", CONFIGMAP)


def test_every_panel_queries_with_a_legend(render):
    board = dashboard(render)
    assert board["uid"] == "statefleet"
    assert len(panels(board)) >= 10
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels(board):
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), f"{panel['title']}: empty expr"
            assert target["legendFormat"].strip(), f"{panel['title']}: no legendFormat"


@pytest.mark.parametrize(
    "title,metrics",
    [
        ("Throughput", {"statefleet_messages_processed_total"}),
        ("Consumer lag", {"statefleet_consumer_lag_records"}),
        ("Batch and commit latency (p99)", {"statefleet_batch_seconds_bucket", "statefleet_transaction_commit_seconds_bucket"}),
        ("Retries scheduled and parked", {"statefleet_retry_scheduled_total", "statefleet_retry_parked_total"}),
        ("Stored retries", {"statefleet_retry_stored"}),
        ("Failovers", {"statefleet_peer_failovers_total", "statefleet_read_failovers_total"}),
        ("Restore time", {"statefleet_restore_seconds_sum", "statefleet_restore_seconds_count"}),
        ("Restored records", {"statefleet_restored_records_total"}),
        ("Instances ready", {"statefleet_ready"}),
        ("HTTP forwarded", {"statefleet_http_forwarded_total"}),
    ],
)
def test_the_dashboard_has_the_panels_an_operator_needs(render, title, metrics):
    by_title = {p["title"]: p for p in panels(dashboard(render))}
    assert title in by_title, sorted(by_title)
    used = set().union(*(used_metric_names(t["expr"]) for t in by_title[title]["targets"]))
    assert metrics <= used, f"{title} queries {sorted(used)}"


def test_every_metric_the_dashboard_queries_is_defined_by_the_services(render):
    defined = defined_metric_names()
    assert "statefleet_consumer_lag_records" in defined and "statefleet_retry_parked_total" in defined
    for panel in panels(dashboard(render)):
        for target in panel["targets"]:
            used = used_metric_names(target["expr"])
            assert used, f"{panel['title']}: {target['expr']} queries no statefleet metric"
            assert used <= defined, f"{panel['title']}: {sorted(used - defined)} are not defined"
