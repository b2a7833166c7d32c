"""Java producers of dead letters, on the real broker with the scheduler as a process
(``docs/dead-letter-protocol.md``, "Java client"): a Spring Kafka listener whose failures go
through the Java client's ``DeadLetterRecoverer`` (one record fails twice and then succeeds on
its redelivery, one always fails and is parked after its attempts), the same through Spring's
own ``DeadLetterPublishingRecoverer``, a Kafka Connect sink whose
converter fails, with the scheduler's ``dead-letters`` as its dead-letter queue, and a Kafka
Streams application with its dead-letter queue (KIP-1034). Each letter is scheduled with the
origin and the error its writer gave it.

The applications are ``clients/java/test-apps``, built once per machine by
``make java-clients-build`` into ``.local/java-clients``."""

from __future__ import annotations

import os
import struct
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest

from shared import dead_letters as dl
from tests.integration.retry_scheduler.helpers import scheduler_env, start_scheduler
from tests.support.kafka import Record, create_topics, produce, read_all
from tests.support.services import REPO, ServiceProcess, free_port, wait_for
from tools import web

pytestmark = pytest.mark.e2e

APPS = REPO / ".local" / "java-clients"
APPS_JAR = APPS / "statefleet-test-apps.jar"
MAX_ATTEMPTS = 3
#: The letters of these origin topics wait ten minutes, so the test reads them while scheduled.
SLOW = {"base_delay_ms": 600_000, "max_delay_ms": 600_000}
# A JVM that lives for seconds: the quick compiler and one GC thread start it on less CPU.
JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xss512k", "-Xmx256m")
SPRING_ERROR = "io.statefleet.deadletters.apps.SpringListenerApp$PaymentDeclinedException"


@contextmanager
def java_app(log: Path, main: str, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``main`` of the test applications, running until the block ends."""
    if not APPS_JAR.exists():
        pytest.fail(f"{APPS_JAR} is missing: `make java-clients-build` builds it")
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            ["java", *JVM_OPTIONS, "-cp", f"{APPS_JAR}{os.pathsep}{APPS / 'lib' / '*'}", main, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def running(proc: subprocess.Popen[bytes], log: Path) -> None:
    if proc.poll() is not None:
        raise AssertionError(f"the Java application exited with {proc.returncode}:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def scheduler(
    kafka_bootstrap: str, module_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServiceProcess, str]]:
    """One scheduler for the module's tests, on the module's own topic prefix."""
    prefix = module_prefix
    tmp = tmp_path_factory.mktemp("java-clients")
    create_topics([f"{prefix}{name}" for name in ("dead-letters", "retry", "parking-lot")])
    overrides = {"origin_topic": {"clicks": SLOW, "events": SLOW, "refunds": {"redeliver_to": "origin"}}}
    env = scheduler_env(
        kafka_bootstrap,
        prefix,
        tmp / "data",
        retry_max_attempts=MAX_ATTEMPTS,
        retry_base_delay_ms=200,
        retry_max_delay_ms=400,
        retry_policy_overrides=orjson.dumps(overrides).decode(),
    )
    proc = start_scheduler(env, tmp)
    try:
        yield proc, prefix
    finally:
        proc.kill()


def letters_of(topic: str, dlq_id: str) -> list[Record]:
    return [r for r in read_all(topic) if dict(r.headers).get(dl.ID) == dlq_id.encode()]


def get_json(url: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    answer = web.get(url, timeout=10)
    return answer.status_code, answer.json()


def test_spring_listeners_are_redelivered_until_they_succeed_or_parked_after_their_attempts(
    kafka_bootstrap: str, scheduler: tuple[ServiceProcess, str], tmp_path: Path
) -> None:
    """``payments`` fails through the Java client, ``refunds`` through Spring's own recoverer
    (its ``kafka_dlt-*`` letters have no retry topic: the policy redelivers them to ``refunds``)."""
    proc, prefix = scheduler
    dead, retry, parking, payments, processed, refunds = (
        f"{prefix}{name}" for name in ("dead-letters", "retry", "parking-lot", "payments", "processed", "refunds")
    )
    create_topics([payments, processed, refunds], partitions=2)
    produce(payments, [(b"order-1", b"fail-times=2;amount=12"), (b"order-2", b"fail-times=always;amount=30")])
    produce(refunds, [(b"refund-1", b"fail-times=1;amount=5"), (b"refund-2", b"fail-times=always;amount=8")])
    refunded = {r.key: r for r in read_all(refunds)}
    refund_ids = {key: dl.content_id(refunds, key, r.value) for key, r in refunded.items()}
    by_key = {r.key: r for r in read_all(payments)}
    recovers, always = by_key[b"order-1"], by_key[b"order-2"]
    recovers_id = dl.derive_id(payments, recovers.partition, recovers.offset, recovers.key, recovers.value)
    always_id = dl.derive_id(payments, always.partition, always.offset, always.key, always.value)

    log = tmp_path / "spring.log"
    args = (kafka_bootstrap, f"{prefix}spring", payments, retry, dead, processed, refunds)
    with java_app(log, "io.statefleet.deadletters.apps.SpringListenerApp", *args) as app:

        def parked(dlq_id: str) -> dict | None:  # type: ignore[type-arg]
            running(app, log)
            status, body = get_json(f"{proc.url}/parked/{dlq_id}")
            return body if status == 200 else None

        done = wait_for(lambda: len(r := read_all(processed)) >= 2 and r, timeout=60, message="the recovering records processed")
        always_parked = wait_for(lambda: parked(always_id), timeout=60, message="the failing record parked")
        refund_parked = wait_for(lambda: parked(refund_ids[b"refund-2"]), timeout=60, message="the failing refund parked")

    attempts = sorted((r.key, dict(r.headers)["processed.attempt"]) for r in done)
    assert attempts == [(b"order-1", b"2"), (b"refund-1", b"1")]
    status, body = get_json(f"{proc.url}/retries/{recovers_id}")
    assert status == 404 and "attempt 2 was redelivered" in body["detail"]

    # The client's letters: its first failure, then the re-failure of its redelivery.
    letters = [dict(r.headers) for r in letters_of(dead, recovers_id)]
    assert [h[dl.ATTEMPT] for h in letters] == [b"1", b"2"]
    for headers in letters:
        assert headers[dl.ORIGINAL_TOPIC] == payments.encode()
        assert headers[dl.ORIGINAL_PARTITION] == str(recovers.partition).encode()
        assert headers[dl.ORIGINAL_OFFSET] == str(recovers.offset).encode()
        assert headers[dl.RETRY_TOPIC] == retry.encode()
        assert headers[dl.ERROR_CLASS] == SPRING_ERROR.encode()
    assert [dict(r.headers)[dl.ATTEMPT] for r in letters_of(retry, recovers_id)] == [b"1", b"2"]

    origin = (always_parked["origin_topic"], always_parked["origin_partition"], always_parked["origin_offset"])
    assert origin == (payments, always.partition, always.offset)
    assert always_parked["attempt"] == MAX_ATTEMPTS
    assert (always_parked["error_class"], always_parked["error_message"]) == (SPRING_ERROR, "declined at attempt 3")
    assert [dict(r.headers)[dl.ATTEMPT] for r in letters_of(dead, always_id)] == [b"1", b"2", b"3"]
    assert len(letters_of(parking, always_id)) == 1

    # Spring's letters: the origin from its first kafka_dlt-original-* headers, the error from
    # the cause of its ListenerExecutionFailedException; each re-failure one more attempt.
    status, body = get_json(f"{proc.url}/retries/{refund_ids[b'refund-1']}")
    assert status == 404 and "attempt 1 was redelivered" in body["detail"]
    failing = refunded[b"refund-2"]
    origin = (refund_parked["origin_topic"], refund_parked["origin_partition"], refund_parked["origin_offset"])
    assert origin == (refunds, failing.partition, failing.offset)
    assert (refund_parked["attempt"], refund_parked["error_class"]) == (MAX_ATTEMPTS, SPRING_ERROR)
    assert refund_parked["error_message"].endswith("declined at attempt 3")
    spring_letters = [r for r in read_all(dead) if r.key == b"refund-2"]
    assert len(spring_letters) == MAX_ATTEMPTS
    assert all(dict(r.headers)[dl.SPRING_EXCEPTION_FQCN] == dl.SPRING_WRAPPER.encode() for r in spring_letters)


def test_a_connect_sinks_converter_failure_is_scheduled_with_connects_origin_and_error(
    kafka_bootstrap: str, scheduler: tuple[ServiceProcess, str], tmp_path: Path
) -> None:
    proc, prefix = scheduler
    dead, retry, clicks = f"{prefix}dead-letters", f"{prefix}retry", f"{prefix}clicks"
    create_topics([clicks], partitions=1)
    produce(clicks, [(b"c1", b'{"page": 1}'), (b"c2", b"{not json"), (b"c3", b'{"page": 3}')])
    sink = tmp_path / "clicks.txt"
    worker = {
        "bootstrap.servers": kafka_bootstrap,
        "key.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "false",
        "offset.storage.file.filename": str(tmp_path / "connect.offsets"),
        "listeners": f"http://127.0.0.1:{free_port()}",
        # The connector is on the class path with its ServiceLoader manifest: no plugin scan.
        "plugin.discovery": "service_load",
    }
    connector = {
        "name": f"{prefix}clicks-sink",
        "connector.class": "io.statefleet.deadletters.apps.LinesSinkConnector",
        "tasks.max": "1",
        "topics": clicks,
        "file": str(sink),
        "errors.tolerance": "all",
        "errors.deadletterqueue.topic.name": dead,
        "errors.deadletterqueue.topic.replication.factor": "1",
        "errors.deadletterqueue.context.headers.enable": "true",
    }
    files = []
    for name, settings in (("worker", worker), ("connector", connector)):
        path = tmp_path / f"{name}.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        files.append(str(path))
    bad_id = dl.content_id(clicks, b"c2", b"{not json")

    log = tmp_path / "connect.log"
    with java_app(log, "org.apache.kafka.connect.cli.ConnectStandalone", *files) as app:

        def scheduled() -> dict | None:  # type: ignore[type-arg]
            running(app, log)
            status, body = get_json(f"{proc.url}/retries/{bad_id}")
            return body if status == 200 else None

        letter = wait_for(scheduled, timeout=60, message="Connect's dead letter scheduled")
        lines = wait_for(lambda: sink.exists() and sink.read_text().splitlines(), timeout=30, message="the good records sunk")

    assert lines == ["{page=1}", "{page=3}"]
    assert (letter["origin_topic"], letter["origin_partition"], letter["origin_offset"]) == (clicks, 0, 1)
    assert letter["error_class"] == "org.apache.kafka.connect.errors.DataException"
    assert "Converting byte[] to Kafka Connect data failed" in letter["error_message"]
    assert (letter["attempt"], letter["retry_topic"]) == (1, retry)
    [written] = [dict(r.headers) for r in read_all(dead) if r.key == b"c2"]
    assert written["__connect.errors.stage"] == b"VALUE_CONVERTER"


def test_a_kafka_streams_dead_letter_is_scheduled_with_its_origin_and_error(
    kafka_bootstrap: str, scheduler: tuple[ServiceProcess, str], tmp_path: Path
) -> None:
    proc, prefix = scheduler
    dead, events, doubled = f"{prefix}dead-letters", f"{prefix}events", f"{prefix}doubled"
    create_topics([events, doubled], partitions=1)
    amounts = [(b"a", struct.pack(">q", 5)), (b"b", struct.pack(">q", -3)), (b"c", b"not a long"), (b"d", struct.pack(">q", 7))]
    produce(events, amounts)
    negative_id, garbled_id = (dl.content_id(events, key, value) for key, value in amounts[1:3])

    log = tmp_path / "streams.log"
    args = (kafka_bootstrap, f"{prefix}streams", events, doubled, dead, str(tmp_path / "streams-state"))
    with java_app(log, "io.statefleet.deadletters.apps.StreamsApp", *args) as app:

        def scheduled(dlq_id: str) -> dict | None:  # type: ignore[type-arg]
            running(app, log)
            status, body = get_json(f"{proc.url}/retries/{dlq_id}")
            return body if status == 200 else None

        negative = wait_for(lambda: scheduled(negative_id), timeout=60, message="the processing failure scheduled")
        garbled = wait_for(lambda: scheduled(garbled_id), timeout=30, message="the deserialization failure scheduled")
        out = wait_for(lambda: len(r := read_all(doubled)) >= 2 and r, timeout=30, message="the good amounts doubled")

    assert [(r.key, struct.unpack(">q", r.value or b"")[0]) for r in out] == [(b"a", 10), (b"d", 14)]
    assert (negative["origin_topic"], negative["origin_partition"], negative["origin_offset"]) == (events, 0, 1)
    assert negative["error_class"] == "io.statefleet.deadletters.apps.StreamsApp$NegativeAmountException"
    assert negative["error_message"] == "negative amount -3"
    assert (garbled["origin_topic"], garbled["origin_partition"], garbled["origin_offset"]) == (events, 0, 2)
    assert garbled["error_class"] == "org.apache.kafka.common.errors.SerializationException"
