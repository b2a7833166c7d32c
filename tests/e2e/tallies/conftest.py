from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.kafka import create_topics
from tests.support.services import ServiceProcess, free_port


@pytest.fixture
def tally_topics(prefix: str) -> dict[str, str]:
    names = {
        "events": f"{prefix}account-events",
        "logins": f"{prefix}logins",
        "tallies": f"{prefix}program-tallies",
        "dead_letters": f"{prefix}dead-letters",
    }
    create_topics(names.values(), compacted=[names["tallies"]])
    return names


@pytest.fixture
def start_tallies(service_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., ServiceProcess]]:
    started: list[ServiceProcess] = []
    ports: dict[str, int] = {}

    def start(instance: str = "a", **extra_env: str) -> ServiceProcess:
        # A restarted instance keeps its URL, as a pod keeps its DNS name: with static
        # membership the group hands it back its previous assignment, URL included.
        env = {**service_env, "STATEFLEET_INSTANCE_ID": instance, **extra_env}
        port = ports.setdefault(instance, free_port())
        proc = ServiceProcess("tallies", env, tmp_path / f"tallies-{instance}-{len(started)}.log", port=port).start()
        started.append(proc)
        return proc.wait_ready()

    yield start
    for proc in started:
        proc.kill()
