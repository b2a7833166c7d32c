"""The Helm chart in a real Kubernetes cluster (``make kube-check``, part of ``make test``).

One release, in one namespace, through its life: installed with the image `make image`
built; traffic through the Services; a tallies pod killed with ``--force``; every
StatefulSet rolled by ``helm upgrade``; tallies scaled 2 → 3 → 2; a Spark CronJob run by
hand; uninstalled. The tests run in file order and share the release; each records what it
measured in ``.local/kube-check-results.json`` (docs/kubernetes.md quotes the figures).

Kafka is the cluster's secure broker (`make cluster-up`): SASL_SSL only, with ACLs. Each
service and the Spark jobs connect as a principal of their own, with credentials from the
Secrets `helm/statefleet/ci/cluster-values.yaml` names, which the ``ns`` fixture creates from
the broker's credentials; the test's own Kafka clients connect as the admin.
"""

from __future__ import annotations

import ast
import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.kube.cluster import (
    CHART,
    RELEASE,
    RESULTS,
    VALUES,
    Namespace,
    Reader,
    apply,
    cluster_reachable,
    helm,
    is_ready,
    kubectl,
    kubectl_json,
    record,
    restarts,
)
from tests.support.accounts import create_command
from tests.support.environment import new_topic_prefix
from tests.support.kafka import produce, read_all
from tests.support.services import wait_for
from tools import kafka_broker, web

pytestmark = pytest.mark.kube

PROGRAMS = [f"prog-k{n}" for n in range(4)]
SERVICES = ("tallies", "validator", "retry-scheduler")
#: The engine's line for each restore (shared/engine/_restore.py).
RESTORE_LOGGED = r"restored (\d+) records from the changelog in [\d.]+ s \((\d+) of (\d+) partitions had local state\)"


@pytest.fixture(scope="module")
def prefix() -> str:
    return new_topic_prefix("k")


#: The cluster values' Kafka Secrets (helm/statefleet/ci/cluster-values.yaml) and the broker user each holds.
KAFKA_SECRETS = {
    "statefleet-kafka-admin": kafka_broker.ADMIN_USER,
    "statefleet-kafka-tallies": "tallies",
    "statefleet-kafka-validator": "validator",
    "statefleet-kafka-retry-scheduler": "retry_scheduler",
    "statefleet-kafka-spark": "spark",
}
KAFKA_CA_SECRET = "statefleet-kafka-ca"


def secret(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": "Opaque", "stringData": data}


@pytest.fixture(scope="module")
def broker() -> kafka_broker.BrokerLayout:
    """The cluster's broker (make cluster-up starts it; mk/kube.mk gives its address)."""
    layout = kafka_broker.secure_layout()
    if not kafka_broker.is_ready(layout):
        pytest.fail(f"the cluster's secure broker does not answer on {layout.bootstrap}: start it with `make cluster-up`")
    return layout


@pytest.fixture(scope="module")
def kafka(broker: kafka_broker.BrokerLayout) -> dict[str, Any]:
    """The test's own Kafka connection: the admin, above ACLs."""
    return kafka_broker.admin_kwargs(broker)


@pytest.fixture(scope="module")
def ns(prefix: str, broker: kafka_broker.BrokerLayout) -> Iterator[Namespace]:
    reason = cluster_reachable()
    if reason is not None:
        pytest.fail(reason)
    namespace = Namespace(f"statefleet-{prefix.rstrip('.')}")
    RESULTS.unlink(missing_ok=True)  # this run's figures only
    # What a Kafka administrator hands the release: a principal per workload with its ACLs
    # for this fleet's topic prefix, its credentials in a Secret each, and the CA.
    kafka_broker.grant(broker, prefix)
    passwords = kafka_broker.credentials(broker)
    kubectl("create", "namespace", namespace.name)
    apply(
        namespace.name,
        *(secret(name, {"username": user, "password": passwords[user]}) for name, user in KAFKA_SECRETS.items()),
        secret(KAFKA_CA_SECRET, {"ca.crt": broker.ca_file.read_text()}),
    )
    yield namespace
    # Whatever a failed test left: the release, then the namespace with its claims.
    helm("uninstall", RELEASE, "-n", namespace.name, "--wait", check=False, timeout=300)
    kubectl("delete", "namespace", namespace.name, "--wait=true", "--timeout=180s", check=False, timeout=240)
    from tools.kube_cluster import _node

    _node.release_volumes(_node.default_home())


@pytest.fixture(scope="module")
def expected() -> dict[str, int]:
    """Accounts created per program so far (each test that creates some adds them)."""
    return {p: 0 for p in PROGRAMS}


def install_args(ns: Namespace, prefix: str) -> list[str]:
    return [RELEASE, str(CHART), "-n", ns.name, "-f", str(VALUES), "--set", f"topics.prefix={prefix}"]


def wait_all_ready(ns: Namespace, timeout: float = 600) -> list[dict[str, Any]]:
    def ready() -> list[dict[str, Any]] | None:
        pods = [p for p in ns.pods(f"app.kubernetes.io/instance={RELEASE}") if p["status"].get("phase") != "Succeeded"]
        return pods if pods and all(is_ready(p) for p in pods) else None

    pods: list[dict[str, Any]] = wait_for(ready, timeout=timeout, interval=1, message="every pod of the release Ready")
    return pods


def create_accounts(ns: Namespace, count: int, expected: dict[str, int], tag: str) -> None:
    url = ns.service_url("validator") + "/commands"
    with httpx.Client(timeout=30) as client:
        for n in range(count):
            program = PROGRAMS[n % len(PROGRAMS)]
            account = f"acct-{tag}-{n}-{uuid.uuid4().hex[:6]}"
            body = create_command(account, program, f"{account}-create", 1_704_067_200_000 + n * 1000, account)
            response = client.post(url, json=body, params={"wait": "true"})
            assert response.status_code == 200, response.text
            assert response.json()["status"] == "accepted", response.json()
            expected[program] += 1


def tallies_exact(ns: Namespace, expected: dict[str, int], timeout: float = 120) -> None:
    url = ns.service_url("tallies")

    def exact() -> dict[str, Any] | None:
        answers = {}
        for program, count in expected.items():
            response = web.get(f"{url}/tallies/{program}", timeout=10)
            if response.status_code != 200 or response.json().get("numberActive") != count:
                return None
            answers[program] = response.json()
        return answers

    wait_for(exact, timeout=timeout, interval=1, message=f"tallies {expected}")


def tally_urls(ns: Namespace) -> list[str]:
    url = ns.service_url("tallies")
    return [f"{url}/tallies/{p}" for p in PROGRAMS]


# -- install ---------------------------------------------------------------------------------


def test_install_brings_every_pod_ready_and_helm_test_passes(ns: Namespace, prefix: str, kafka: dict[str, Any]) -> None:
    started = time.monotonic()
    helm("install", *install_args(ns, prefix), "--create-namespace", "--wait", "--wait-for-jobs", "--timeout", "8m")
    installed_s = time.monotonic() - started
    pods = wait_all_ready(ns)
    names = sorted(p["metadata"]["name"] for p in pods)
    for service in SERVICES:
        assert f"{RELEASE}-{service}-0" in names and f"{RELEASE}-{service}-1" in names, names
    assert f"{RELEASE}-console" in " ".join(names), names
    # The topic Job (a pre-install hook, deleted once it succeeded) created every topic.
    for topic in ("account-commands", "account-events", "dead-letters", "retry", "parking-lot", "program-tallies"):
        assert read_all(prefix + topic, connection=kafka) is not None
    # Every claim is bound to one of the cluster's volumes.
    claims = kubectl_json("-n", ns.name, "get", "pvc")["items"]
    assert claims and all(c["status"]["phase"] == "Bound" for c in claims), [c["status"] for c in claims]
    # The test pod is deleted when it succeeds and kept for its logs when it fails.
    tested = helm("test", RELEASE, "-n", ns.name, "--timeout", "5m", check=False)
    logs = kubectl("-n", ns.name, "logs", f"{RELEASE}-test", check=False).stdout
    assert tested.returncode == 0, f"helm test failed:\n{tested.stdout}\n{tested.stderr}\n{logs}"
    assert "Phase:          Succeeded" in tested.stdout, tested.stdout
    record("install", seconds=round(installed_s, 1), pods=len(pods))


# -- credentials -----------------------------------------------------------------------------


def test_every_workload_connects_over_sasl_ssl_as_its_own_principal(ns: Namespace) -> None:
    workloads = {f"statefulset/{RELEASE}-{s}": f"statefleet-kafka-{s}" for s in SERVICES}
    workloads[f"cronjob/{RELEASE}-backfill-tallies"] = "statefleet-kafka-spark"
    for workload, expected in workloads.items():
        obj = kubectl_json("-n", ns.name, "get", workload)
        spec = obj["spec"]["jobTemplate"]["spec"] if obj["kind"] == "CronJob" else obj["spec"]
        env = {e["name"]: e for e in spec["template"]["spec"]["containers"][0]["env"]}
        assert env["STATEFLEET_KAFKA_SECURITY_PROTOCOL"]["value"] == "SASL_SSL", workload
        for name in ("STATEFLEET_KAFKA_SASL_USERNAME", "STATEFLEET_KAFKA_SASL_PASSWORD"):
            assert env[name]["valueFrom"]["secretKeyRef"]["name"] == expected, (workload, name)
        assert env["STATEFLEET_KAFKA_SSL_CAFILE"]["value"].endswith("/ca.crt"), workload


def start_tallies_pod_with(ns: Namespace, name: str, kafka_secret: str) -> None:
    """A pod like a tallies pod, outside its StatefulSet and Services, connecting with ``kafka_secret``."""
    template = ns.statefulset(f"{RELEASE}-tallies")["spec"]["template"]
    spec = template["spec"]
    container = spec["containers"][0]
    for env in container["env"]:
        ref = env.get("valueFrom", {}).get("secretKeyRef")
        if ref and ref["name"] == "statefleet-kafka-tallies":
            ref["name"] = kafka_secret
    for key in ("startupProbe", "livenessProbe", "readinessProbe", "lifecycle"):
        container.pop(key, None)
    spec["restartPolicy"] = "Never"
    spec["volumes"] = [*spec.get("volumes", []), {"name": "data", "emptyDir": {}}]  # not the StatefulSet's claims
    apply(
        ns.name,
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"check": "kafka-credentials"}}, "spec": spec},
    )


def exit_of(ns: Namespace, name: str, timeout: float = 180) -> dict[str, Any]:
    def terminated() -> dict[str, Any] | None:
        pod = ns.pod(name)
        statuses = (pod or {}).get("status", {}).get("containerStatuses", [])
        state: dict[str, Any] | None = statuses[0]["state"].get("terminated") if statuses else None
        return state

    state: dict[str, Any] = wait_for(terminated, timeout=timeout, interval=1, message=f"{name} to exit")
    return state


def test_a_wrong_password_or_a_missing_acl_stops_a_pod_with_the_reason_in_its_status(ns: Namespace) -> None:
    """No silent hang, no restart without a reason: the container exits at start-up, and its
    last log lines become the pod's termination message (what `kubectl describe pod` shows)."""
    passwords = kafka_broker.credentials(kafka_broker.secure_layout())
    apply(ns.name, secret("kafka-wrong-password", {"username": "tallies", "password": "not-" + passwords["tallies"]}))
    start_tallies_pod_with(ns, "tallies-wrong-password", "kafka-wrong-password")
    # The validator's principal has no ACL on logins, one of the tallies' inputs.
    start_tallies_pod_with(ns, "tallies-as-validator", "statefleet-kafka-validator")
    try:
        wrong = exit_of(ns, "tallies-wrong-password")
        assert wrong["exitCode"] != 0, wrong
        assert "tallies cannot start: SASL authentication failed for user 'tallies'" in wrong.get("message", ""), wrong
        denied = exit_of(ns, "tallies-as-validator")
        assert denied["exitCode"] != 0, denied
        message = denied.get("message", "")
        assert "tallies cannot start: user 'validator' is not authorized" in message, denied
        assert "grant User:validator" in message, denied  # and it says what to grant
        record("credentials", wrong_password_exit_s=seconds_running(wrong), missing_acl_exit_s=seconds_running(denied))
    finally:
        kubectl("-n", ns.name, "delete", "pod", "-l", "check=kafka-credentials", "--wait=false", check=False)
        kubectl("-n", ns.name, "delete", "secret", "kafka-wrong-password", check=False)


def seconds_running(terminated: dict[str, Any]) -> float:
    started, finished = (datetime.fromisoformat(terminated[k].replace("Z", "+00:00")) for k in ("startedAt", "finishedAt"))
    return (finished - started).total_seconds()


# -- traffic ---------------------------------------------------------------------------------


PROBE = """
import json, socket, sys
def tcp(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "open"
    except OSError as error:
        return type(error).__name__
def name(host):
    try:
        return socket.gethostbyname(host)
    except OSError as error:
        return type(error).__name__
print(json.dumps({"broker": tcp("198.18.0.1", 9096), "gateway": tcp(sys.argv[1], 443),
                  "public": tcp("192.0.2.10", 80), "service": name(sys.argv[2]), "outside_name": name("example.com")}))
"""


def test_pods_reach_the_broker_and_services_and_nothing_beyond_this_machine(ns: Namespace) -> None:
    from tools.kube_cluster import _network

    assert _network.guard_problems() == []
    gateway = next((line.split()[2] for line in os.popen("ip route show default").read().splitlines()), "192.0.2.1")
    drops_before = _network.guard_drops()
    probe = kubectl(
        "-n", ns.name, "run", "network-probe", "--image", "statefleet:0.1.0", "--restart=Never", "--rm", "-i", "--quiet",
        "--command", "--", "python", "-c", PROBE, gateway, f"{RELEASE}-tallies",
        timeout=120,
    )  # fmt: skip
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    assert seen["broker"] == "open", seen
    assert seen["service"].startswith("198.19."), seen
    assert seen["gateway"] != "open" and seen["public"] != "open", seen
    assert seen["outside_name"] == "gaierror", seen  # CoreDNS has no upstream
    assert _network.guard_drops() > drops_before, "the guard dropped nothing: what stopped the packets?"


def test_commands_through_the_validator_give_exact_tallies(ns: Namespace, expected: dict[str, int]) -> None:
    create_accounts(ns, 24, expected, "a")
    tallies_exact(ns, expected)


def test_a_poison_message_is_parked_and_replayed_through_the_retry_scheduler(
    ns: Namespace, prefix: str, kafka: dict[str, Any]
) -> None:
    produce(prefix + "account-commands", [(b"acct-poison", b"not json")], connection=kafka)
    url = ns.service_url("retry-scheduler")

    def parked() -> list[dict[str, Any]]:
        response = web.get(url + "/parked", timeout=10)
        items: list[dict[str, Any]] = response.json()["items"] if response.status_code == 200 else []
        return [i for i in items if i["key"] == "acct-poison"]

    (item,) = wait_for(parked, timeout=90, message="the poison command among the parked messages")
    assert item["error_class"] == "DecodeError", item
    token_b64 = kubectl_json("-n", ns.name, "get", "secret", f"{RELEASE}-admin")["data"]["token"]
    token = __import__("base64").b64decode(token_b64).decode()
    replayed = web.post(f"{url}/parked/{item['id']}/replay", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert replayed.status_code in (200, 202), replayed.text

    # Replayed: it goes back through its retry topic to the validator, fails to decode
    # again and is parked again (a DecodeError is never retried).
    def parked_again() -> dict[str, Any] | None:
        again = [i for i in parked() if i["parked_at"] > item["parked_at"]]
        return again[0] if again else None

    wait_for(parked_again, timeout=90, message="the replayed poison command parked again")
    retried = [r for r in read_all(prefix + "retry-validator", connection=kafka) if r.key == b"acct-poison"]
    assert retried, "the replay sent nothing to the validator's retry topic"


def test_console_answers_and_lists_every_service(ns: Namespace) -> None:
    url = ns.service_url("console")

    def listed() -> str | None:
        response = web.get(url + "/fleet.json", timeout=10)
        text = response.text
        return text if response.status_code == 200 and all(s.replace("-", "_") in text or s in text for s in SERVICES) else None

    wait_for(listed, timeout=60, message="the console's fleet listing every service")
    assert web.get(url + "/fleet", timeout=10).status_code == 200


# -- kills -----------------------------------------------------------------------------------


def volume_of(ns: Namespace, claim: str) -> str:
    pvc = kubectl_json("-n", ns.name, "get", "pvc", claim)
    pv = kubectl_json("get", "pv", pvc["spec"]["volumeName"])
    return str(pv["spec"]["hostPath"]["path"])


def test_a_force_deleted_tallies_pod_comes_back_on_its_volume(ns: Namespace, expected: dict[str, int]) -> None:
    pod_name = f"{RELEASE}-tallies-0"
    old = ns.pod(pod_name)
    assert old is not None and is_ready(old)
    volume = Path(volume_of(ns, f"data-{pod_name}"))
    tables_before = {p.relative_to(volume) for p in volume.rglob("*.sst")} | {
        p.relative_to(volume) for p in volume.rglob("CURRENT")
    }
    assert tables_before, f"no RocksDB files on {volume}"
    with Reader(tally_urls(ns)) as reader:
        time.sleep(2)
        killed = time.monotonic()
        kubectl("-n", ns.name, "delete", "pod", pod_name, "--grace-period=0", "--force", "--wait=false")

        def back() -> dict[str, Any] | None:
            pod = ns.pod(pod_name)
            return pod if pod and pod["metadata"]["uid"] != old["metadata"]["uid"] and is_ready(pod) else None

        new = wait_for(back, timeout=300, interval=0.5, message=f"{pod_name} replaced and Ready")
        back_s = time.monotonic() - killed
        time.sleep(3)
    # The same claim, the same volume: the RocksDB files written before the kill are there.
    assert new["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == f"data-{pod_name}" or any(
        v.get("persistentVolumeClaim", {}).get("claimName") == f"data-{pod_name}" for v in new["spec"]["volumes"]
    )
    assert Path(volume_of(ns, f"data-{pod_name}")) == volume
    tables_after = {p.relative_to(volume) for p in volume.rglob("*.sst")} | {
        p.relative_to(volume) for p in volume.rglob("CURRENT")
    }
    kept = tables_before & tables_after
    assert kept, f"none of the RocksDB files of before the kill is left on {volume}"
    # A replacement that met the old container's lock said so and restarted; never a silent loop.
    if restarts(new) > 0:
        previous = ns.logs(pod_name, previous=True)
        assert "is in use by another process" in previous or "waiting for" in previous, previous[-2000:]
    assert restarts(new) <= 2, f"{pod_name} restarted {restarts(new)} times"
    log = ns.logs(pod_name)
    # The engine logs each restore: how many records it read from the changelog, and how
    # many partitions it found on the volume. Every partition the new pod took over was on
    # its volume (two instances with one standby each hold every partition).
    restores = re.findall(
        r"restored (\d+) records from the changelog in [\d.]+ s \((\d+) of (\d+) partitions had local state\)", log
    )
    assert restores, f"no restore logged by the new {pod_name}:\n{log[-3000:]}"
    restored, local, assigned = (int(n) for n in restores[0])
    assert assigned > 0 and local == assigned, restores
    tallies_exact(ns, expected)
    record(
        "kill",
        back_ready_s=round(back_s, 1),
        reads=reader.total,
        failed_reads=reader.failed,
        restarts=restarts(new),
        restored_from_changelog=restored,
        partitions_local=f"{local} of {assigned}",
        rocksdb_files_kept=len(kept),
        waited_for_lock="waiting for" in log,
    )
    print(reader.summary())


# -- upgrade ---------------------------------------------------------------------------------


def test_helm_upgrade_rolls_every_statefulset_one_pod_at_a_time(ns: Namespace, prefix: str, expected: dict[str, int]) -> None:
    statefulsets = [f"{RELEASE}-{s}" for s in SERVICES]
    revisions = {name: ns.statefulset(name)["status"].get("updateRevision") for name in statefulsets}
    most_unready = {name: 0 for name in statefulsets}
    stop = __import__("threading").Event()

    def watch() -> None:
        while not stop.is_set():
            for name in statefulsets:
                pods = ns.pods(
                    f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={name.removeprefix(RELEASE + '-')}"
                )
                unready = sum(1 for p in pods if not is_ready(p)) + max(0, 2 - len(pods))
                most_unready[name] = max(most_unready[name], unready)
            time.sleep(0.5)

    watcher = __import__("threading").Thread(target=watch, daemon=True)
    with Reader(tally_urls(ns)) as reader:
        watcher.start()
        started = time.monotonic()
        helm("upgrade", *install_args(ns, prefix), "--reuse-values", "--set", "logLevel=DEBUG", "--wait", "--timeout", "15m")
        for name in statefulsets:
            kubectl("-n", ns.name, "rollout", "status", f"statefulset/{name}", "--timeout=600s", timeout=660)
        upgrade_s = time.monotonic() - started
        stop.set()
        watcher.join(10)
    for name in statefulsets:
        status = ns.statefulset(name)["status"]
        assert status["updateRevision"] != revisions[name], f"{name} was not rolled"
        assert status.get("updatedReplicas") == 2 and status.get("readyReplicas") == 2, status
        assert most_unready[name] <= 1, f"{name} had {most_unready[name]} pods unready at once"
    wait_all_ready(ns)
    create_accounts(ns, 8, expected, "u")
    tallies_exact(ns, expected)
    record("upgrade", seconds=round(upgrade_s, 1), reads=reader.total, failed_reads=reader.failed, most_unready=most_unready)
    print(reader.summary())


# -- scale -----------------------------------------------------------------------------------


def test_tallies_scale_up_and_down_with_keys_answerable(ns: Namespace, expected: dict[str, int]) -> None:
    name = f"{RELEASE}-tallies"
    figures = {}
    with Reader(tally_urls(ns)) as reader:
        for replicas in (3, 2):
            started = time.monotonic()
            kubectl("-n", ns.name, "scale", f"statefulset/{name}", f"--replicas={replicas}")

            def settled(replicas: int = replicas) -> bool:
                status = ns.statefulset(name)["status"]
                pods = ns.pods(f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=tallies")
                return status.get("readyReplicas") == replicas and len(pods) == replicas and all(is_ready(p) for p in pods)

            wait_for(settled, timeout=300, interval=1, message=f"{name} at {replicas} ready replicas")
            tallies_exact(ns, expected)
            figures[f"to_{replicas}_s"] = round(time.monotonic() - started, 1)
    create_accounts(ns, 8, expected, "s")
    tallies_exact(ns, expected)
    record("scale", reads=reader.total, failed_reads=reader.failed, **figures)
    assert reader.failed <= reader.total * 0.05, reader.summary()


# -- metrics ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SparkRun:
    job: str
    started: float


@pytest.fixture(scope="module")
def backfill_by_hand(ns: Namespace) -> SparkRun:
    """A run of the backfill CronJob, created by hand as docs/kubernetes.md shows. The
    Prometheus test asks for it first, so that the job (about 45 s, most of it the JVM's
    and Spark's start) runs while Prometheus waits for its scrapes; the Spark test checks
    how it ended."""
    job = f"backfill-by-hand-{uuid.uuid4().hex[:5]}"
    kubectl("-n", ns.name, "create", "job", f"--from=cronjob/{RELEASE}-backfill-tallies", job)
    return SparkRun(job, time.monotonic())


def test_prometheus_scrapes_every_service_pod_and_each_dashboard_panel_has_series(
    ns: Namespace, tmp_path: Path, backfill_by_hand: SparkRun
) -> None:
    """Prometheus with the chart's documented scrape job (kubernetes_sd_configs on
    this cluster's API server) and its rules; then every query of the chart's Grafana
    dashboard, as Grafana would send it."""
    import subprocess

    from tests.kube.cluster import KUBECONFIG
    from tests.support.services import free_port
    from tools.kube_cluster import _build

    # Built with the cluster (Debian's prometheus 2.42 has no Kubernetes service discovery).
    prometheus = str(_build.binary("prometheus"))
    scrape = yaml.safe_load((CHART / "prometheus" / "kubernetes-scrape.yaml").read_text())
    job = scrape["scrape_configs"][0]
    job["scrape_interval"] = "2s"
    job["kubernetes_sd_configs"][0]["kubeconfig_file"] = KUBECONFIG
    job["kubernetes_sd_configs"][0]["namespaces"] = {"names": [ns.name]}
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"evaluation_interval": "2s"},
                "rule_files": [str(CHART / "prometheus" / "rules.yaml")],
                "scrape_configs": [job],
            }
        )
    )
    port = free_port()
    api = f"http://127.0.0.1:{port}/api/v1"
    log = (tmp_path / "prometheus.log").open("w")
    server = subprocess.Popen(
        [
            prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        pods = [
            p["metadata"]["name"]
            for p in ns.pods(f"app.kubernetes.io/instance={RELEASE}")
            if p["metadata"]["name"].rsplit("-", 1)[-1].isdigit()
        ]

        def all_up() -> list[dict[str, Any]] | None:
            try:
                targets = web.get(f"{api}/targets", timeout=5).json()["data"]["activeTargets"]
            except (httpx.HTTPError, ValueError, KeyError):
                return None
            up = [t for t in targets if t["health"] == "up"]
            return up if sorted(t["labels"]["pod"] for t in up) == sorted(pods) else None

        targets = wait_for(all_up, timeout=90, interval=1, message=f"Prometheus scraping every service pod {pods}")
        time.sleep(8)  # a few scrapes, so that rate() and increase() have two samples
        dashboard = json.loads((CHART / "dashboards" / "statefleet.json").read_text())
        empty = []
        queried = 0
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"].replace("$__rate_interval", "1m").replace('=~"$service"', '=~".*"')
                answer = web.get(f"{api}/query", params={"query": expr}, timeout=10).json()
                assert answer["status"] == "success", (panel["title"], expr, answer)
                queried += 1
                if not answer["data"]["result"]:
                    empty.append(f"{panel['title']}: {expr}")
        assert not empty, "dashboard queries with no series:\n" + "\n".join(empty)
        rules = web.get(f"{api}/rules", timeout=10).json()["data"]["groups"]
        unhealthy = [r["name"] for g in rules for r in g["rules"] if r.get("health") not in ("ok", "unknown")]
        assert rules and not unhealthy, unhealthy
        record("prometheus", targets=len(targets), panel_queries=queried)
    finally:
        server.terminate()
        server.wait(30)
        log.close()


# -- Spark -----------------------------------------------------------------------------------


def test_a_spark_cronjob_run_by_hand_completes(ns: Namespace, prefix: str, backfill_by_hand: SparkRun) -> None:
    job = backfill_by_hand.job
    done = kubectl("-n", ns.name, "wait", f"job/{job}", "--for=condition=complete", "--timeout=900s", timeout=960, check=False)
    logs = kubectl("-n", ns.name, "logs", f"job/{job}", check=False).stdout
    assert done.returncode == 0, f"{job} did not complete: {done.stderr}\n{logs}"
    # The connector jars are baked into the image: nothing was resolved at run time.
    assert ":: resolving dependencies ::" not in logs, logs
    # It read the events over SASL_SSL as the `spark` principal (the test above checks its Secret).
    read = re.search(rf"reading {re.escape(prefix)}account-events offsets (\{{.*\}})", logs)
    assert read, logs
    assert any(end > 0 for _, end in ast.literal_eval(read.group(1)).values()), read.group(0)
    record("spark", job=f"{RELEASE}-backfill-tallies", seconds=round(time.monotonic() - backfill_by_hand.started, 1))


# -- uninstall -------------------------------------------------------------------------------


def test_uninstall_leaves_only_the_kept_claims(ns: Namespace) -> None:
    helm("uninstall", RELEASE, "-n", ns.name, "--wait", "--timeout", "5m")

    def left() -> list[str] | None:
        kinds = "all,configmap,secret,serviceaccount,role,rolebinding,poddisruptionbudget,networkpolicy,pvc,cronjob"
        names = kubectl("-n", ns.name, "get", kinds, "-o", "name").stdout.split()
        names = [n for n in names if n not in ("configmap/kube-root-ca.crt", "serviceaccount/default")]
        return names if not any(n.startswith(("pod/", "statefulset", "service/")) for n in names) else None

    remaining = wait_for(left, timeout=180, interval=1, message="the release's objects gone")
    kept_claims = {n for n in remaining if n.startswith("persistentvolumeclaim/")}
    others = set(remaining) - kept_claims
    # docs/kubernetes.md: the StatefulSets' data claims and the Spark storage claim are kept,
    # and so is the admin token's Secret (helm.sh/resource-policy: keep). The Kafka Secrets
    # were never the release's: the fixture made them, as an administrator would.
    assert others <= {f"secret/{RELEASE}-admin", *(f"secret/{n}" for n in (*KAFKA_SECRETS, KAFKA_CA_SECRET))}, others
    data_claims = {f"persistentvolumeclaim/data-{RELEASE}-{s}-{i}" for s in SERVICES for i in (0, 1)}
    assert data_claims <= kept_claims, kept_claims
    record("uninstall", kept=sorted(remaining))


def test_results_are_recorded() -> None:
    results = json.loads(RESULTS.read_text())
    assert {"install", "credentials", "kill", "upgrade", "scale", "prometheus", "spark", "uninstall"} <= set(results), results
