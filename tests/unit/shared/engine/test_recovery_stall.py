"""The log of a table recovery that applied nothing: every active changelog partition left to
read, each with what the consumer holds for it, asked side by side (see
``BulkRestoringRecovery._report_stalled_recovery`` in ``shared/engine/_restore.py``)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import pytest
from faust.types import TP

from shared.engine._restore import BulkRestoringRecovery
from tests.unit.shared.engine.test_standby_resume import App, Tables

STALLED = [TP("svc-accounts-changelog", 0), TP("svc-accounts-changelog", 1), TP("svc-accounts-changelog", 2)]


async def test_a_stalled_recovery_logs_every_partition_left_asking_for_their_states_together(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = App()
    recovery = BulkRestoringRecovery(cast(Any, app), cast(Any, Tables(app.changelog_queue)))
    recovery.in_recovery = True
    for tp in STALLED:
        recovery.active_tps.add(tp)
        recovery.active_offsets[tp] = 3
        recovery.active_highwaters[tp] = 10
    asked: list[TP] = []
    all_asked = asyncio.Event()

    async def state_of(tp: TP) -> str:
        asked.append(tp)
        if len(asked) == len(STALLED):
            all_asked.set()
        await all_asked.wait()  # answered only once every partition was asked: one after another would never end
        return f"{tp.topic}[{tp.partition}] stuck"

    recovery._changelog_state = state_of  # type: ignore[method-assign]
    # The timer's own step (mode wraps it in a repeating task).
    report = vars(BulkRestoringRecovery)["_report_stalled_recovery"].fun.__wrapped__
    await report(recovery)  # the first check notes where the recovery stands
    assert not [r for r in caplog.records if "applied nothing" in r.getMessage()]
    with caplog.at_level(logging.WARNING, logger="shared.engine._restore"):
        await asyncio.wait_for(report(recovery), 5.0)  # nothing moved since: the log
    (line,) = [r.getMessage() for r in caplog.records if "applied nothing" in r.getMessage()]
    assert line.endswith("; ".join(f"{tp.topic}[{tp.partition}] stuck" for tp in STALLED))
