"""Hop 2: ``process_inbox``, the only handler that changes state.

Per inbox partition it handles, in order: dead letters (:meth:`Inbox.ingest`: schedule, or
park when out of attempts), ticks (:mod:`~services.retry_scheduler.handlers.ticks`), and
replay / cancel / unpark commands sent by the HTTP API, for one message or for a group of
parked ones (:mod:`~services.retry_scheduler.handlers.commands`).
"""

from __future__ import annotations

import logging

import orjson

from services.retry_scheduler.entries import Decided, decode_decided, decode_entry
from services.retry_scheduler.handlers.commands import HttpCommands
from services.retry_scheduler.handlers.inbox_state import InboxState, now_ms
from services.retry_scheduler.handlers.kinds import COMMANDS, KIND_DECIDED, KIND_GROUP, KIND_LETTER, KIND_TICK
from services.retry_scheduler.handlers.routing import Routing
from services.retry_scheduler.handlers.ticks import Ticks
from services.retry_scheduler.metrics import DUPLICATES, SCHEDULED
from services.retry_scheduler.state import DONE_KINDS, Done, due_key, id_key
from shared.engine import Engine, InputBatch

log = logging.getLogger(__name__)


class Inbox:
    def __init__(
        self,
        engine: Engine,
        state: InboxState,
        routing: Routing,
        ticks: Ticks,
        commands: HttpCommands,
        inbox_topic: str,
        partitions: int,
    ) -> None:
        self.state = state
        self.routing = routing
        self.ticks = ticks
        self.commands = commands
        # Every table the inbox handler writes keeps a copy of its next offsets, written with
        # the batch's rows; the input resumes from the smallest.
        engine.handler(inbox_topic, name="inbox", internal_partitions=partitions, offsets=state.stores)(self.process_inbox)

    async def process_inbox(self, batch: InputBatch) -> None:
        for record in batch.records:
            value = record.value
            kind = value[:1] if isinstance(value, bytes) else b""
            try:
                if kind == KIND_DECIDED:
                    await self.ingest(batch, decode_decided(value[1:]))  # type: ignore[index]
                elif kind == KIND_LETTER:
                    entry = self.routing.decide_fate(decode_entry(value[1:]), now_ms())  # type: ignore[index]
                    await self.ingest(batch, Decided.of(entry))
                elif kind == KIND_TICK:
                    await self.ticks.tick(batch)
                elif kind in COMMANDS:
                    await self.commands.command(batch, kind, orjson.loads(value[1:]))  # type: ignore[index]
                elif kind == KIND_GROUP:
                    await self.commands.group_command(batch, orjson.loads(value[1:]))  # type: ignore[index]
                else:
                    log.warning("ignoring inbox record of unknown kind %r at offset %s", kind, record.offset)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning(
                    "ignoring malformed inbox record at %s[%s]@%s: %s", record.topic, record.partition, record.offset, exc
                )

    async def ingest(self, batch: InputBatch, letter: Decided) -> None:
        """Store a decided dead letter, unless that attempt of its id is already stored or done."""
        state = self.state
        partition = batch.partition
        dlq_id = letter.id
        idk = id_key(dlq_id)
        current = state.index_state(batch, idk)
        if isinstance(current, Done):
            if letter.attempt <= current.attempt:
                DUPLICATES.labels(DONE_KINDS[current.kind]).inc()  # that attempt is already done
                return
        elif current is not None:
            current_key, _, current_entry = current
            if current_entry.attempt > letter.attempt:
                DUPLICATES.labels("stale").inc()
                return
            if current_entry.attempt == letter.attempt:
                DUPLICATES.labels("scheduled").inc()  # the same dead letter again: already scheduled
                return
            state.finish(batch, current_key, current_entry, done=None)
        if letter.parked:
            parked_raw = batch.read(state.parked, idk)
            if parked_raw is not None and decode_entry(parked_raw).attempt > letter.attempt:
                DUPLICATES.labels("stale").inc()
                return
        stored = letter.stored
        if isinstance(current, Done):  # back after a redelivery: it takes its history along
            stored = state.carry_history(batch, dlq_id, stored)
        if letter.parked:
            await state.park(batch, decode_entry(stored))
            return
        key = due_key(letter.due_at, dlq_id)
        batch.write(state.schedule, key, stored)
        batch.write(state.index, idk, key)
        state.counts.add("scheduled", partition, letter.counted_as)
        low = state.low_water.get(partition)
        if low is not None and key < low:
            state.low_water[partition] = key
        SCHEDULED.inc()
        state.totals["scheduled"] += 1
