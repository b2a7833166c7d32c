"""Pod security and credentials: non-root, read-only root, no capabilities, secrets only by reference."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.helm.chart import RELEASE

SECRETISH = re.compile(r"PASSWORD|TOKEN|SECRET|USERNAME|KEY$")


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = pod.get("initContainers", []) + pod["containers"]
    return listed


def test_every_pod_runs_non_root_with_runtime_default_seccomp(render, scenario):
    for where, pod in render(scenario).pod_specs():
        psc = pod["securityContext"]
        assert psc["runAsNonRoot"] is True, where
        assert psc["runAsUser"] >= 1000, where
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, where


def test_every_container_is_locked_down(render, scenario):
    for where, pod in render(scenario).pod_specs():
        for c in containers(pod):
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["privileged"] is False, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where
            assert sc["runAsNonRoot"] is True, where


def test_read_only_root_has_writable_tmp_and_data(render, scenario):
    for where, pod in render(scenario).pod_specs():
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for c in containers(pod):
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            assert "/tmp" in mounts, f"{where}: no writable /tmp"
            assert "emptyDir" in volumes[mounts["/tmp"]], where
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            if "STATEFLEET_DATA_DIR" in env:
                assert env["STATEFLEET_DATA_DIR"] in mounts, f"{where}: data dir is not a volume"


def test_service_account_tokens_are_not_mounted(render, scenario):
    m = render(scenario)
    for sa in m.all("ServiceAccount"):
        assert sa["automountServiceAccountToken"] is False
    for where, pod in m.pod_specs():
        spark_driver_on_k8s = (
            scenario in ("spark-cluster", "spark-operator")
            and (where.startswith("Deployment/") or where.startswith("CronJob/"))
            and not where.endswith("-console")
        )
        if spark_driver_on_k8s:
            # These drivers create executor pods through the API: they, and only they, get the token.
            assert pod["automountServiceAccountToken"] is True, where
            assert pod["serviceAccountName"] == f"{RELEASE}-statefleet-spark", where
        else:
            assert pod["automountServiceAccountToken"] is False, where


#: Settings whose names look secret but hold a flag.
FLAGS = {"STATEFLEET_PAYLOADS_REQUIRE_TOKEN"}


def test_no_credential_is_inlined(render, scenario):
    m = render(scenario)
    for where, pod in m.pod_specs():
        from_secrets = {
            mount["mountPath"]
            for c in containers(pod)
            for mount in c.get("volumeMounts", [])
            for v in pod.get("volumes", [])
            if v["name"] == mount["name"] and "secret" in v
        }
        for c in containers(pod):
            for e in c.get("env", []):
                if e["name"] in FLAGS:
                    assert e["value"] in ("true", "false"), f"{where}: {e['name']}"
                elif SECRETISH.search(e["name"]) and e["name"].endswith("_FILE"):  # a file of secrets: from a Secret's volume
                    assert any(e["value"].startswith(path + "/") for path in from_secrets), f"{where}: {e['name']}"
                elif SECRETISH.search(e["name"]):
                    assert "value" not in e, f"{where}: {e['name']} has an inline value"
                    assert "secretKeyRef" in e["valueFrom"], f"{where}: {e['name']}"


def test_sasl_and_tls_credentials_come_from_the_named_secrets(render):
    m = render("sasl-tls")
    sts = m.get("StatefulSet", f"{RELEASE}-statefleet-tallies")
    pod = sts["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["STATEFLEET_KAFKA_SECURITY_PROTOCOL"]["value"] == "SASL_SSL"
    assert env["STATEFLEET_KAFKA_SASL_MECHANISM"]["value"] == "SCRAM-SHA-512"
    assert env["STATEFLEET_KAFKA_SASL_USERNAME"]["valueFrom"]["secretKeyRef"] == {"name": "statefleet-kafka-scram", "key": "user"}
    assert env["STATEFLEET_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "statefleet-kafka-scram",
        "key": "password",
    }
    tls = {v["name"]: v for v in pod["volumes"]}["kafka-tls"]
    assert tls["secret"]["secretName"] == "statefleet-kafka-tls"
    mount = {v["name"]: v for v in pod["containers"][0]["volumeMounts"]}["kafka-tls"]
    assert mount["readOnly"] is True
    assert env["STATEFLEET_KAFKA_SSL_CAFILE"]["value"] == f"{mount['mountPath']}/ca.crt"
    assert env["STATEFLEET_KAFKA_SSL_CERTFILE"]["value"] == f"{mount['mountPath']}/tls.crt"
    assert env["STATEFLEET_KAFKA_SSL_KEYFILE"]["value"] == f"{mount['mountPath']}/tls.key"


def test_a_workload_with_a_secret_of_its_own_connects_as_its_own_principal(render):
    own = {"tallies": "kafka-tallies", "topics": "kafka-topics", "spark": "kafka-spark"}
    m = render(
        "sasl-tls",
        sets=[f"kafka.sasl.workloadSecrets.{w}={name}" for w, name in own.items()]
        + ["spark.mode=cluster", "spark.storage.accessModes={ReadWriteMany}"],
    )

    def workload(where: str) -> str:
        if where.startswith("StatefulSet/"):
            return where.removeprefix(f"StatefulSet/{RELEASE}-statefleet-")
        return "topics" if where.startswith("Job/") else "spark"

    seen = set()
    for where, pod in m.pod_specs():
        for c in containers(pod):
            env = {e["name"]: e for e in c.get("env", [])}
            if "STATEFLEET_KAFKA_SASL_USERNAME" not in env:
                continue
            expected = own.get(workload(where), "statefleet-kafka-scram")  # the release's Secret otherwise
            for name in ("STATEFLEET_KAFKA_SASL_USERNAME", "STATEFLEET_KAFKA_SASL_PASSWORD"):
                assert env[name]["valueFrom"]["secretKeyRef"]["name"] == expected, f"{where}: {name}"
            seen.add(workload(where))
    # Every kind of workload was looked at, the executors' pod template among them.
    assert seen == {"tallies", "validator", "retry-scheduler", "topics", "spark"}, seen
    assert any(where.startswith("executor template") for where, _ in m.pod_specs())


def test_plaintext_has_no_credentials_at_all(render):
    env = {
        e["name"]
        for e in render().get("StatefulSet", f"{RELEASE}-statefleet-tallies")["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert not {n for n in env if "SASL" in n or "SSL" in n}


def test_every_secret_reference_is_to_a_rendered_or_named_secret(render, scenario):
    m = render(scenario)
    rendered = {s["metadata"]["name"] for s in m.all("Secret")}
    named = {"statefleet-kafka-scram", "statefleet-kafka-tls", "statefleet-admin-token", "kafka-ca"}
    named |= {"statefleet-api-tokens"}  # the retry scheduler's named tokens (replicas)
    # The cluster run's: one Secret per principal, and the broker's CA.
    named |= {f"statefleet-kafka-{n}" for n in ("admin", "tallies", "validator", "retry-scheduler", "spark", "ca")}
    for where, pod in m.pod_specs():
        for c in containers(pod):
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] in rendered | named, f"{where}: {e['name']} -> {ref['name']}"
        for v in pod.get("volumes", []):
            if "secret" in v:
                assert v["secret"]["secretName"] in rendered | named, where


@pytest.mark.parametrize("service", ["tallies", "validator", "retry-scheduler"])
def test_admin_token_from_a_secret(render, service):
    m = render()
    secret = m.get("Secret", f"{RELEASE}-statefleet-admin")
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert len(secret["data"]["token"]) >= 40
    c = m.get("StatefulSet", f"{RELEASE}-statefleet-{service}")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    assert env["STATEFLEET_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": f"{RELEASE}-statefleet-admin", "key": "token"}


def test_existing_admin_secret_is_used_and_none_is_created(render):
    m = render("sasl-tls")
    assert not m.all("Secret")
    c = m.get("StatefulSet", f"{RELEASE}-statefleet-retry-scheduler")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    assert env["STATEFLEET_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "statefleet-admin-token", "key": "bearer"}


def test_image_by_digest_and_pull_secrets(render):
    m = render("sasl-tls")
    for where, pod in m.pod_specs():
        if where.startswith("executor"):
            continue
        assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}], where
        image = pod["containers"][0]["image"]
        assert image == (
            "registry.example.com/data/statefleet@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
        ), where
    default_image = render().get("StatefulSet", f"{RELEASE}-statefleet-tallies")["spec"]["template"]["spec"]["containers"][0][
        "image"
    ]
    assert default_image == "statefleet:0.1.0"


def test_a_service_or_topic_job_that_exits_says_why_in_its_pod_status(render):
    m = render()
    workloads = [(w, pod) for w, pod in m.pod_specs() if w.startswith(("StatefulSet/", "Job/"))]
    assert len(workloads) == 4, [w for w, _ in workloads]  # three services and the topic Job
    for where, pod in workloads:
        for c in pod["containers"]:
            assert c["terminationMessagePolicy"] == "FallbackToLogsOnError", where
