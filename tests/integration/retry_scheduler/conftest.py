"""A retry scheduler on the real broker, shared by the tests of a module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.retry_scheduler.helpers import Scheduler, scheduler_env, start_scheduler
from tests.support.kafka import create_topics


@pytest.fixture(scope="module")
def scheduler(kafka_bootstrap: str, module_prefix: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scheduler]:
    prefix = module_prefix
    tmp = tmp_path_factory.mktemp("retry-scheduler")
    create_topics([f"{prefix}dead-letters", f"{prefix}retry", f"{prefix}parking-lot"])
    proc = start_scheduler(scheduler_env(kafka_bootstrap, prefix, tmp / "data"), tmp)
    yield Scheduler(proc, prefix)
    proc.kill()
