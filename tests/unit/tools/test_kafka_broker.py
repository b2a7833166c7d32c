"""The local broker's helpers that need no broker."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
        deadline = time.monotonic() + 10
        while kafka_broker._pid(layout) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        # A zombie still answers signal 0; stop() would wait a minute for it to go.
        assert kafka_broker._pid(layout) is None
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
