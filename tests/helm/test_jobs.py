"""The topic Job and the Spark workloads."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from typing import Any

import kubernetes_validate
import yaml

from services.topics.job import parse_specs
from spark_jobs import activation_join
from tests.helm.chart import KUBE_VERSION, NAMESPACE, RELEASE, REPO, Manifest, spark_commands
from tests.support.accounts import ACCOUNT_TOPICS
from tests.support.orders import ORDER_TOPICS
from tools.kafka_acls import DEFAULT_JOBS, Acl, fleet_acls, spark_acls, spark_jobs_of

NAME = f"{RELEASE}-statefleet"


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in container.get("env", [])}


def topic_job(m: Manifest) -> dict[str, Any]:
    return m.get("Job", f"{NAME}-create-topics")


def test_topic_job_is_a_pre_install_hook(render):
    job = topic_job(render())
    ann = job["metadata"]["annotations"]
    assert set(ann["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    assert "before-hook-creation" in ann["helm.sh/hook-delete-policy"]
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["containers"][0]["args"] == ["services.topics"]
    # The chart's ServiceAccount does not exist yet when a pre-install hook runs.
    assert "serviceAccountName" not in pod


def test_topic_job_creates_every_topic_with_the_right_configs(render):
    job = topic_job(render("replicas"))
    text = env(job["spec"]["template"]["spec"]["containers"][0])["STATEFLEET_TOPIC_SPECS"]["value"]
    specs = {s.name: s for s in parse_specs(text)}  # the tool in the image accepts what the chart renders
    contract = [*ACCOUNT_TOPICS, "dead-letters", "retry", "parking-lot", "activations", "retry-tallies", "retry-validator"]
    for base in contract:
        assert f"prod.{base}" in specs, base
        assert specs[f"prod.{base}"].partitions == 12
        assert specs[f"prod.{base}"].config["min.insync.replicas"] == "2"
    assert specs["prod.program-tallies"].config["cleanup.policy"] == "compact"
    assert specs["prod.account-events"].config.get("cleanup.policy") is None
    changelogs = [n for n in specs if n.endswith("-changelog")]
    assert changelogs == [
        "prod.statefleet-tallies-memberships-changelog",
        "prod.statefleet-tallies-last-logins-changelog",
        "prod.statefleet-tallies-published-tallies-changelog",
    ]
    for name in changelogs:
        assert specs[name].config["cleanup.policy"] == "compact"


def test_a_named_domain_and_projection_reach_their_services_and_the_topic_job(render):
    """helm/statefleet/ci/orders-values.yaml: the orders example (`make up DOMAIN=orders`)."""
    m = render("orders")
    domain, projection = "examples.orders.domain:ORDERS", "examples.orders.projection:PROJECTION"
    named = {"STATEFLEET_VALIDATOR_DOMAIN", "STATEFLEET_TALLIES_PROJECTION"}
    for service, expected in (
        ("validator", {"STATEFLEET_VALIDATOR_DOMAIN": domain}),
        ("tallies", {"STATEFLEET_TALLIES_PROJECTION": projection}),
        ("retry-scheduler", {}),
    ):
        e = env(m.get("StatefulSet", f"{NAME}-{service}")["spec"]["template"]["spec"]["containers"][0])
        assert {name: e[name]["value"] for name in named & e.keys()} == expected, service
    job_env = env(topic_job(m)["spec"]["template"]["spec"]["containers"][0])
    assert job_env["STATEFLEET_VALIDATOR_DOMAIN"]["value"] == domain
    assert job_env["STATEFLEET_TALLIES_PROJECTION"]["value"] == projection
    assert json.loads(job_env["STATEFLEET_TOPIC_DEFAULT_CONFIGS"]["value"]) == {"min.insync.replicas": "2"}
    # The accounts release's Job gets none of them: its list stands as rendered.
    assert (
        not (named | {"STATEFLEET_TOPIC_DEFAULT_CONFIGS"})
        & env(topic_job(render())["spec"]["template"]["spec"]["containers"][0]).keys()
    )


def topic_grants(acls: list[Acl], operation: str) -> set[str]:
    return {a.name for a in acls if a.resource_type == "TOPIC" and a.operation == operation}


def test_the_orders_release_runs_the_spark_jobs_on_the_orders_topics(render):
    """helm/statefleet/ci/orders-values.yaml: the join, the backfill and the archive with the
    orders' arguments, and the Spark user's grants read from what the chart runs."""
    m = render("orders")
    commands = {command[0]: command[1:] for command in spark_commands(m)}
    join_args = m.get("Deployment", f"{NAME}-activation-join")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert join_args[0] == "spark_jobs.activation_join"
    spec = activation_join.spec_of(activation_join.parser().parse_args(join_args[1:]))
    assert (spec.first.topic, spec.first.kind, spec.then.topic, spec.then.kind) == (
        "order-events",
        "OrderPlaced",
        "order-events",
        "OrderShipped",
    )
    assert (spec.first.key, spec.then.key, spec.carry_names) == ("aggregate_id", "aggregate_id", ("customer_id",))
    assert commands["spark_jobs.backfill_tallies"] == ["--projection", "examples.orders.projection:PROJECTION"]
    assert commands["spark_jobs.archive_events"][:3] == ["--available-now", "--topic", "order-events"]

    acls = spark_acls("shop.", spark_jobs_of(spark_commands(m)))
    assert topic_grants(acls, "READ") == {"shop.order-events", "shop.order-shipments"}  # the join's sink reads back
    assert topic_grants(acls, "WRITE") == {"shop.order-shipments", "shop.order-tallies"}  # the backfill may publish
    assert not any("account" in a.name or "logins" in a.name for a in acls)
    # The services the release names a domain and a projection for, granted their topics too.
    named = {e["name"]: e["value"] for e in topic_job(m)["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e}
    domain, projection = named["STATEFLEET_VALIDATOR_DOMAIN"], named["STATEFLEET_TALLIES_PROJECTION"]
    fleet = fleet_acls("shop.", spark_jobs_of(spark_commands(m)), projection, domain)
    assert {"shop.order-commands", "shop.order-events", "shop.retry-tallies-orders"} <= {a.name for a in fleet}
    assert not any("account" in a.name or "logins" in a.name or "program" in a.name for a in fleet)


def test_the_default_release_grants_the_spark_user_the_accounts_topics(render):
    jobs = spark_jobs_of(spark_commands(render()))
    assert jobs.keys() == DEFAULT_JOBS.keys()
    assert spark_acls("", jobs) == spark_acls("")
    assert {"account-events", "logins", "activations"} <= topic_grants(spark_acls("", jobs), "READ")


def test_the_topic_job_of_a_named_domain_creates_its_topics(render):
    """What the Job's tool, run with the rendered Job's environment, would create."""
    job_env = env(topic_job(render("orders"))["spec"]["template"]["spec"]["containers"][0])
    literal = {name: e["value"] for name, e in job_env.items() if "value" in e and name != "HOME"}
    proc = subprocess.run(
        [sys.executable, "-m", "services.topics", "--print"],
        cwd=REPO,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO), **literal},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    specs = {s.name: s for s in parse_specs(proc.stdout)}
    fleet = ("dead-letters", "retry", "parking-lot", "activations", "retry-validator")
    assert sorted(specs) == sorted(f"shop.{name}" for name in (*ORDER_TOPICS, *fleet))
    assert all(s.partitions == 8 and s.config["min.insync.replicas"] == "2" for s in specs.values())
    compacted = {name for name, s in specs.items() if s.config.get("cleanup.policy") == "compact"}
    assert compacted == {"shop.order-tallies", *(n for n in specs if n.endswith("-changelog"))}


def test_topic_job_uses_the_kafka_credentials_too(render):
    c = topic_job(render("sasl-tls"))["spec"]["template"]["spec"]["containers"][0]
    assert env(c)["STATEFLEET_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "statefleet-kafka-scram"
    assert "STATEFLEET_KAFKA_SSL_CAFILE" in env(c)


def test_topic_job_can_be_turned_off(render):
    assert not render("minimal").all("Job")


def join_deployment(m: Manifest) -> dict[str, Any]:
    return m.get("Deployment", f"{NAME}-activation-join")


def test_local_mode_join_is_one_driver_pod_with_its_checkpoint_volume(render):
    m = render()
    dep = join_deployment(m)
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["args"] == ["spark_jobs.activation_join"]
    e = env(c)
    assert e["STATEFLEET_SPARK_MASTER"]["value"] == "local[2]"
    assert "PYSPARK_SUBMIT_ARGS" not in e
    assert e["STATEFLEET_SPARK_UI_ENABLED"]["value"] == "true", "the probes use the Spark UI port"
    assert c["livenessProbe"]["tcpSocket"]["port"] == "spark-ui"
    mounts = {mt["name"]: mt["mountPath"] for mt in c["volumeMounts"]}
    for var in ("STATEFLEET_SPARK_CHECKPOINT_DIR", "STATEFLEET_SPARK_ARCHIVE_DIR", "STATEFLEET_SPARK_BACKFILL_DIR"):
        assert e[var]["value"].startswith(mounts["spark-storage"] + "/"), var
    for var in ("STATEFLEET_SPARK_LOCAL_DIR", "STATEFLEET_SPARK_WAREHOUSE_DIR"):
        assert e[var]["value"].startswith(mounts["tmp"] + "/"), var
    claim = {v["name"]: v for v in pod["volumes"]}["spark-storage"]["persistentVolumeClaim"]["claimName"]
    pvc = m.get("PersistentVolumeClaim", claim)
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert not m.all("Role"), "local mode needs no Kubernetes API access"


def test_batch_pods_follow_the_join_driver_to_its_read_write_once_volume(render):
    pod = render().get("CronJob", f"{NAME}-backfill-tallies")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    join_labels = join_deployment(render())["spec"]["template"]["metadata"]["labels"]
    assert all(join_labels[k] == v for k, v in term["labelSelector"]["matchLabels"].items())
    shared = render("spark-operator").get("CronJob", f"{NAME}-backfill-tallies")
    assert "affinity" not in shared["spec"]["jobTemplate"]["spec"]["template"]["spec"], "ReadWriteMany: no pinning"


def test_spark_job_settings_from_values(render):
    m = render(sets=["spark.env.STATEFLEET_SPARK_SHUFFLE_PARTITIONS=16", "spark.archiveDir=hdfs://nn:8020/archive"])
    for where, pod in m.pod_specs():
        if where.startswith(("Deployment/", "CronJob/")) and not where.endswith("-console"):
            e = env(pod["containers"][0])
            assert e["STATEFLEET_SPARK_SHUFFLE_PARTITIONS"]["value"] == "16", where
            assert e["STATEFLEET_SPARK_ARCHIVE_DIR"]["value"] == "hdfs://nn:8020/archive", where


def test_spark_settings_file_is_mounted_for_every_driver(render):
    m = render()
    conf = m.get("ConfigMap", f"{NAME}-spark")["data"]["spark-defaults.conf"]
    settings = dict(line.split(" ", 1) for line in conf.strip().splitlines())
    assert settings["spark.local.dir"] == "/tmp"
    assert settings["spark.ui.port"] == "4040"
    for where, pod in m.pod_specs():
        if "activation-join" in where or "CronJob" in where:
            c = pod["containers"][0]
            assert env(c)["SPARK_CONF_DIR"]["value"] == "/etc/statefleet/spark"
            assert {mt["mountPath"] for mt in c["volumeMounts"]} >= {"/etc/statefleet/spark", "/tmp"}


def test_batch_jobs_are_cron_job_templates_with_ttl(render):
    m = render()
    modules = {}
    for cj in m.all("CronJob"):
        spec = cj["spec"]
        assert spec["suspend"] is True, "no schedule: a template to start by hand"
        assert spec["concurrencyPolicy"] == "Forbid"
        job = spec["jobTemplate"]["spec"]
        assert job["ttlSecondsAfterFinished"] == 86400
        pod = job["template"]["spec"]
        assert pod["restartPolicy"] == "Never"
        modules[cj["metadata"]["name"]] = pod["containers"][0]["args"][0]
        if "archive" in cj["metadata"]["name"]:
            assert "--available-now" in pod["containers"][0]["args"], "a scheduled archive run must end"
    assert modules == {
        f"{NAME}-backfill-tallies": "spark_jobs.backfill_tallies",
        f"{NAME}-archive-events": "spark_jobs.archive_events",
        f"{NAME}-replay-dead-letters": "spark_jobs.replay_dead_letters",
    }


def test_scheduled_batch_jobs_run_on_their_schedule(render):
    m = render("spark-operator")
    cj = m.get("CronJob", f"{NAME}-archive-events")
    assert cj["spec"]["schedule"] == "0 3 * * 0"
    assert cj["spec"]["suspend"] is False
    pod = cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["args"] == ["spark_jobs.archive_events", "--available-now"]
    assert not m.has("CronJob", f"{NAME}-replay-dead-letters")


def test_spark_operator_mode_renders_a_spark_application(render):
    m = render("spark-operator")
    assert [d["metadata"]["name"] for d in m.all("Deployment")] == [f"{NAME}-console"], "no driver Deployment"
    app = m.get("SparkApplication", f"{NAME}-activation-join")
    assert app["apiVersion"] == "sparkoperator.k8s.io/v1beta2"
    spec = app["spec"]
    assert spec["type"] == "Python"
    assert spec["mainApplicationFile"] == "local:///opt/statefleet/bin/entrypoint.py"
    assert spec["arguments"][0] == "spark_jobs.activation_join"
    assert spec["restartPolicy"]["type"] == "Always"
    assert spec["executor"]["instances"] == 3
    sa = spec["driver"]["serviceAccount"]
    binding = m.get("RoleBinding", sa)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]
    for side in ("driver", "executor"):
        assert spec[side]["securityContext"]["readOnlyRootFilesystem"] is True
        assert spec[side]["podSecurityContext"]["runAsNonRoot"] is True
        mounts = {mt["name"]: mt["mountPath"] for mt in spec[side]["volumeMounts"]}
        assert mounts["spark-storage"] == "/var/lib/statefleet-spark"
        e = env(spec[side])
        assert e["STATEFLEET_SPARK_CHECKPOINT_DIR"]["value"] == "/var/lib/statefleet-spark/checkpoints"
    claim = {v["name"]: v for v in spec["volumes"]}["spark-storage"]["persistentVolumeClaim"]["claimName"]
    assert m.get("PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadWriteMany"]
    # Under spark-submit the baked connector jars are put on the classpath of driver and executors.
    assert spec["sparkConf"]["spark.driver.extraClassPath"] == "/opt/statefleet/jars/*"
    assert spec["sparkConf"]["spark.executor.extraClassPath"] == "/opt/statefleet/jars/*"
    assert "STATEFLEET_SPARK_MASTER" not in env(spec["driver"]), "spark-submit gives the master"


def test_cluster_mode_driver_starts_executor_pods_it_may_create(render):
    m = render("spark-cluster")
    pod = join_deployment(m)["spec"]["template"]["spec"]
    c = pod["containers"][0]
    e = env(c)
    assert e["STATEFLEET_SPARK_MASTER"]["value"] == "k8s://https://kubernetes.default.svc:443"
    submit = shlex.split(e["PYSPARK_SUBMIT_ARGS"]["value"])
    assert submit[-1] == "pyspark-shell"
    confs = dict(submit[i + 1].split("=", 1) for i, a in enumerate(submit) if a == "--conf")
    assert confs["spark.driver.host"] == "$(POD_IP)"
    assert confs["spark.kubernetes.driver.pod.name"] == "$(POD_NAME)"
    pvc = "spark.kubernetes.executor.volumes.persistentVolumeClaim.spark-storage"
    assert confs[f"{pvc}.options.claimName"] == "statefleet-spark-shared"
    assert confs[f"{pvc}.mount.path"] == "/var/lib/statefleet-spark"
    names = [x["name"] for x in c["env"]]
    assert names.index("POD_IP") < names.index("PYSPARK_SUBMIT_ARGS")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["driver-rpc"] == 7078 and ports["blockmanager"] == 7079

    role = m.get("Role", pod["serviceAccountName"])
    (rule,) = role["rules"]
    assert "pods" in rule["resources"] and "create" in rule["verbs"] and "delete" in rule["verbs"]
    assert m.get("RoleBinding", pod["serviceAccountName"])["roleRef"]["name"] == role["metadata"]["name"]

    conf = m.get("ConfigMap", f"{NAME}-spark")["data"]
    settings = dict(line.split(" ", 1) for line in conf["spark-defaults.conf"].strip().splitlines())
    assert settings["spark.kubernetes.namespace"] == NAMESPACE
    assert settings["spark.kubernetes.container.image"] == "statefleet:0.1.0"
    assert settings["spark.kubernetes.executor.podTemplateFile"] == "/etc/statefleet/spark/executor-pod-template.yaml"
    assert settings["spark.executor.instances"] == "4"


def test_executor_pod_template_is_a_valid_locked_down_pod(render):
    conf = render("spark-cluster").get("ConfigMap", f"{NAME}-spark")["data"]
    pod = yaml.safe_load(conf["executor-pod-template.yaml"])
    pod["metadata"]["name"] = "executor"
    kubernetes_validate.validate(pod, KUBE_VERSION, strict=True)
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    (c,) = spec["containers"]
    assert c["name"] == "spark-executor"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert {mt["mountPath"] for mt in c["volumeMounts"]} == {"/tmp", "/etc/statefleet/kafka-tls"}
    assert env(c)["STATEFLEET_KAFKA_SSL_CAFILE"]["value"] == "/etc/statefleet/kafka-tls/ca.crt"
    assert env(c)["STATEFLEET_SPARK_CHECKPOINT_DIR"]["value"] == "/var/lib/statefleet-spark/checkpoints"


def test_topic_specs_are_plain_json(render):
    text = env(topic_job(render())["spec"]["template"]["spec"]["containers"][0])["STATEFLEET_TOPIC_SPECS"]["value"]
    assert isinstance(json.loads(text), list)
