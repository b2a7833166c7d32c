"""The category projection (GET /programs/{program_id}/accounts): every account of a
program with its status, kept in ``program-accounts`` and listed newest first.

``route_events`` (``account-events``) re-keys each event by its program onto the internal
``…-by-program`` topic, and ``project`` applies it to the program's listing there. Events
are read with :func:`shared.accounts.parse_event`, as every reader of the topic reads them:
one that breaks the Event shape is a dead letter (``InvalidEvent``, parked at once by the
retry scheduler) and is never listed.
"""

from __future__ import annotations

import logging

from services.validator.handlers.topics import ValidatorTopics
from services.validator.listing import Listing, apply_to_listing
from services.validator.state import decode_listing, encode_listing, index_key, listing_key, pack_ts, program_prefix, unpack_ts
from shared import codecs
from shared.accounts import AccountChange, InvalidEvent, parse_event
from shared.engine import Engine, InputBatch, partition_for
from shared.settings import Settings

log = logging.getLogger(__name__)


def encode_routed(change: AccountChange) -> bytes:
    return codecs.dumps(
        {"a": change.account_id, "p": change.program_id, "t": change.type, "v": change.version, "o": change.occurred_at}
    )


def decode_routed(raw: bytes | None) -> AccountChange:
    obj = codecs.loads_object(raw)
    return AccountChange(account_id=obj["a"], program_id=obj["p"], type=obj["t"], version=obj["v"], occurred_at=obj["o"])


def send_routed(input_batch: InputBatch, topics: ValidatorTopics, change: AccountChange) -> None:
    """Stage ``change`` onto the projection's second hop, keyed by its program."""
    input_batch.send(topics.by_program, change.program_id.encode(), encode_routed(change))


class ProgramListings:
    def __init__(self, engine: Engine, settings: Settings, topics: ValidatorTopics) -> None:
        self.topics = topics
        self.partitions = settings.topic_partitions
        self.store = engine.table("program-accounts")
        engine.handler(
            topics.events, name="events", offsets=self.store, dead_letters=topics.dead_letter_route(), sends=(topics.by_program,)
        )(self.route_events)
        engine.handler(topics.by_program, name="by-program", offsets=self.store, internal_partitions=self.partitions, sends=())(
            self.project
        )

    async def route_events(self, input_batch: InputBatch) -> None:
        for record in input_batch.records:
            try:
                change = parse_event(codecs.loads_object(record.value))
            except (codecs.DecodeError, InvalidEvent) as exc:
                input_batch.dead_letter(record, exc)
                continue
            send_routed(input_batch, self.topics, change)

    async def project(self, input_batch: InputBatch) -> None:
        for record in input_batch.records:
            try:
                change = decode_routed(record.value)
            except (codecs.DecodeError, KeyError):
                log.warning(
                    "skipping a by-program record that is not one this service wrote at %s[%s]@%s",
                    record.topic,
                    record.partition,
                    record.offset,
                )
                continue
            self.apply_listing_change(input_batch, change)

    def apply_listing_change(self, input_batch: InputBatch, change: AccountChange) -> None:
        """Stage the rows ``change`` writes (read against this batch's earlier writes)."""
        store = self.store
        idx = index_key(change.program_id, change.account_id)
        created = input_batch.read(store, idx)
        current = None
        if created is not None:
            raw = input_batch.read(store, listing_key(change.program_id, unpack_ts(created), change.account_id))
            current = decode_listing(change.program_id, raw) if raw is not None else None
        updated = apply_to_listing(current, change)
        if updated is None:
            return
        if created is None:
            input_batch.write(store, idx, pack_ts(updated.created_at))
        input_batch.write(store, listing_key(change.program_id, updated.created_at, change.account_id), encode_listing(updated))

    def list_program(
        self, program_id: str, *, limit: int, before: bytes | None, status: str | None
    ) -> tuple[list[Listing], bool]:
        """Up to ``limit`` of the program's accounts, newest first, strictly before the
        listing key ``before``; and whether more follow."""
        prefix = program_prefix(program_id)
        partition = partition_for(program_id, self.partitions)
        start = before if before is not None else prefix + b"\xff" * 9
        items: list[Listing] = []
        for key, raw in self.store.items(partition, from_key=start, backwards=True):
            if not key.startswith(prefix):
                break
            if before is not None and key >= before:
                continue
            item = decode_listing(program_id, raw)
            if status is not None and item.status != status:
                continue
            if len(items) == limit:
                return items, True
            items.append(item)
        return items, False
