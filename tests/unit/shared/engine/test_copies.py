"""A copy's lag is computed from a changelog end the broker gave recently; an older one
(a process that was stopped, a broker that does not answer) gives no lag at all."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any, cast

from faust.types import TP

from shared.engine import _copies
from shared.engine._copies import END_MAX_AGE_S, END_TRUSTED_S, ChangelogEnds, Copy, local_copy
from shared.settings import Settings

TOPIC = "t-changelog"


def ends_known(ago_s: float) -> ChangelogEnds:
    ends = ChangelogEnds(Settings())
    ends._ends[TP(TOPIC, 0)] = 120
    ends._asked[TOPIC] = time.monotonic() - ago_s

    async def unanswered(topic: str, partitions: int) -> None:
        raise ConnectionError("no broker")

    ends._refresh = unanswered  # type: ignore[method-assign]
    return ends


def test_a_recent_end_stands_while_the_broker_does_not_answer() -> None:
    ends = ends_known(ago_s=(END_MAX_AGE_S + END_TRUSTED_S) / 2)
    assert asyncio.run(ends.end(TP(TOPIC, 0), 1)) == 120


def test_an_end_older_than_the_trusted_age_gives_no_lag() -> None:
    ends = ends_known(ago_s=END_TRUSTED_S + 15)
    assert asyncio.run(ends.end(TP(TOPIC, 0), 1)) is None


def test_a_worker_shutting_down_answers_with_what_it_knew() -> None:
    ends = ends_known(ago_s=END_TRUSTED_S + 15)
    ends._stopped = True
    assert asyncio.run(ends.end(TP(TOPIC, 0), 1)) == 120


class FakeTable:
    def __init__(self, partitions: int | None, name: str = "t") -> None:
        self.partitions = partitions
        self.name = name


def test_a_copy_is_as_fresh_as_the_least_fresh_of_its_co_partitioned_tables(monkeypatch: Any) -> None:
    """A tally reads memberships and last-logins of one partition, restored each at its own pace:
    an instance restoring the partition has no copy that is caught up until both are."""
    memberships, logins, elsewhere = FakeTable(None), FakeTable(8), FakeTable(4)
    app: Any = SimpleNamespace(tables={"m": memberships, "l": logins, "e": elsewhere}, conf=SimpleNamespace(topic_partitions=8))
    copies: dict[FakeTable, Copy | None] = {memberships: Copy("restoring", 0), logins: Copy("restoring", 12), elsewhere: None}

    async def table_copy(app: Any, table: FakeTable, partition: int, *, exact: bool = False) -> Copy | None:
        return copies[table]

    monkeypatch.setattr(_copies, "_table_copy", table_copy)
    assert asyncio.run(local_copy(app, cast(Any, memberships), 3)) == Copy("restoring", 12)
    assert asyncio.run(local_copy(app, cast(Any, logins), 3)) == Copy("restoring", 12)
    copies[logins] = Copy("restoring", None)
    assert asyncio.run(local_copy(app, cast(Any, memberships), 3)) == Copy("restoring", None)
    copies[logins] = None
    assert asyncio.run(local_copy(app, cast(Any, memberships), 3)) is None
    copies[memberships], copies[logins] = Copy("active", 0), Copy("active", 0)
    assert asyncio.run(local_copy(app, cast(Any, memberships), 3)) == Copy("active", 0)


def test_a_measure_of_every_table_looks_at_each_copy_once(monkeypatch: Any) -> None:
    """The warm-up check measures every partition of every table: with what was measured kept,
    a co-partitioned table's copy is looked at once per pass, not once per table it is read with."""
    memberships, logins = FakeTable(None, "memberships"), FakeTable(8, "last-logins")
    app: Any = SimpleNamespace(tables={"m": memberships, "l": logins}, conf=SimpleNamespace(topic_partitions=8))
    looked_at: list[tuple[str, int]] = []

    async def table_copy(app: Any, table: FakeTable, partition: int, *, exact: bool = False) -> Copy | None:
        looked_at.append((table.name, partition))
        return Copy("standby", 2 if table is logins else 1)

    monkeypatch.setattr(_copies, "_table_copy", table_copy)
    measured: dict[tuple[str, int], Copy | None] = {}
    for table in (memberships, logins):
        for partition in (0, 1):
            assert asyncio.run(local_copy(app, cast(Any, table), partition, measured=measured)) == Copy("standby", 2)
    assert sorted(looked_at) == sorted({(t, p) for t in ("memberships", "last-logins") for p in (0, 1)})
    assert len(looked_at) == 4
