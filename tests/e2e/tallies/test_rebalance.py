"""Rebalances while batches run: three tallies instances share the input as it arrives; one
is added and one is SIGKILLed mid-stream, so partitions move while batches are being
handled and committed. Afterwards every tally is exact, over HTTP from any instance and on
``program-tallies``: no record skipped at a hand-over, none applied twice."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.e2e.tallies.test_tallies_e2e import all_tallies, assert_tallies_settle, latest_published
from tests.support.accounts import generate
from tests.support.kafka import produce
from tests.support.services import ServiceProcess, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: Small fetches and a short session timeout: many batches, and a killed member's
#: partitions move within seconds.
FLEET_ENV = {"STATEFLEET_CONSUMER_MAX_POLL_RECORDS": "300", "STATEFLEET_SESSION_TIMEOUT_S": "6"}


def test_instances_added_and_killed_mid_stream_keep_exact_tallies(start_tallies: Any, tally_topics: dict[str, str]) -> None:
    history = generate(programs=40, accounts_per_program=150, seed=41, logins_per_program=30)
    stream = [("events", k, v) for k, v in history.events] + [("logins", k, v) for k, v in history.logins]
    stream.sort(key=lambda r: hash(r[1]) % 7)  # logins among the events; each account's events keep their order
    instances: dict[str, ServiceProcess] = {n: start_tallies(n, **FLEET_ENV) for n in ("a", "b", "c")}

    fed = [0]  # records sent so far
    # The second half waits for the kill: however long the starts take, input still arrives after it.
    held_from, killed = len(stream) // 2, threading.Event()

    def feed() -> None:  # input keeps arriving across the membership changes (about 13 s)
        for n in range(0, len(stream), 400):
            if n >= held_from:
                killed.wait(180)
            part = stream[n : n + 400]
            for kind in ("events", "logins"):
                records = [(k, v) for t, k, v in part if t == kind]
                if records:
                    produce(tally_topics[kind], records)
            fed[0] = n + len(part)
            time.sleep(0.35)  # paces the input, so that it spans the membership changes

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    # The membership changes land mid-stream: one at a sixth of the input, one a twelfth later
    # (or at half of it, where the input waits for the kill).
    wait_for(lambda: fed[0] >= len(stream) // 6, timeout=60, interval=0.05, message="a sixth of the input sent")
    instances["d"] = start_tallies("d", **FLEET_ENV)  # added: partitions move to it mid-stream
    kill_at = min(fed[0] + len(stream) // 12, held_from)
    wait_for(lambda: fed[0] >= kill_at, timeout=60, interval=0.05, message="more input sent with d in the group")
    instances.pop("a").kill()  # killed: its partitions move once its session times out
    killed.set()
    feeder.join(120)
    assert not feeder.is_alive()

    expected = history.expected
    survivor = instances["b"]

    assert_tallies_settle(survivor, expected)
    for proc in instances.values():  # every live instance answers every program alike
        assert all_tallies(proc, limit=100) == expected
    wait_for(
        lambda: latest_published(tally_topics["tallies"]) == expected,
        timeout=60,
        message="program-tallies to hold the exact tallies",
    )
