"""SIGKILL the validator at each step of a batch's commit (see
``tests/e2e/tallies/test_commit_crashes.py``): twice per step while it decides a backlog
(once keeping its local state, once losing it), then to the end. Afterwards every
accepted command's event is on ``account-events`` exactly once per (account, version),
in command order, with no gaps and no rejection. With exactly_once, a read_committed
consumer of ``account-events`` and of the command outcomes sees every record exactly once:
no repeat, whatever step the worker died at."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import orjson
import pytest

from tests.e2e.validator.test_validator_crash import assert_each_event_once, commands_in_order, is_end_marker
from tests.support.kafka import create_topics, produce, read_all
from tests.support.services import ServiceProcess, free_port, run_until_killed

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
@pytest.mark.parametrize("step", ["handled", "sent", "logged"])
def test_sigkill_at_each_commit_step_leaves_each_event_once(
    step: str, guarantee: str, service_env: dict[str, str], prefix: str, tmp_path: Path
) -> None:
    stream = commands_in_order()
    half = len(stream) // 2
    create_topics([f"{prefix}account-commands"])  # as the validator creates it: 8 partitions
    produce(f"{prefix}account-commands", stream[:half])
    env = {
        **service_env,
        "STATEFLEET_INSTANCE_ID": "c",
        "STATEFLEET_CONSUMER_MAX_POLL_RECORDS": "200",
        "STATEFLEET_PROCESSING_GUARANTEE": guarantee,
    }
    port = free_port()
    run_until_killed("validator", env, tmp_path / "validator-1.log", port, f"{step}:3")
    produce(f"{prefix}account-commands", stream[half:])
    shutil.rmtree(Path(service_env["STATEFLEET_DATA_DIR"]) / "validator" / "c")
    run_until_killed("validator", env, tmp_path / "validator-2.log", port, f"{step}:6")
    proc = ServiceProcess("validator", env, tmp_path / "validator-3.log", port=port).start().wait_ready()
    try:
        if guarantee == "at_least_once":
            assert_each_event_once(prefix, proc)
        else:
            assert_exactly_once(prefix, proc)
    finally:
        proc.kill()


def assert_exactly_once(prefix: str, proc: ServiceProcess) -> None:
    """Every check of the at-least-once run, read committed, and then no repeat at all: each event
    record once, and each command's final outcome record once."""
    events, by_id = assert_each_event_once(prefix, proc, isolation_level="read_committed")
    assert len(events) == len(by_id), f"{len(events) - len(by_id)} repeated event records seen read_committed"
    outcomes = [
        orjson.loads(r.body) for r in read_all(f"{prefix}statefleet-validator-outcomes", isolation_level="read_committed")
    ]
    final = Counter(o["command_id"] for o in outcomes if o.get("status") != "pending" and not is_end_marker(o["command_id"]))
    assert len(final) == len(by_id), "every command has a final outcome"
    repeated = {command: n for command, n in final.items() if n > 1}
    assert repeated == {}, f"final outcomes repeated: {list(repeated.items())[:5]}"
