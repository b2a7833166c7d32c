"""A copy's lag is computed from a changelog end the broker gave recently; an older one
(a process that was stopped, a broker that does not answer) gives no lag at all."""

from __future__ import annotations

import asyncio
import time

from faust.types import TP

from shared.engine._copies import END_MAX_AGE_S, END_TRUSTED_S, _ChangelogEnds
from shared.settings import Settings

TOPIC = "t-changelog"


def ends_known(ago_s: float) -> _ChangelogEnds:
    ends = _ChangelogEnds(Settings())
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
