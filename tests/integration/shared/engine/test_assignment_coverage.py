"""A worker whose input topic had no metadata at its group's first assignment gets the topic's
partitions once it has, within seconds.

The assignor skips such a topic (as Faust's does); without the engine's metadata
chase nobody would own it until a metadata refresh minutes later (see shared/engine/_coverage.py).
The topic here is created by the broker when the worker's first metadata request names it, so
that request finds it without partitions yet, as a fleet started right after the broker finds
its topics.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.kafka import create_topics, produce
from tests.support.services import ServiceProcess, wait_for
from tools import web

pytestmark = pytest.mark.timeout(180)


def test_a_topic_skipped_for_want_of_metadata_is_assigned_within_seconds(
    service_env: dict[str, str], prefix: str, tmp_path: Path
) -> None:
    topic = f"{prefix}late"
    worker = ServiceProcess("tests.support.probe_worker", {**service_env, "PROBE_TOPIC": topic}, tmp_path / "probe.log").start()
    try:
        wait_for(
            lambda: "which the cluster metadata does not show yet" in worker.log_tail(200_000),
            timeout=60,
            message="the first assignment to skip the topic",
        )
        create_topics([topic])  # a no-op where the broker created it on the worker's request
        produce(topic, [(f"k{i}", f"v{i}".encode()) for i in range(16)])
        wait_for(
            lambda: worker.log_tail(200_000).count("probe got") == 16,
            timeout=30,
            message="every record of the skipped topic to be handed to the handler",
        )
        wait_for(
            lambda: web.get(worker.url + "/readyz", timeout=2).status_code == 200, timeout=10, message="the worker to be ready"
        )
        assert "rejoining so that their partitions are assigned" in worker.log_tail(200_000)
    finally:
        worker.stop()
