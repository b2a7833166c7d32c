"""Validator processes for end-to-end tests: a shared one for API tests, and a
starter for tests that run several instances, kill and restart them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.environment import owned_topic_prefix, service_environment
from tests.support.services import ServiceProcess, free_port


def module_validator(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory, name: str, **extra_env: str
) -> Iterator[ServiceProcess]:
    """One validator instance named ``name`` with a topic prefix of its own, until the generator
    is closed (its topics are deleted then); ``extra_env``: ``STATEFLEET_*`` variables to add."""
    tmp: Path = tmp_path_factory.mktemp(f"validator-{name}")
    with owned_topic_prefix() as prefix:
        env = {**service_environment(kafka_bootstrap, prefix, tmp / "data", instance=name, log_level=None), **extra_env}
        proc = ServiceProcess("validator", env, tmp / "validator.log").start()
        try:
            yield proc.wait_ready()
        finally:
            proc.kill()


@pytest.fixture(scope="module")
def shared_validator(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """One validator instance with a topic prefix of its own, for a whole module."""
    yield from module_validator(kafka_bootstrap, tmp_path_factory, "api")


@pytest.fixture
def start_validator(service_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., ServiceProcess]]:
    """Start (or restart) instance ``name``; a restarted instance keeps its port, as a pod keeps its name."""
    started: list[ServiceProcess] = []
    ports: dict[str, int] = {}

    def start(name: str = "a", wait: bool = True, **extra_env: str) -> ServiceProcess:
        env = {**service_env, "STATEFLEET_INSTANCE_ID": name, **extra_env}
        port = ports.setdefault(name, free_port())
        proc = ServiceProcess("validator", env, tmp_path / f"validator-{name}-{len(started)}.log", port=port).start()
        started.append(proc)
        return proc.wait_ready() if wait else proc

    yield start
    for proc in started:
        proc.kill()
