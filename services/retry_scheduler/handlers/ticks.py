"""Ticks: redelivering what is due.

A timer sends a tick to every inbox partition this instance owns, every
``retry_tick_interval_s``. On a tick the inbox handler seeks to the partition's low-water
key, reads only the entries due now (at most ``retry_batch_limit``), redelivers them with
key, value and headers kept, waits until the broker has acknowledged every one, and only
then stages their deletes from the schedule (tombstones in the changelog), leaving in the
index a done marker that drops copies of the same dead letter read again later. A crash
before the deletes redelivers them again after the restart, with the same ``dlq.id`` and
``dlq.attempt``; a crash before the acknowledgement loses nothing, because the entry is
still stored. Nothing is deleted that was not delivered. The same tick forgets the done
markers whose time has come (the ``expiry`` table).

Under ``exactly_once`` the redeliveries (and parking-lot records) are staged on the batch
instead and go out in the transaction that also deletes their entries and writes their
done markers: committed readers of a retry topic then see each attempt once, through
crashes, and an aborted batch neither redelivers nor forgets anything.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from services.retry_scheduler.handlers.inbox_state import InboxState, now_ms
from services.retry_scheduler.handlers.kinds import KIND_TICK
from services.retry_scheduler.metrics import TICK_SECONDS
from services.retry_scheduler.scans import DueScan, scan_due
from services.retry_scheduler.state import DONE_REDELIVERED, Done, decode_index, due_prefix, history_key, id_key
from shared.engine import Engine, InputBatch
from shared.settings import Settings

log = logging.getLogger(__name__)

#: Consecutive failed redeliveries of one entry before it is parked instead.
MAX_SEND_FAILURES = 5
#: Ticks that redelivered something, kept for GET /retries/stats.
BUSY_TICKS = 64
#: How often the earliest known due time of each partition is checked against the clock (at most
#: the tick interval): what bounds how late a tick comes for an entry whose due time it knows.
DUE_CHECK_S = 0.05


@dataclass
class TickReport:
    partition: int
    at: int
    examined: int
    redelivered: int
    failed: int
    scan_seconds: float
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "at": self.at,
            "examined": self.examined,
            "redelivered": self.redelivered,
            "failed": self.failed,
            "scan_ms": round(self.scan_seconds * 1000, 3),
            "ms": round(self.seconds * 1000, 3),
        }


def next_low_water(start: bytes, now: int, scan: DueScan, failed_keys: list[bytes]) -> bytes:
    """After a tick: the key below which nothing is left (all delivered and deleted)."""
    if failed_keys:
        return min(failed_keys)
    if scan.more_due and scan.items:
        return scan.items[-1][0]
    return max(start, due_prefix(now + 1))


class Ticks:
    def __init__(self, engine: Engine, settings: Settings, state: InboxState, inbox_topic: str) -> None:
        self.engine = engine
        self.settings = settings
        self.state = state
        self.inbox_topic = inbox_topic
        self.expiry_low_water: dict[int, bytes] = {}
        self.ticker = engine.ticker(inbox_topic, KIND_TICK, interval_s=settings.retry_tick_interval_s, name="tick of inbox")
        self.last_ticks: dict[int, TickReport] = {}
        self.busy_ticks: deque[TickReport] = deque(maxlen=BUSY_TICKS)
        #: The parked retention's sweep of a partition (handlers/parking.py), set by the app.
        self.sweep_parked: Callable[[InputBatch, int], int] | None = None
        engine.timer(settings.retry_tick_interval_s, name="tick")(self.send_ticks)
        engine.timer(min(DUE_CHECK_S, settings.retry_tick_interval_s), name="tick when due")(self.send_due_ticks)

    def forget_partitions(self) -> None:
        """After a recovery: what was known of each partition may be stale."""
        self.expiry_low_water = {}
        self.ticker.forget()

    async def send_ticks(self) -> None:
        """Ask the handler to redeliver what is due, in every partition this instance owns."""
        if not self.engine.instance.ready():
            return
        await self.ticker.send_to(self.state.schedule.owned_partitions())

    async def send_due_ticks(self) -> None:
        """Tick each partition this instance owns whose earliest known entry has come due, without
        waiting for the interval's tick: a burst due at one instant is redelivered within
        :data:`DUE_CHECK_S` of it rather than up to a whole interval later. Partitions with a
        tick in flight are left to it."""
        if not self.engine.instance.ready():
            return
        now = now_ms()
        due = [p for p, at in self.state.next_due.items() if at <= now]
        if due:
            await self.ticker.send_to(set(due) & self.state.schedule.owned_partitions())

    async def tick(self, batch: InputBatch) -> None:
        state = self.state
        partition = batch.partition
        self.ticker.taken(partition)
        started = time.perf_counter()
        now = now_ms()
        limit = self.settings.retry_batch_limit
        start = state.low_water.get(partition, b"")
        scan: DueScan = scan_due(batch.view(state.schedule), now, limit, start)
        scanned = time.perf_counter()
        deliveries = await state.redeliver(batch, scan.items, trigger="tick")
        failed_keys: list[bytes] = []
        for d in deliveries:
            if d.error is None:
                state.finish(batch, d.key, d.entry, done=DONE_REDELIVERED, read=True)
                continue
            failures = state.send_failures.get(d.key, 0) + 1
            state.send_failures[d.key] = failures
            if failures >= MAX_SEND_FAILURES:
                state.finish(batch, d.key, d.entry, done=None, read=True)
                reason = f"redelivery to {d.entry.retry_topic!r} failed {failures} times: {d.error}"
                await state.park(batch, d.entry.parked(now_ms(), reason, d.entry.max_attempts))
            else:
                failed_keys.append(d.key)
        state.write_expiry(batch)
        expired = self._expire_done_markers(batch, now, limit)
        if self.sweep_parked is not None:
            self.sweep_parked(batch, now)
        state.low_water[partition] = next_low_water(start, now, scan, failed_keys)
        if scan.next_due is None or failed_keys:  # failed sends wait for the interval's ticks
            state.next_due.pop(partition, None)
        else:
            state.next_due[partition] = scan.next_due
        seconds = time.perf_counter() - started
        report = TickReport(
            partition=partition,
            at=now,
            examined=scan.examined,
            redelivered=sum(1 for d in deliveries if d.error is None),
            failed=len(failed_keys),
            scan_seconds=scanned - started,
            seconds=seconds,
        )
        self.last_ticks[partition] = report
        if report.redelivered or report.failed:
            self.busy_ticks.append(report)
        TICK_SECONDS.observe(seconds)
        if scan.more_due or expired.more_due:
            # A backlog: go on at once rather than a tick later (after this batch's commit).
            batch.send(self.inbox_topic, None, KIND_TICK, partition=partition)
            self.ticker.staged(partition)

    def _expire_done_markers(self, batch: InputBatch, now: int, limit: int) -> DueScan:
        """Forget the done markers whose time has come."""
        state = self.state
        partition = batch.partition
        start = self.expiry_low_water.get(partition, b"")
        scan = scan_due(batch.view(state.expiry), now, limit, start)
        for key, raw in scan.items:
            try:
                ids = orjson.loads(raw)
            except orjson.JSONDecodeError:
                ids = []
            for dlq_id in ids if isinstance(ids, list) else []:
                idk = id_key(str(dlq_id))
                raw_index = batch.read(state.index, idk)
                index = decode_index(raw_index) if raw_index is not None else None
                if isinstance(index, Done) and index.expiry_key == key:
                    state.delete(batch, state.index, idk)
                    state.delete(batch, state.index, history_key(str(dlq_id)))
            state.delete(batch, state.expiry, key)
        self.expiry_low_water[partition] = next_low_water(start, now, scan, [])
        return scan
