"""Switching a running deployment between at_least_once and exactly_once is a rolling
restart with the new setting (docs/architecture.md, "Exactly-once"): for a while both kinds of instance
share the consumer group, then only the new kind is left. Here: at_least_once → exactly_once
→ at_least_once, with commands arriving throughout; afterwards every command's event is on
``account-events`` once per (account, version), in order, read committed."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.e2e.validator.test_validator_crash import assert_each_event_once, commands_in_order
from tests.support.kafka import create_topics, produce
from tests.support.services import ServiceProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_a_rolling_switch_of_the_guarantee_and_back_keeps_each_event_once(
    start_validator: Callable[..., ServiceProcess], prefix: str
) -> None:
    stream = commands_in_order()
    third = len(stream) // 3
    create_topics([f"{prefix}account-commands"])
    produce(f"{prefix}account-commands", stream[:third])
    running = {name: start_validator(name, STATEFLEET_PROCESSING_GUARANTEE="at_least_once") for name in "ab"}

    def roll(guarantee: str) -> None:
        """Restart each instance in turn with ``guarantee`` (SIGTERM, then start it again)."""
        for name in "ab":
            running[name].stop()
            running[name] = start_validator(name, STATEFLEET_PROCESSING_GUARANTEE=guarantee)

    roll("exactly_once")  # for a while one instance of each kind shares the group
    produce(f"{prefix}account-commands", stream[third : 2 * third])
    roll("at_least_once")
    produce(f"{prefix}account-commands", stream[2 * third :])
    events, by_id = assert_each_event_once(prefix, running["a"], isolation_level="read_committed")
    # Graceful stops commit what they processed: nothing is processed twice.
    assert len(events) == len(by_id), f"{len(events) - len(by_id)} repeated event records"
