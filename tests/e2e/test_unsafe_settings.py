"""A service outside a local run does not start with the development admin token."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.settings import DEV_ADMIN_TOKEN
from tests.support.environment import new_topic_prefix, service_environment
from tests.support.kafka import BOOTSTRAP
from tests.support.services import ServiceProcess

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("module", ["validator", "tallies", "retry_scheduler"])
def test_production_with_the_default_admin_token_refuses_to_start(tmp_path: Path, module: str) -> None:
    # It refuses before it connects: no broker needed, and no topic made under the prefix.
    env = service_environment(BOOTSTRAP, new_topic_prefix(), tmp_path / "data", env="production", admin_token=DEV_ADMIN_TOKEN)
    proc = ServiceProcess(module, env, tmp_path / "service.log").start()
    assert proc.proc is not None
    try:
        returncode = proc.proc.wait(60)
    finally:
        proc.kill()
    assert returncode != 0
    log = proc.log_tail()
    assert "STATEFLEET_ADMIN_TOKEN" in log and "Set STATEFLEET_ADMIN_TOKEN to a secret of your own" in log, log
