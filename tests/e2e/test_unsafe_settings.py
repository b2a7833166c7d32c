"""A service outside a local run does not start with the development admin token."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from shared.settings import DEV_ADMIN_TOKEN
from tests.support.services import ServiceProcess

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("module", ["validator", "tallies", "retry_scheduler"])
def test_production_with_the_default_admin_token_refuses_to_start(tmp_path: Path, module: str) -> None:
    env = {
        "STATEFLEET_ENV": "production",
        "STATEFLEET_ADMIN_TOKEN": DEV_ADMIN_TOKEN,
        "STATEFLEET_TOPIC_PREFIX": f"t{uuid.uuid4().hex[:10]}.",
        "STATEFLEET_DATA_DIR": str(tmp_path / "data"),
    }
    proc = ServiceProcess(module, env, tmp_path / "service.log").start()
    assert proc.proc is not None
    try:
        returncode = proc.proc.wait(60)
    finally:
        proc.kill()
    assert returncode != 0
    log = proc.log_tail()
    assert "STATEFLEET_ADMIN_TOKEN" in log and "Set STATEFLEET_ADMIN_TOKEN to a secret of your own" in log, log
