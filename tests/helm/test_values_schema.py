"""values.schema.json and the chart's own checks reject bad values, saying where and why."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.chart import CHART, RenderError, run_helm

#: The workloads that connect to Kafka, each of which may have a SASL Secret of its own.
SASL_WORKLOADS = ("tallies", "validator", "retryScheduler", "topics", "spark")


def reject(sets: list[str]) -> str:
    with pytest.raises(RenderError) as err:
        run_helm(CHART, [], sets, [])
    return str(err.value)


@pytest.mark.parametrize(
    "sets,expected",
    [
        (["kafka.bootstrapServers="], "at '/kafka/bootstrapServers': minLength"),
        (["kafka.bootstrapServers=kafka"], "at '/kafka/bootstrapServers': 'kafka' does not match pattern"),
        (["kafka.sasl.workloadSecrets.talies=s"], "at '/kafka/sasl/workloadSecrets': additional properties 'talies' not allowed"),
        (["kafka.securityProtocol=TLS"], "at '/kafka/securityProtocol': value must be one of"),
        (
            ["kafka.sasl.existingSecret=s", "kafka.sasl.password=hunter2"],
            "at '/kafka/sasl': additional properties 'password' not allowed",
        ),
        (
            ["kafka.securityProtocol=SSL", "kafka.tls.existingSecret=t", "kafka.tls.certKey=tls.crt"],
            "at '/kafka/tls/keyKey': minLength: got 0, want 1",
        ),
        (["admin.token=abc"], "at '/admin': additional properties 'token' not allowed"),
        (["serviceDefaults.persistence.size="], "at '/serviceDefaults/persistence/size': minLength: got 0, want 1"),
        (["services.tallies.persistence.size=lots"], "at '/services/tallies/persistence/size': 'lots' does not match"),
        (["services.validator.replicas=-1"], "at '/services/validator/replicas': minimum: got -1, want 0"),
        (["services.tallies.port=70000"], "at '/services/tallies/port': maximum"),
        (["services.tallies.replcas=3"], "at '/services/tallies': additional properties 'replcas' not allowed"),
        (["topics.partitions=0"], "at '/topics/partitions': minimum: got 0, want 1"),
        (["topics.prefix=bad prefix"], "at '/topics/prefix'"),
        (["serviceMonitor.enabled=maybe"], "at '/serviceMonitor/enabled': value must be one of"),
        (["prometheusRule.enabled=maybe"], "at '/prometheusRule/enabled': value must be one of"),
        (["grafanaDashboard.enabled=yes"], "at '/grafanaDashboard/enabled'"),
        (["grafanaDashboard.label=x"], "at '/grafanaDashboard': additional properties 'label' not allowed"),
        (["spark.mode=yarn"], "at '/spark/mode': value must be one of 'local', 'cluster'"),
        (["spark.join.runner=operator"], "at '/spark/join/runner': value must be one of"),
        (["spark.cluster.master=yarn"], "at '/spark/cluster/master'"),
        (["spark.batch.jobs.backfillTallies.schedule=daily"], "at '/spark/batch/jobs/backfillTallies/schedule'"),
        (["image.digest=latest"], "at '/image/digest': 'latest' does not match pattern"),
        (["logLevel=LOUD"], "at '/logLevel': value must be one of"),
        (
            ["services.validator.domain=examples/orders/domain.py"],
            "at '/services/validator/domain': 'examples/orders/domain.py' does not match",
        ),
        (
            ["services.tallies.projection=examples.orders.projection"],
            "at '/services/tallies/projection': 'examples.orders.projection' does not",
        ),
        (
            ["services.tallies.domain=examples.orders.domain:ORDERS"],
            "at '/services/tallies': additional properties 'domain' not allowed",
        ),
    ],
)
def test_schema_rejects_bad_values_with_the_path_and_reason(sets, expected):
    message = reject(sets)
    assert "values don't meet the specifications of the schema" in message
    assert expected in message, message


@pytest.mark.parametrize(
    "sets,expected",
    [
        (
            ["topics.replicationFactor=1"],
            "topics.create.defaultConfigs: min.insync.replicas 2 is more than topics.replicationFactor 1",
        ),
        (
            ["kafka.securityProtocol=SASL_SSL"],
            "kafka.securityProtocol is SASL_SSL but tallies has no SASL credentials: set kafka.sasl.existingSecret",
        ),
        (
            [
                "kafka.securityProtocol=SASL_SSL",
                *(f"kafka.sasl.workloadSecrets.{w}=kafka-{w.lower()}" for w in SASL_WORKLOADS[:-1]),
            ],
            "but spark has no SASL credentials: set kafka.sasl.existingSecret (every workload), "
            "or kafka.sasl.workloadSecrets.spark",
        ),
        (["spark.mode=cluster"], "set spark.storage.accessModes to [ReadWriteMany]"),
        (["spark.join.runner=sparkApplication"], "set spark.storage.accessModes to [ReadWriteMany]"),
        (
            ["spark.storage.enabled=false"],
            "spark.storage is off, so spark.checkpointDir, spark.archiveDir and spark.backfillDir must all be set",
        ),
    ],
)
def test_rules_across_values_fail_with_a_sentence(sets, expected):
    assert expected in reject(sets)


@pytest.mark.parametrize(
    "sets",
    [
        ["topics.replicationFactor=1", "topics.create.defaultConfigs.min\\.insync\\.replicas=1"],
        [
            "spark.mode=cluster",
            "spark.storage.enabled=false",
            "spark.checkpointDir=hdfs://nn:8020/sf/checkpoints",
            "spark.archiveDir=hdfs://nn:8020/sf/archive",
            "spark.backfillDir=hdfs://nn:8020/sf/backfill",
        ],
        ["spark.mode=cluster", "spark.storage.accessModes={ReadWriteMany}"],
        ["kafka.securityProtocol=SASL_PLAINTEXT", "kafka.sasl.existingSecret=kafka-user", "kafka.sasl.mechanism=PLAIN"],
        ["serviceDefaults.persistence.enabled=false", "serviceDefaults.persistence.size="],
        ["serviceMonitor.enabled=true"],
    ],
)
def test_good_combinations_render(sets):
    assert "kind: StatefulSet" in run_helm(CHART, [], sets, [])


def test_every_setting_is_in_the_schema_and_documented_on_the_line_above():
    schema = json.loads((CHART / "values.schema.json").read_text())
    text = (CHART / "values.yaml").read_text()
    lines = text.splitlines()
    undocumented: list[str] = []

    def walk(node: yaml.Node, schema_node: dict[str, Any], path: str) -> None:
        assert isinstance(node, yaml.MappingNode)
        props = schema_node.get("properties", {})
        for key_node, value_node in node.value:
            key = key_node.value
            assert key in props, f"{path}{key} is in values.yaml but not in values.schema.json"
            sub = props[key]
            if "$ref" in sub:
                sub = schema["$defs"][sub["$ref"].rsplit("/", 1)[1]]
            if lines[key_node.start_mark.line - 1].strip().startswith("#"):
                if sub.get("properties") and isinstance(value_node, yaml.MappingNode):
                    walk(value_node, sub, f"{path}{key}.")
            elif sub.get("properties") and isinstance(value_node, yaml.MappingNode):
                walk(value_node, sub, f"{path}{key}.")  # an uncommented section: its settings carry the comments
            else:
                undocumented.append(f"line {key_node.start_mark.line + 1}: {path}{key}")

    walk(yaml.compose(text), schema, "")
    assert not undocumented, "settings without a comment line above: " + ", ".join(undocumented)


def test_chart_refuses_kubernetes_older_than_it_supports():
    with pytest.raises(RenderError, match="kubeVersion"):
        run_helm(CHART, [], [], [], kube_version="1.27.0")


def test_notes_tell_the_operator_how_to_query(tmp_path: Path):
    chart = tmp_path / "statefleet"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "_notes_probe.tpl").write_text('{{- define "notes.probe" -}}' + notes + "{{- end -}}")
    (chart / "templates" / "notes-probe.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n  notes: {{ include "notes.probe" . | quote }}\n'
    )
    out = run_helm(chart, [], ["topics.prefix=prod."], [])
    text = next(d for d in yaml.safe_load_all(out) if d and d["metadata"]["name"] == "notes")["data"]["notes"]
    assert "kubectl -n streaming port-forward svc/sf-statefleet-tallies 8002:8002" in text
    assert "curl -s localhost:8002/tallies/<program_id>" in text
    assert "http://sf-statefleet-validator.streaming.svc.cluster.local:8001" in text
    assert re.search(r"TOKEN=\$\(kubectl -n streaming get secret sf-statefleet-admin .*base64 -d\)", text)
    assert "create job --from=cronjob/sf-statefleet-backfill-tallies" in text
    assert 'topic prefix "prod."' in text
    domain = [
        "services.validator.domain=examples.orders.domain:ORDERS",
        "services.tallies.projection=examples.orders.projection:PROJECTION",
    ]
    out = run_helm(chart, [], domain, [])
    text = next(d for d in yaml.safe_load_all(out) if d and d["metadata"]["name"] == "notes")["data"]["notes"]
    assert "curl -s localhost:8002/tallies/<key>" in text and "localhost:8001/aggregates/<aggregate_id>" in text
    assert "CreateAccount" not in text
