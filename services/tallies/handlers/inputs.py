"""Hop 1 of the tallies: ``route_inputs`` reads the projection's input topics (``account-events``,
``logins`` for the accounts) and the service's retry topic, validates each record with the
projection's reader (events as every reader of ``account-events`` does, through
:func:`shared.accounts.parse_event`; bad ones become dead letters, with the original topic,
partition and offset, and are never counted), and forwards them to the internal
``…-by-program`` topic, packed: one record per program partition per batch
(:class:`~services.tallies.state.PackedInputs`). It keeps no state of its own: its next offsets
are rows of ``memberships``, so they move with the partition and are restored with it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from services.tallies.domain import PROJECTION
from services.tallies.state import ProgramCounts, pack_by_partition, service_name
from shared import codecs, dead_letters
from shared.engine import DeadLetterRoute, Engine, InputBatch, Table
from shared.projection import Change, InvalidInput, Mark, Projection, Reader
from shared.topics import TopicNames

log = logging.getLogger(__name__)


def parse_input(
    topic: str, value: bytes | None, headers: Any, topics: TopicNames, projection: Projection = PROJECTION
) -> Change | Mark:
    """Validate one input record; the topic (or, for a retry, its original topic) says what it is."""
    origin = topic
    if topic == topics.service_retry(service_name(projection)):
        origin = dead_letters.headers_dict(dead_letters.header_items(headers)).get(dead_letters.ORIGINAL_TOPIC, "")
    parse = parser_for(origin, topics, projection)
    if parse is None:
        raise InvalidInput(f"cannot tell what a record from topic {origin!r} is")
    return parse(value)


def parser_for(
    origin: str, topics: TopicNames, projection: Projection = PROJECTION
) -> Callable[[bytes | None], Change | Mark] | None:
    """How a record from topic ``origin`` is read (None: no input of this service comes from there)."""
    read = projection.reader_for(origin, topics.prefix)
    return None if read is None else _decoding(read)


def _decoding(read: Reader) -> Callable[[bytes | None], Change | Mark]:
    def parse(value: bytes | None) -> Change | Mark:
        return read(codecs.loads_object(value))

    return parse


class Inputs:
    """The ``inputs`` handler: validate and pack by program partition (see the module docs)."""

    def __init__(
        self,
        engine: Engine,
        topics: TopicNames,
        projection: Projection,
        *,
        input_topics: list[str],
        retry_topic: str,
        by_program_topic: str,
        memberships: Table,
        counts: ProgramCounts,
        partitions: int,
    ) -> None:
        self.topics = topics
        self.projection = projection
        self.by_program_topic_name = by_program_topic
        self.memberships_store = memberships
        self.counts = counts
        self.partitions = partitions
        name = service_name(projection)
        engine.handler(
            *input_topics,
            retry_topic,
            name="inputs",
            offsets=memberships,
            dead_letters=DeadLetterRoute(name, topics.dead_letters, retry_topic),
            sends=(by_program_topic,),
        )(self.route_inputs)

    async def route_inputs(self, batch: InputBatch) -> None:
        items: list[Change | Mark] = []
        # Every record of a batch comes from one topic: one look-up of its reader, unless it is
        # the retry topic, whose records each say where they came from.
        read = self.projection.reader_for(batch.topic, self.topics.prefix)
        loads = codecs.loads_object
        for record in batch.records:
            try:
                if read is not None:
                    items.append(read(loads(record.value)))
                else:
                    items.append(parse_input(record.topic, record.value, record.headers, self.topics, self.projection))
            except (codecs.DecodeError, InvalidInput) as exc:
                batch.dead_letter(record, exc)
        for partition, packed in pack_by_partition(items, self.partitions):
            batch.send(self.by_program_topic_name, None, packed.encode(), partition=partition)
        # Its next-offset rows go to memberships too: a write of this instance's own, which the
        # counts need not be checked against.
        input_partition = batch.partition
        batch.after_commit(
            lambda: self.counts.note_applied(input_partition, self.memberships_store.applied_offset(input_partition))
        )
