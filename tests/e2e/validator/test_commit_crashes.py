"""SIGKILL the validator at each step of a batch's commit (see
``tests/e2e/tallies/test_commit_crashes.py``): twice per step while it decides a backlog
(once keeping its local state, once losing it), then to the end. Afterwards every
accepted command's event is on ``account-events`` exactly once per (account, version),
in command order, with no gaps and no rejection."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.e2e.validator.test_validator_crash import assert_each_event_once, commands_in_order
from tests.support.kafka import create_topics, produce
from tests.support.services import ServiceProcess, free_port, run_until_killed

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.parametrize("step", ["handled", "sent", "logged"])
def test_sigkill_at_each_commit_step_leaves_each_event_once(
    step: str, service_env: dict[str, str], prefix: str, tmp_path: Path,
) -> None:
    stream = commands_in_order()
    half = len(stream) // 2
    create_topics([f"{prefix}account-commands"])  # as the validator creates it: 8 partitions
    produce(f"{prefix}account-commands", stream[:half])
    env = {**service_env, "STATEFLEET_INSTANCE_ID": "c", "STATEFLEET_CONSUMER_MAX_POLL_RECORDS": "200"}
    port = free_port()
    run_until_killed("validator", env, tmp_path / "validator-1.log", port, f"{step}:3")
    produce(f"{prefix}account-commands", stream[half:])
    shutil.rmtree(Path(service_env["STATEFLEET_DATA_DIR"]) / "validator" / "c")
    run_until_killed("validator", env, tmp_path / "validator-2.log", port, f"{step}:6")
    proc = ServiceProcess("validator", env, tmp_path / "validator-3.log", port=port).start().wait_ready()
    try:
        assert_each_event_once(prefix, proc)
    finally:
        proc.kill()
