"""Hop 2: ``process_inbox``, the only handler that changes state.

Per inbox partition it handles, in order: dead letters
(:meth:`~services.retry_scheduler.handlers.inbox_state.InboxState.store_decided`: schedule, or
park when out of attempts), ticks (:mod:`~services.retry_scheduler.handlers.ticks`), and
replay / cancel / unpark commands sent by the HTTP API, for one message or for a group of
parked ones (:mod:`~services.retry_scheduler.handlers.commands`), and, for ordered topics,
dead letters placed by their lane, acknowledgements and lane commands
(:mod:`~services.retry_scheduler.handlers.ordered`).
"""

from __future__ import annotations

import logging

import orjson

from services.retry_scheduler.entries import Decided, decode_decided, decode_entry, unpack_decided
from services.retry_scheduler.handlers.commands import HttpCommands
from services.retry_scheduler.handlers.inbox_state import InboxState, now_ms
from services.retry_scheduler.handlers.kinds import (
    COMMANDS,
    KIND_ACK,
    KIND_DECIDED,
    KIND_DECIDED_PACK,
    KIND_GROUP,
    KIND_LANE,
    KIND_LETTER,
    KIND_ORDERED,
    KIND_TICK,
)
from services.retry_scheduler.handlers.ordered import OrderedLanes, decode_ack, decode_ordered_letter
from services.retry_scheduler.handlers.routing import Routing
from services.retry_scheduler.handlers.ticks import Ticks
from shared.engine import Engine, InputBatch, Record

log = logging.getLogger(__name__)


class Inbox:
    def __init__(
        self,
        engine: Engine,
        state: InboxState,
        routing: Routing,
        ticks: Ticks,
        commands: HttpCommands,
        ordered: OrderedLanes,
        inbox_topic: str,
        partitions: int,
    ) -> None:
        self.state = state
        self.routing = routing
        self.ticks = ticks
        self.commands = commands
        self.ordered = ordered
        # Every table the inbox handler writes keeps a copy of its next offsets, written with
        # the batch's rows; the input resumes from the smallest.
        engine.handler(
            inbox_topic,
            name="inbox",
            internal_partitions=partitions,
            offsets=state.stores,
            # redeliveries go to each letter's retry topic; parked letters, ordered keys' state
            # and the inbox's own follow-ups (ticks, groups, lanes) to the others
            sends=("<dlq.retry.topic>", routing.topics.parking_lot, ordered.blocked_keys_topic, inbox_topic),
        )(self.process_inbox)

    async def process_inbox(self, batch: InputBatch) -> None:
        packed = 0  # letters beyond one per record, for the processed-messages count
        for record in batch.records:
            value = record.value
            kind = value[:1] if isinstance(value, bytes) else b""
            try:
                if kind == KIND_DECIDED_PACK:
                    packed += await self.store_pack(batch, record, value[1:]) - 1  # type: ignore[index]
                elif kind == KIND_DECIDED:
                    await self.state.store_decided(batch, decode_decided(value[1:]))  # type: ignore[index]
                elif kind == KIND_LETTER:
                    entry = self.routing.decide_fate(decode_entry(value[1:]), now_ms())  # type: ignore[index]
                    await self.state.store_decided(batch, Decided.of(entry))
                elif kind == KIND_TICK:
                    await self.ticks.tick(batch)
                elif kind in COMMANDS:
                    await self.commands.command(batch, kind, orjson.loads(value[1:]))  # type: ignore[index]
                elif kind == KIND_GROUP:
                    await self.commands.group_command(batch, orjson.loads(value[1:]))  # type: ignore[index]
                elif kind == KIND_ORDERED:
                    await self.ordered.ingest(batch, *decode_ordered_letter(value[1:]))  # type: ignore[index]
                elif kind == KIND_ACK:
                    await self.ordered.ack(batch, *decode_ack(value[1:]))  # type: ignore[index]
                elif kind == KIND_LANE:
                    await self.commands.lane_command(batch, orjson.loads(value[1:]))  # type: ignore[index]
                else:
                    log.warning("ignoring inbox record of unknown kind %r at offset %s", kind, record.offset)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning(
                    "ignoring malformed inbox record at %s[%s]@%s: %s", record.topic, record.partition, record.offset, exc
                )
        if packed:
            batch.counted = len(batch.records) + packed

    async def store_pack(self, batch: InputBatch, record: Record, pack: bytes) -> int:
        """Store each letter of a pack, in order; how many it holds. A malformed letter is
        logged and skipped: the pack's other letters are stored all the same."""
        letters = unpack_decided(pack)
        for i, decided in enumerate(letters):
            try:
                letter = decode_decided(decided)
            except ValueError as exc:
                where = f"{record.topic}[{record.partition}]@{record.offset}"
                log.warning("ignoring malformed letter %d of the pack at %s: %s", i, where, exc)
                continue
            await self.state.store_decided(batch, letter)
        return len(letters)
