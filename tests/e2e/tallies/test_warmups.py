"""Warm-up copies: an instance that joins takes a partition over only once it holds a
caught-up copy of it; until then the owner keeps it and the newcomer warms a standby up."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.e2e.tallies.test_reads_from_copies import Reader
from tests.e2e.tallies.test_tallies_e2e import all_tallies, assert_tallies_settle
from tests.support.accounts import generate
from tests.support.kafka import produce
from tests.support.services import ServiceProcess, wait_for
from tools import web

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: Small enough that the test's changelogs (about 60 rows a partition) count as behind.
ENV = {"STATEFLEET_WARMUP_MAX_LAG": "5"}


def settled(procs: list[ServiceProcess]) -> bool:
    """Every instance ready and owning input partitions, and no warm-up pending."""
    for proc in procs:
        body = web.get(proc.url + "/instance", timeout=5).json()
        if not body["ready"] or body["rebalancing"] or body["warmup"] or not body["active"]:
            return False
    return True


def owned_changelog_partitions(proc: ServiceProcess) -> set[int]:
    body = web.get(proc.url + "/instance", timeout=5).json()
    return {p for topic, parts in body["active"].items() if topic.endswith("memberships-changelog") for p in parts}


def test_a_new_instance_warms_up_before_it_takes_partitions_over(start_tallies: Any, tally_topics: dict[str, str]) -> None:
    history = generate(programs=40, accounts_per_program=12, seed=29, logins_per_program=4)
    procs = [start_tallies(n, **ENV) for n in ("a", "b")]
    produce(tally_topics["events"], history.events)
    produce(tally_topics["logins"], history.logins)
    assert_tallies_settle(procs[0], history.expected)
    wait_for(lambda: settled(procs), timeout=90, message="a and b to settle")
    with Reader(procs, history.expected) as reader:
        newcomer = start_tallies("c", **ENV)
        wait_for(lambda: settled([*procs, newcomer]), timeout=120, message="c to warm up and take partitions over")
        target = reader.answered + len(history.expected)
        wait_for(lambda: reader.answered >= target, timeout=60, message="a round of reads after the hand-over")
    assert not reader.failed, f"{len(reader.failed)} reads failed: {reader.failed[:5]}"

    logs = "".join(p.log_path.read_text(errors="replace") for p in [*procs, newcomer])
    warmed = {
        int(p)
        for found in re.findall(rf"{re.escape(newcomer.url)} warms up \S+memberships-changelog \[([\d, ]+)\]", logs)
        for p in found.split(", ")
    }
    moved = {
        int(p)
        for p in re.findall(
            rf"memberships-changelog\[(\d+)\] moves from \S+ to {re.escape(newcomer.url)}, which holds a caught-up copy", logs
        )
    }
    owned = owned_changelog_partitions(newcomer)
    assert warmed, "c was not given warm-up copies when it joined"
    assert owned, "c never took a partition over"
    assert owned <= moved, f"c owns {sorted(owned)} but only {sorted(moved)} were handed to it as caught up"
    assert all_tallies(newcomer, limit=100) == history.expected
