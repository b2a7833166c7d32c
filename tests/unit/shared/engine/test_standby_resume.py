"""A standby keeps every changelog record it was fetched when Faust's recovery completes.

Faust resumes the standby changelog partitions, then completes the recovery, which resumes
the app's flow control and so empties the tables' changelog queue. Records fetched for a
standby in between were dropped past the consumer's position: a standby built from offset 0
lost its whole first fetch, and once promoted served the rows after it only (found by the
three-node exactly_once chaos run, docs/reliability.md). Here a consumer that fetches into
Faust's own flow-controlled queue stands in for the broker, and Faust's own completion runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from types import SimpleNamespace
from typing import Any, cast

from faust.types import TP
from mode.utils.queues import FlowControlEvent, FlowControlQueue

from shared.engine._restore import BulkRestoringRecovery

STANDBY = TP("svc-accounts-changelog", 3)
ACTIVE = TP("svc-accounts-changelog", 1)
INPUT = TP("account-commands", 1)
LOG_END = 10


class LogConsumer:
    """A consumer over one standby changelog partition of ``LOG_END`` records: :meth:`fetch`
    puts what the position and pauses allow into the queue, as Faust's fetcher does."""

    def __init__(self, queue: FlowControlQueue[Any]) -> None:
        self.queue = queue
        self.position = {STANDBY: 0}
        self.paused: set[TP] = set()

    def fetch(self) -> None:
        for tp, position in self.position.items():
            if tp in self.paused:
                continue
            for offset in range(position, LOG_END):
                self.queue.put_nowait(SimpleNamespace(message=SimpleNamespace(tp=tp, offset=offset)))
            self.position[tp] = LOG_END

    def pause_partitions(self, tps: Iterable[TP]) -> None:
        self.paused |= set(tps)

    def resume_partitions(self, tps: Iterable[TP]) -> None:
        self.paused -= set(tps)

    async def seek_wait(self, offsets: Mapping[TP, int]) -> None:
        self.position.update(offsets)

    def assignment(self) -> set[TP]:
        return {STANDBY, ACTIVE, INPUT}

    async def perform_seek(self) -> None:
        self.fetch()  # Faust's fetcher runs on while the stream partitions are sought

    def resume_flow(self) -> None:
        pass


class App:
    """What Faust's recovery completion reads of its app."""

    def __init__(self) -> None:
        self.conf = SimpleNamespace(stream_recovery_delay=0.0, broker_request_timeout=5.0)
        self.flow_control = FlowControlEvent()
        self.changelog_queue: FlowControlQueue[Any] = FlowControlQueue(flow_control=self.flow_control, clear_on_resume=True)
        self.consumer = LogConsumer(self.changelog_queue)
        self.consumer_generation_id = 4
        self.in_recovery = True
        self.on_rebalance_complete = SimpleNamespace(send=self._nothing)
        self.assignor = SimpleNamespace(assigned_standbys=lambda: {STANDBY})
        self._fetcher = SimpleNamespace(maybe_start=self._nothing)  # Faust reads it as private

    async def _nothing(self) -> None:
        pass

    def on_rebalance_end(self) -> None:
        pass


class Tables(dict[str, Any]):
    def __init__(self, queue: FlowControlQueue[Any]) -> None:
        super().__init__()
        self.changelog_queue = queue
        self.changelog_topics = {STANDBY.topic}

    def on_actives_ready(self) -> None:
        pass

    def on_standbys_ready(self) -> None:
        pass


def taken_in(recovery: BulkRestoringRecovery, queue: FlowControlQueue[Any]) -> list[int]:
    """What Faust's changelog reader applies from the queue: offsets past the last one seen."""
    applied = []
    while not queue.empty():
        offset = queue.get_nowait().message.offset
        if offset > recovery.standby_offsets[STANDBY]:
            recovery.standby_offsets[STANDBY] = offset
            applied.append(offset)
    return applied


async def test_records_fetched_for_a_standby_before_the_recovery_completes_are_read_again() -> None:
    app = App()
    recovery = BulkRestoringRecovery(cast(Any, app), cast(Any, Tables(app.changelog_queue)))
    recovery.standby_tps.add(STANDBY)
    recovery.standby_offsets[STANDBY] = -1  # built from the changelog's start

    # Faust has resumed the standby: its first fetch arrives, and the reader takes in part of it
    app.consumer.fetch()
    applied = [offset for offset in taken_in(recovery, app.changelog_queue) if offset < 3]
    recovery.standby_offsets[STANDBY] = applied[-1]
    assert app.changelog_queue.empty()
    app.consumer.position[STANDBY] = 3
    app.consumer.fetch()  # offsets 3..9 wait in the queue
    assert app.changelog_queue.qsize() == LOG_END - 3

    await recovery.on_recovery_completed(generation_id=4)
    assert recovery.completed.is_set()
    assert STANDBY not in app.consumer.paused

    app.consumer.fetch()
    applied += taken_in(recovery, app.changelog_queue)
    assert applied == list(range(LOG_END))


async def test_a_standby_is_left_paused_for_the_next_recovery_when_another_rebalance_came() -> None:
    app = App()
    recovery = BulkRestoringRecovery(cast(Any, app), cast(Any, Tables(app.changelog_queue)))
    recovery.standby_tps.add(STANDBY)
    recovery.standby_offsets[STANDBY] = -1
    app.consumer_generation_id = 5  # the next rebalance's recovery seeks and resumes the standby

    await asyncio.wait_for(recovery.on_recovery_completed(generation_id=4), 5)
    assert not recovery.completed.is_set()
    assert STANDBY in app.consumer.paused
