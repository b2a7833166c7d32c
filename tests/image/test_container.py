"""The built image, run as the Helm chart runs it (``make image-check``): the topic Job,
every service and the console answer and process records on the real broker, and the
Spark activation join runs ``--available-now`` inside the image with its baked-in
connector jars.

Every container runs with the image's own entrypoint and user (10001), a read-only root
file system, /tmp and the data volume as the only writable paths, and all capabilities
dropped (see ``tests/image/container.py``). The containers share one topic prefix of
this run's own.
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.image.container import IMAGE, USER, Container, inspect_image, podman
from tests.support.accounts import create_command
from tests.support.environment import new_topic_prefix, settings_env
from tests.support.kafka import produce, read_all
from tests.support.services import free_port, wait_for
from tools import web

pytestmark = pytest.mark.image

PARTITIONS = 2
# What the chart's topic Job creates (values.yaml topics.create), on this run's prefix.
TOPICS = {
    "account-commands": {},
    "account-command-batches": {},
    "account-events": {},
    "account-rejections": {},
    "logins": {},
    "program-tallies": {"cleanup.policy": "compact"},
    "dead-letters": {},
    "retry": {},
    "parking-lot": {},
    "activations": {},
    "retry-tallies": {},
    "retry-validator": {},
}
SERVICES = ("validator", "tallies", "retry_scheduler")


@pytest.fixture(scope="module")
def run_prefix() -> str:
    return new_topic_prefix("img")


@pytest.fixture(scope="module")
def kafka_env(kafka_bootstrap: str, run_prefix: str) -> dict[str, str]:
    """What the chart gives every container (statefleet.kafkaEnv), for this broker and prefix."""
    return {
        **settings_env(
            kafka_bootstrap_servers=kafka_bootstrap,
            topic_prefix=run_prefix,
            topic_partitions=PARTITIONS,
            topic_replication_factor=1,
            log_level="INFO",
        ),
        "HOME": "/tmp",
    }


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("image-check")


@pytest.fixture(scope="module")
def containers(run_prefix: str) -> Iterator[list[Container]]:
    started: list[Container] = []
    yield started
    for container in started:
        container.remove()


def name(prefix: str, what: str) -> str:
    return f"sf-check-{prefix.rstrip('.')}-{what.replace('_', '-')}"


def test_image_runs_as_the_charts_user_with_only_what_it_runs() -> None:
    config = inspect_image()["Config"]
    assert config["User"] == USER
    assert config["Entrypoint"] == ["/usr/bin/tini", "--", "python", "/opt/statefleet/bin/entrypoint.py"]
    # What is inside, seen by the image's python (one container: each one costs a copy of the image with vfs).
    probe = (
        "import importlib.util as u, json, os, shutil\n"
        "modules = ('pytest', 'mypy', 'ruff', 'playwright', 'hypothesis', 'schemathesis', 'pip', 'setuptools', "
        "'faust', 'rocksdict', 'fastapi', 'pyspark', 'pyarrow', 'pandas', 'services', 'spark_jobs', 'tools', 'tests')\n"
        "print(json.dumps({'modules': sorted(m for m in modules if u.find_spec(m)),"
        " 'app': sorted(os.listdir('/opt/statefleet/app')),"
        " 'jars': sorted(os.listdir('/opt/statefleet/jars')),"
        " 'tools': {t: shutil.which(t) for t in ('java', 'tini', 'mvn', 'gcc', 'cc', 'pip')}}))\n"
    )
    done = podman("run", "--rm", "--network", "none", "--read-only", "--entrypoint", "python", IMAGE, "-c", probe)
    inside = json.loads(done.stdout)
    # Only what it runs (requirements-image.lock): no test or lint tools, no installer in its
    # virtualenv (the public base's own Python keeps its pip, outside it), and of the project
    # only the product: no tools/ (cluster, image builds, benchmarks, chaos), no tests/.
    assert inside["modules"] == sorted(
        ["faust", "rocksdict", "fastapi", "pyspark", "pyarrow", "pandas", "services", "spark_jobs"]
    ), inside["modules"]
    packages = [name for name in inside["app"] if not name.endswith(".dist-info")]
    assert packages == ["examples", "services", "shared", "spark_jobs"], inside["app"]
    jars = inside["jars"]
    assert "spark-sql-kafka-0-10_2.13-4.2.0.jar" in jars and any(j.startswith("kafka-clients-") for j in jars), jars
    tools = inside["tools"]
    assert tools["java"] and tools["tini"] == "/usr/bin/tini", tools
    assert not (tools["mvn"] or tools["gcc"] or tools["cc"]), f"build tools in the image: {tools}"


def test_topic_job_creates_the_topics(kafka_env: dict[str, str], run_prefix: str, workdir: Path) -> None:
    specs = [{"name": run_prefix + base, "partitions": PARTITIONS, "configs": configs} for base, configs in TOPICS.items()]
    job = Container(
        name(run_prefix, "topics"),
        ["services.topics"],
        {**kafka_env, "STATEFLEET_TOPIC_SPECS": json.dumps(specs)},
        mounts={"/tmp": workdir / "topics-tmp"},
    )
    done = job.run_to_end(timeout=180)
    assert done.returncode == 0, f"the topic job failed:\n{done.stdout}\n{done.stderr}"
    # Every topic exists now: reading each to its end fails on a missing topic.
    for base in TOPICS:
        assert read_all(run_prefix + base) == []


@pytest.fixture(scope="module")
def fleet(kafka_env: dict[str, str], run_prefix: str, workdir: Path, containers: list[Container]) -> dict[str, Container]:
    """Every service and the console, as the chart's StatefulSets and Deployment run them."""
    token = secrets.token_hex(20)
    out: dict[str, Container] = {}
    for service in SERVICES:
        port = free_port()
        env = {
            **kafka_env,
            "STATEFLEET_ENV": "production",
            "STATEFLEET_ADMIN_TOKEN": token,
            "STATEFLEET_INSTANCE_ID": name(run_prefix, service),
            "STATEFLEET_STATIC_MEMBERSHIP": "true",
            "STATEFLEET_DATA_DIR": "/var/lib/statefleet",
            "STATEFLEET_HTTP_HOST": "0.0.0.0",
            "STATEFLEET_HTTP_PORT": str(port),
            "STATEFLEET_ADVERTISED_URL": f"http://127.0.0.1:{port}",
            "STATEFLEET_TALLY_PUBLISH_INTERVAL_S": "0.5",
            "STATEFLEET_RETRY_TICK_INTERVAL_S": "0.5",
        }
        mounts = {"/tmp": workdir / f"{service}-tmp", "/var/lib/statefleet": workdir / f"{service}-data"}
        container = Container(name(run_prefix, service), [f"services.{service}"], env, mounts, port)
        containers.append(container.start())
        out[service] = container
    port = free_port()
    console_env = {
        "STATEFLEET_HTTP_HOST": "0.0.0.0",
        "STATEFLEET_HTTP_PORT": str(port),
        "STATEFLEET_LOG_LEVEL": "INFO",
        "HOME": "/tmp",
        "STATEFLEET_CONSOLE_SAMPLE_INTERVAL_S": "1",
        **{f"STATEFLEET_CONSOLE_{s.upper()}_URL": out[s].url for s in SERVICES},
    }
    console = Container(name(run_prefix, "console"), ["services.console"], console_env, {"/tmp": workdir / "console-tmp"}, port)
    containers.append(console.start())
    out["console"] = console
    for container in out.values():
        container.wait_ready()
    return out


def test_each_service_answers_healthz_and_readyz(fleet: dict[str, Container]) -> None:
    for service, container in fleet.items():
        for path in ("/healthz", "/readyz"):
            response = web.get(container.url + path, timeout=10)
            assert response.status_code == 200, f"{service} {path}: {response.status_code} {response.text}"


def test_processes_run_as_10001_and_write_only_tmp_and_data(fleet: dict[str, Container]) -> None:
    probe = (
        "import os, pathlib\n"
        "uids = {pathlib.Path(f'/proc/{p}/status').read_text().split('Uid:')[1].split()[0]"
        " for p in os.listdir('/proc') if p.isdigit()}\n"
        "out = []\n"
        "for d in ('/', '/opt/statefleet', '/home/statefleet', '/tmp', '/var/lib/statefleet'):\n"
        "    try:\n"
        "        pathlib.Path(d, '.probe').write_text('x'); pathlib.Path(d, '.probe').unlink(); out.append(d)\n"
        "    except OSError:\n"
        "        pass\n"
        "print(sorted(uids), out)\n"
    )
    for service in SERVICES:
        assert fleet[service].exec_python(probe).strip() == "['10001'] ['/tmp', '/var/lib/statefleet']", service
    # Each service keeps its RocksDB tables on the data volume.
    for service in SERVICES:
        tables = list(fleet[service].mounts["/var/lib/statefleet"].rglob("tables/*.db"))
        assert tables, f"{service} keeps no RocksDB table on its data volume"


def accounts_created(validator: Container, program: str, count: int) -> list[dict[str, Any]]:
    events = []
    for n in range(count):
        account = f"acct-{uuid.uuid4().hex[:8]}"
        body = create_command(account, program, f"{account}-1", 1_704_067_200_000 + n * 60_000, f"n{n}")
        response = web.post(validator.url + "/commands", json=body, params={"wait": "true"}, timeout=30)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["status"] == "accepted", answer
        events.append(answer["event"])
    return events


@pytest.fixture(scope="module")
def created(fleet: dict[str, Container]) -> list[dict[str, Any]]:
    return accounts_created(fleet["validator"], "prog-image", 3)


def test_validator_and_tallies_process_commands_into_a_tally(
    fleet: dict[str, Container], created: list[dict[str, Any]], run_prefix: str
) -> None:
    events = [json.loads(r.value or b"{}") for r in read_all(run_prefix + "account-events")]
    assert {e["account_id"] for e in events} == {e["account_id"] for e in created}

    def tally() -> dict[str, Any] | None:
        response = web.get(fleet["tallies"].url + "/tallies/prog-image", timeout=10)
        body: dict[str, Any] = response.json()
        return body if response.status_code == 200 and body.get("numberActive") == 3 else None

    assert wait_for(tally, timeout=60, message="the tally of prog-image")["numberInactive"] == 0


def test_a_bad_command_is_dead_lettered_and_parked(fleet: dict[str, Container], run_prefix: str) -> None:
    """The validator dead-letters a command it cannot decode; the retry scheduler parks it at
    once (DecodeError is never retried, docs/retry_scheduler.md) and lists it."""
    produce(run_prefix + "account-commands", [(b"acct-bad", b"not json")])

    def parked() -> list[dict[str, Any]]:
        response = web.get(fleet["retry_scheduler"].url + "/parked", timeout=10)
        items: list[dict[str, Any]] = response.json()["items"] if response.status_code == 200 else []
        return [i for i in items if i["origin_topic"] == run_prefix + "account-commands"]

    (item,) = wait_for(parked, timeout=60, message="the dead letter among the parked messages")
    assert item["key"] == "acct-bad" and item["error_class"] == "DecodeError", item
    assert [r.key for r in read_all(run_prefix + "parking-lot")] == [b"acct-bad"]


def test_console_shows_every_service_up(fleet: dict[str, Container]) -> None:
    def up() -> dict[str, Any] | None:
        response = web.get(fleet["console"].url + "/fleet.json", timeout=10)
        body: dict[str, Any] = response.json()
        text = json.dumps(body)
        return body if response.status_code == 200 and all(fleet[s].url.split("//")[1] in text for s in SERVICES) else None

    wait_for(up, timeout=60, message="the console's fleet to list every service")
    page = web.get(fleet["console"].url + "/fleet", timeout=10)
    assert page.status_code == 200 and "tallies" in page.text


def test_spark_join_runs_available_now_with_the_baked_jars(
    kafka_env: dict[str, str], created: list[dict[str, Any]], run_prefix: str, workdir: Path
) -> None:
    logins = [
        (
            e["account_id"],
            json.dumps(
                {"account_id": e["account_id"], "program_id": e["program_id"], "ts": e["occurred_at"] + 3_600_000}
            ).encode(),
        )
        for e in created
    ]
    produce(run_prefix + "logins", logins)
    env = {
        **kafka_env,
        "STATEFLEET_SPARK_MASTER": "local[2]",
        "STATEFLEET_SPARK_SHUFFLE_PARTITIONS": "2",
        "STATEFLEET_SPARK_CHECKPOINT_DIR": "/var/lib/statefleet-spark/checkpoints",
        "STATEFLEET_SPARK_ARCHIVE_DIR": "/var/lib/statefleet-spark/archive",
        "STATEFLEET_SPARK_BACKFILL_DIR": "/var/lib/statefleet-spark/backfill",
        "STATEFLEET_SPARK_LOCAL_DIR": "/tmp/spark-local",
        "STATEFLEET_SPARK_WAREHOUSE_DIR": "/tmp/spark-warehouse",
    }
    tmp = workdir / "spark-tmp"
    job = Container(
        name(run_prefix, "spark-join"),
        ["spark_jobs.activation_join", "--available-now"],
        env,
        {"/tmp": tmp, "/var/lib/statefleet-spark": workdir / "spark-storage"},
    )
    started = time.monotonic()
    done = job.run_to_end(timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"the activation join failed in the image:\n{output[-8000:]}"
    activations = {
        json.loads(r.value or b"{}")["account_id"]: json.loads(r.value or b"{}") for r in read_all(run_prefix + "activations")
    }
    assert set(activations) == {e["account_id"] for e in created}, f"{activations}\n{output[-4000:]}"
    assert all(a["activated"] for a in activations.values())
    # The connector came from /opt/statefleet/jars: nothing was resolved or downloaded.
    assert not list(tmp.glob(".ivy2*")) and ":: resolving dependencies ::" not in output
    assert any((workdir / "spark-storage" / "checkpoints").rglob("offsets")), "no checkpoint on the Spark volume"
    print(f"activation join in the image: {time.monotonic() - started:.0f}s")
