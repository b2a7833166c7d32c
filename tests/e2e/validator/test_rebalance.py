"""Rebalances while batches run: three validator instances decide commands as they arrive;
one is added and one is SIGKILLed mid-stream. Afterwards every accepted command's event is
on ``account-events`` exactly once per (account, version), in command order, no gaps."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.e2e.validator.test_validator_crash import ACCOUNTS, STEPS, RecordCount, assert_each_event_once, commands_in_order
from tests.support.kafka import produce
from tests.support.services import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FLEET_ENV = {"STATEFLEET_CONSUMER_MAX_POLL_RECORDS": "200", "STATEFLEET_SESSION_TIMEOUT_S": "6"}


def test_instances_added_and_killed_mid_stream_leave_each_event_once(start_validator: Any, prefix: str) -> None:
    stream = commands_in_order()
    instances = {n: start_validator(n, **FLEET_ENV) for n in ("a", "b", "c")}

    def feed() -> None:  # commands keep arriving across the membership changes (about 12 s)
        for n in range(0, len(stream), 40):
            produce(f"{prefix}account-commands", stream[n : n + 40])
            time.sleep(0.15)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    # The membership changes land mid-stream: one at a fifth of the events, one at two fifths.
    events = RecordCount(f"{prefix}account-events")
    wait_for(lambda: events() >= ACCOUNTS * STEPS // 5, timeout=60, interval=0.05, message="a fifth of the events")
    instances["d"] = start_validator("d", **FLEET_ENV)
    wait_for(lambda: events() >= ACCOUNTS * STEPS * 2 // 5, timeout=60, interval=0.05, message="two fifths of the events")
    instances.pop("b").kill()
    events.close()
    feeder.join(120)
    assert not feeder.is_alive()
    assert_each_event_once(prefix, instances["a"])
