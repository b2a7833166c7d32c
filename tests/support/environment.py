"""What makes a test's topics and service processes its own: a topic prefix and a service's
environment, built one way for fixtures of any scope (function, module, session)."""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from aiokafka.errors import KafkaError

from tests.support.kafka import delete_topics_with_prefix


def new_topic_prefix(tag: str = "t") -> str:
    """A topic and consumer-group prefix no other test uses: ``tag``, ten hex digits and a dot.
    ``tag`` tells where the topics come from when a broker is looked at by hand."""
    return f"{tag}{uuid.uuid4().hex[:10]}."


@contextmanager
def owned_topic_prefix(tag: str = "t") -> Iterator[str]:
    """:func:`new_topic_prefix`, whose topics on the test broker are deleted when the block ends.
    Every Kafka client start reads the metadata of all topics, so a broker that kept every test's
    topics (about 1,000 by the end of the suite) would make each later service start and test
    client slower. A failed deletion only warns: the test's outcome stands."""
    name = new_topic_prefix(tag)
    try:
        yield name
    finally:
        try:
            delete_topics_with_prefix(name)
        except KafkaError as exc:
            warnings.warn(f"could not delete the topics of prefix {name}: {exc!r}", stacklevel=1)


def service_environment(
    bootstrap: str,
    prefix: str,
    data_dir: Path,
    *,
    guarantee: str | None = None,
    instance: str | None = None,
    http_port: int | None = None,
    log_level: str | None = "INFO",
    **settings: object,
) -> dict[str, str]:
    """The ``STATEFLEET_*`` environment of a service process on broker ``bootstrap``, with topics
    and consumer groups under ``prefix`` and its state under ``data_dir``.

    ``guarantee``: the processing guarantee (``at_least_once`` or ``exactly_once``; the
    settings' default when None); ``instance``: the instance id; ``http_port``: the port it
    serves on (``ServiceProcess`` sets its own otherwise); ``log_level``: None leaves it to the
    settings. Every other keyword is a setting by its lower-case name:
    ``retry_max_attempts=2`` becomes ``STATEFLEET_RETRY_MAX_ATTEMPTS=2``."""
    env = {
        "STATEFLEET_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "STATEFLEET_TOPIC_PREFIX": prefix,
        "STATEFLEET_DATA_DIR": str(data_dir),
    }
    named = {"processing_guarantee": guarantee, "instance_id": instance, "http_port": http_port, "log_level": log_level}
    return {**env, **settings_env(**named, **settings)}


def settings_env(**settings: object) -> dict[str, str]:
    """Settings by their lower-case names as ``STATEFLEET_*`` variables; a None value is left out."""
    return {f"STATEFLEET_{name.upper()}": str(value) for name, value in settings.items() if value is not None}
