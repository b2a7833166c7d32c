"""The local broker's helpers that need no broker."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.services import wait_for
from tools import kafka_broker
from tools.kafka_broker import MavenProgress, _run_maven, new_cluster_id


def test_cluster_ids_are_16_random_bytes_and_never_look_like_an_option() -> None:
    ids = [new_cluster_id() for _ in range(5000)]  # about 1 in 64 base64 strings starts with "-"
    assert len(set(ids)) == len(ids)
    assert not any(cid.startswith("-") for cid in ids)
    assert all(len(base64.urlsafe_b64decode(cid + "==")) == 16 for cid in ids)


def downloaded(name: str) -> str:
    return f"[INFO] Downloaded from central: https://repo.maven.apache.org/maven2/org/x/{name} (12 kB at 40 kB/s)\n"


def test_maven_progress_shows_a_line_now_and_then_not_one_per_file() -> None:
    progress = MavenProgress(interval=2.0)
    shown = [
        out
        for i in range(300)
        if (out := progress.feed(downloaded(f"lib-{i}.jar"), now=i * 0.02)) is not None  # 300 files in 6 s
    ]
    assert 2 <= len(shown) <= 4
    assert shown[0] == "Maven: 1 files downloaded (latest lib-0.jar)"
    assert progress.feed("[INFO] Downloading from central: https://x/y.pom\n", now=100.0) is None
    assert progress.feed("[INFO] BUILD SUCCESS\n", now=100.0) is None
    assert progress.summary() == "Maven: done, 300 files downloaded"


def test_maven_runs_streamed_and_a_failure_keeps_its_last_lines(capsys: pytest.CaptureFixture[str]) -> None:
    script = "import sys\nprint(" + repr(downloaded("kafka_2.13-4.1.1.jar")) + ")\nprint('[ERROR] no such artifact')\nsys.exit(3)"
    returncode, tail = _run_maven([sys.executable, "-c", script])
    assert returncode == 3
    assert "[ERROR] no such artifact" in tail
    assert "Maven: 1 files downloaded (latest kafka_2.13-4.1.1.jar)" in capsys.readouterr().err


def test_a_broker_this_process_started_and_killed_is_not_running(tmp_path: Path) -> None:
    layout = kafka_broker.BrokerLayout(home=tmp_path)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    layout.pid_file.write_text(str(child.pid))
    try:
        assert kafka_broker._pid(layout) == child.pid
        os.kill(child.pid, signal.SIGKILL)
        # A zombie still answers signal 0; stop() would wait a minute for it to go.
        wait_for(lambda: kafka_broker._pid(layout) is None, timeout=10, interval=0.05, message="the killed child not running")
    finally:
        child.kill()
        with contextlib.suppress(ChildProcessError):
            child.wait()


def test_the_plaintext_broker_config_is_the_template_as_it_was(tmp_path: Path) -> None:
    layout = kafka_broker.BrokerLayout(home=tmp_path, port=19001, controller_port=19002)
    kafka_broker.write_config(layout)
    config = layout.config.read_text()
    assert "listeners=PLAINTEXT://127.0.0.1:19001,CONTROLLER://127.0.0.1:19002\n" in config
    assert "authorizer" not in config and "sasl" not in config


def test_the_secure_broker_config_has_one_sasl_ssl_listener_and_acls(tmp_path: Path) -> None:
    layout = kafka_broker.BrokerLayout(home=tmp_path, port=19001, controller_port=19002, secure=True)
    kafka_broker.write_config(layout)
    config = layout.config.read_text()
    props = dict(line.split("=", 1) for line in config.splitlines() if line and not line.startswith("#"))
    assert props["listeners"] == "SASL_SSL://127.0.0.1:19001,CONTROLLER://127.0.0.1:19002"
    assert props["advertised.listeners"] == "SASL_SSL://127.0.0.1:19001"
    assert props["listener.security.protocol.map"] == "CONTROLLER:SASL_PLAINTEXT,SASL_SSL:SASL_SSL"
    assert props["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["super.users"] == "User:admin"
    assert props["ssl.keystore.location"] == f"{tmp_path}/tls/broker-keystore.pem"
    assert props["ssl.truststore.location"] == f"{tmp_path}/tls/ca.pem"
    admin_password = kafka_broker.credentials(layout)["admin"]
    assert f'username="admin" password="{admin_password}"' in props["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"]
    assert "@" not in config.replace("@ADMIN", "")  # every placeholder filled in
    assert config.count("\nlisteners=") == 1  # replaced in place, not repeated
    # Its passwords are made once and kept from everyone else.
    assert kafka_broker.credentials(layout) == kafka_broker.credentials(layout)
    assert set(kafka_broker.credentials(layout)) == {
        "admin",
        "validator",
        "tallies",
        "retry_scheduler",
        "activation_join",
        "backfill_tallies",
        "archive_events",
        "spark",
    }
    assert layout.credentials_file.stat().st_mode & 0o077 == 0
    assert layout.config.stat().st_mode & 0o077 == 0


def properties(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_a_single_broker_keeps_its_files_and_ports_in_its_home(tmp_path: Path) -> None:
    layout = kafka_broker.BrokerLayout(home=tmp_path)
    (node,) = layout.nodes
    assert (node.node_id, node.home, node.port, node.controller_port) == (1, tmp_path, 9092, 9093)
    assert (layout.data, layout.pid_file) == (tmp_path / "data", tmp_path / "broker.pid")
    assert layout.log_file == tmp_path / "broker.log"
    assert layout.bootstrap == "127.0.0.1:9092"
    props = properties(kafka_broker.render_config(layout))
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:9093"
    assert "controller.quorum.voters" not in props
    assert props["default.replication.factor"] == "1"


def test_the_nodes_of_a_cluster_each_have_a_home_and_ports_a_hundred_apart(tmp_path: Path) -> None:
    layout = kafka_broker.BrokerLayout(home=tmp_path, brokers=3)
    assert [(n.node_id, n.port, n.controller_port) for n in layout.nodes] == [(1, 9092, 9093), (2, 9192, 9193), (3, 9292, 9293)]
    assert [n.data for n in layout.nodes] == [tmp_path / f"node-{i}" / "data" for i in (1, 2, 3)]
    assert layout.bootstrap == "127.0.0.1:9092,127.0.0.1:9192,127.0.0.1:9292"
    assert layout.libs == tmp_path / "libs"  # one set of jars for every node
    with pytest.raises(kafka_broker.BrokerError, match="nodes 1 to 3"):
        layout.node(4)


def test_every_node_of_a_cluster_votes_in_one_static_quorum_with_internal_topics_on_three(tmp_path: Path) -> None:
    layout = kafka_broker.BrokerLayout(home=tmp_path, port=19100, controller_port=19101, brokers=3)
    kafka_broker.write_config(layout)
    configs = [properties(node.config.read_text()) for node in layout.nodes]
    for node, props in zip(layout.nodes, configs, strict=True):
        assert props["node.id"] == str(node.node_id)
        assert props["listeners"] == f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}"
        assert props["advertised.listeners"] == f"PLAINTEXT://127.0.0.1:{node.port}"
        assert props["log.dirs"] == str(tmp_path / f"node-{node.node_id}" / "data")
        assert props["controller.quorum.voters"] == "1@127.0.0.1:19101,2@127.0.0.1:19201,3@127.0.0.1:19301"
        assert "controller.quorum.bootstrap.servers" not in props  # formatted without --standalone
        for name in ("offsets.topic", "transaction.state.log", "share.coordinator.state.topic"):
            assert props[f"{name}.replication.factor"] == "3"
        assert props["transaction.state.log.min.isr"] == props["share.coordinator.state.topic.min.isr"] == "2"
        assert props["default.replication.factor"] == "3"
        assert props["min.insync.replicas"] == "2"
    assert all(list(props) == list(configs[0]) for props in configs)  # the same properties, in the same order


def test_a_two_node_cluster_stays_writable_with_one_node_down(tmp_path: Path) -> None:
    props = properties(kafka_broker.render_config(kafka_broker.BrokerLayout(home=tmp_path, brokers=2)))
    assert (props["default.replication.factor"], props["min.insync.replicas"]) == ("2", "1")


def test_cluster_nodes_get_half_a_gigabyte_of_heap_unless_told(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("STATEFLEET_BROKER_HEAP", raising=False)
    assert "-Xmx1g" in kafka_broker._java_cmd(kafka_broker.BrokerLayout(home=tmp_path), "kafka.Kafka")
    assert "-Xmx512m" in kafka_broker._java_cmd(kafka_broker.BrokerLayout(home=tmp_path, brokers=3), "kafka.Kafka")
    monkeypatch.setenv("STATEFLEET_BROKER_HEAP", "768m")
    assert "-Xmx768m" in kafka_broker._java_cmd(kafka_broker.BrokerLayout(home=tmp_path, brokers=3), "kafka.Kafka")


def test_the_node_count_comes_from_the_environment_else_from_what_the_home_was_formatted_with(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("STATEFLEET_BROKER_HOME", str(tmp_path))
    monkeypatch.delenv("STATEFLEET_BROKERS", raising=False)
    assert kafka_broker.default_layout().brokers == 1
    layout = kafka_broker.BrokerLayout(home=tmp_path, brokers=3)
    cluster_id = kafka_broker._cluster_id(layout)
    assert kafka_broker._cluster_id(layout) == cluster_id  # every node is formatted with the one id
    assert kafka_broker.default_layout().brokers == 3
    monkeypatch.setenv("STATEFLEET_BROKERS", "1")
    assert kafka_broker.default_layout().brokers == 1
    # Its voters are fixed at formatting: another count is refused with what to do.
    with pytest.raises(kafka_broker.BrokerError, match="formatted with 3 nodes, not 1: start it with BROKERS=3"):
        kafka_broker._check_node_count(kafka_broker.default_layout())
    kafka_broker.reset_storage(layout)
    assert kafka_broker.default_layout().brokers == 1


def test_the_secure_broker_is_one_node(tmp_path: Path) -> None:
    with pytest.raises(kafka_broker.BrokerError, match="drop --brokers"):
        kafka_broker.start(kafka_broker.BrokerLayout(home=tmp_path, secure=True, brokers=3))


def test_stop_stops_every_node_whose_pid_file_is_in_the_home(tmp_path: Path) -> None:
    layout = kafka_broker.BrokerLayout(home=tmp_path, brokers=2)
    children = []
    for node in layout.nodes:
        node.home.mkdir(parents=True)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        node.pid_file.write_text(str(child.pid))
        children.append(child)
    try:
        assert [s.pid for s in kafka_broker.node_states(layout).values()] == [c.pid for c in children]
        # Told of one node only (no STATEFLEET_BROKERS, no cluster.json), it still stops both.
        kafka_broker.stop(kafka_broker.BrokerLayout(home=tmp_path), wait_s=10)
        assert [s.pid for s in kafka_broker.node_states(layout).values()] == [None, None]
        assert not any(node.pid_file.exists() for node in layout.nodes)
    finally:
        for child in children:
            child.kill()
            with contextlib.suppress(ChildProcessError):
                child.wait()


def test_nodes_formatted_later_join_the_cluster_id_of_those_formatted_before(tmp_path: Path) -> None:
    layout = kafka_broker.BrokerLayout(home=tmp_path, brokers=3)
    layout.node(2).data.mkdir(parents=True)
    (layout.node(2).data / "meta.properties").write_text("#\nnode.id=2\ncluster.id=AbCdEfGhIjKlMnOpQrStUw\nversion=1\n")
    assert kafka_broker._cluster_id(layout) == "AbCdEfGhIjKlMnOpQrStUw"
    assert kafka_broker.formatted_brokers(tmp_path) == 3


def test_grant_names_the_spark_jobs_and_their_arguments(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("STATEFLEET_SECURE_BROKER_HOME", str(tmp_path))
    monkeypatch.delenv("STATEFLEET_TALLIES_PROJECTION", raising=False)
    monkeypatch.delenv("STATEFLEET_VALIDATOR_DOMAIN", raising=False)
    granted: list[tuple[object, ...]] = []
    monkeypatch.setattr(kafka_broker, "grant", lambda layout, *args: granted.append(args))
    job = "archive_events --topic order-events --fields aggregate_id"
    assert kafka_broker.main(["--secure", "grant", "--topic-prefix", "shop.", "--spark-job", job]) == 0
    monkeypatch.setenv("STATEFLEET_VALIDATOR_DOMAIN", "examples.orders.domain:ORDERS")
    assert kafka_broker.main(["--secure", "grant", "--projection", "examples.orders.projection:PROJECTION"]) == 0
    assert granted == [
        ("shop.", {"archive_events": ("--topic", "order-events", "--fields", "aggregate_id")}, None, None),
        # Every job, the tallies and the backfill on the orders projection, the validator on the orders domain.
        ("", None, "examples.orders.projection:PROJECTION", "examples.orders.domain:ORDERS"),
    ]


def test_a_job_that_refuses_its_arguments_stops_the_grant(tmp_path: Path) -> None:
    layout = kafka_broker.BrokerLayout(home=tmp_path, port=1, controller_port=2, secure=True)
    with pytest.raises(kafka_broker.BrokerError, match="--output-topic is required"):
        kafka_broker.grant(layout, "p.", {"activation_join": ("--first-kind", "OrderPlaced")})


def test_a_domain_that_cannot_be_loaded_stops_the_grant(tmp_path: Path) -> None:
    layout = kafka_broker.BrokerLayout(home=tmp_path, port=1, controller_port=2, secure=True)
    with pytest.raises(kafka_broker.BrokerError, match=r"cannot tell the topics to grant: .*no\.such\.module"):
        kafka_broker.grant(layout, "p.", domain="no.such.module:D")
