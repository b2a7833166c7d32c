"""Command batches (POST /commands/batch, GET /batches/{batch_id}).

``split_command_batches`` (the domain's command batch topic, ``account-command-batches`` for
accounts, keyed by batch_id) turns each user's command batch into its commands: each item goes
onto the command topic (``account-commands``) with its own
command id (its own, or the batch id and its index) and headers naming its batch and index,
and is then decided by ``validate`` exactly like a single command. ``validate`` sends each
item's outcome to ``…-batch-outcomes`` too (:func:`send_item_outcome`), and
``record_batch_outcomes`` keeps it in the ``batches`` table next to the batch's manifest.
A resent batch re-sends only the items without a recorded outcome; those the validator had
already decided are recognised by their command ids and decided nothing again. Items that
are not even JSON objects are rejected INVALID_COMMAND by the splitter itself and
dead-lettered one by one; a record that is not a batch is a dead letter.
"""

from __future__ import annotations

import logging
from typing import Any

from services.validator.command_batch import (
    BATCH_ID_HEADER,
    BATCH_INDEX_HEADER,
    CommandBatch,
    MalformedBatch,
    batch_item,
    parse_batch,
)
from services.validator.handlers.topics import ValidatorTopics
from services.validator.outcome_records import batch_item_outcome
from services.validator.state import aggregate_key, batch_item_index, batch_item_key, batch_item_prefix, batch_manifest_key
from shared import codecs, dead_letters
from shared.domain import Domain, MalformedCommand, parse_command
from shared.engine import Engine, InputBatch, Outgoing, partition_for
from shared.engine import Record as InRecord
from shared.settings import Settings

log = logging.getLogger(__name__)

#: (batch id, item index) of a command split out of a command batch.
BatchItemRef = tuple[str, int]


def batch_reference(headers: Any) -> BatchItemRef | None:
    """Which command batch and item a command was split out of, from its headers."""
    if not headers:
        return None
    found = dead_letters.headers_dict(headers)
    batch_id, index = found.get(BATCH_ID_HEADER), found.get(BATCH_INDEX_HEADER)
    if not batch_id or index is None or not index.isdigit():
        return None
    return batch_id, int(index)


def unreadable_item(domain: Domain[Any], batch_id: str, index: int, item: Any) -> Exception | None:
    """Why a batch item cannot be read as a command at all (None: it can; it is then decided
    like any command, and rejected INVALID_COMMAND if it breaks the command schema)."""
    if not isinstance(item, dict):
        return MalformedBatch(f"item {index} of batch {batch_id!r} is not a JSON object")
    try:
        parse_command(domain, batch_item(batch_id, index, item), default_issued_at=0)
    except MalformedCommand as exc:
        return exc
    return None


def send_item_outcome(
    input_batch: InputBatch, topics: ValidatorTopics, partitions: int, item: BatchItemRef, outcome: dict[str, Any]
) -> None:
    """Stage one command batch item's outcome onto ``…-batch-outcomes``, keyed by its batch."""
    batch_id, index = item
    key = batch_id.encode()
    input_batch.send(
        topics.batch_outcomes,
        key,
        codecs.dumps({"batch_id": batch_id, "index": index, **outcome}),
        partition=partition_for(key, partitions),
    )


class CommandBatches:
    def __init__(self, engine: Engine, settings: Settings, topics: ValidatorTopics, domain: Domain[Any]) -> None:
        self.engine = engine
        self.domain = domain
        self.settings = settings
        self.topics = topics
        self.partitions = settings.topic_partitions
        self.store = engine.table("batches")
        engine.handler(
            topics.command_batches,
            name="batches",
            offsets=self.store,
            dead_letters=topics.dead_letter_route(),
            sends=(topics.commands, topics.command_batches, topics.batch_outcomes),
        )(self.split_command_batches)
        engine.handler(
            topics.batch_outcomes, name="batch-outcomes", offsets=self.store, internal_partitions=self.partitions, sends=()
        )(self.record_batch_outcomes)

    async def split_command_batches(self, input_batch: InputBatch) -> None:
        """Each command batch's items onto the command topic, but those already decided."""
        n = self.partitions
        for record in input_batch.records:
            try:
                command_batch = parse_batch(codecs.loads_object(record.value), max_commands=self.settings.batch_max_commands)
            except (codecs.DecodeError, MalformedBatch) as exc:
                input_batch.dead_letter(record, exc)
                continue
            batch_id = command_batch.batch_id
            key = batch_id.encode()
            home = partition_for(key, n)
            if record.partition != home or record.key != key:
                input_batch.send(
                    self.topics.command_batches,
                    key,
                    record.value,
                    partition=home,
                    timestamp_ms=record.timestamp,
                    headers=record.headers or None,
                )
                continue
            ids = command_batch.command_ids()
            manifest = batch_manifest_key(batch_id)
            if input_batch.read(self.store, manifest) is None:
                input_batch.write(self.store, manifest, codecs.dumps({"ids": ids}))
            for index, item in enumerate(command_batch.items):
                if input_batch.read(self.store, batch_item_key(batch_id, index)) is not None:
                    continue  # decided already: a resent batch decides only what was not
                headers = [(BATCH_ID_HEADER, key), (BATCH_INDEX_HEADER, str(index).encode())]
                unreadable = unreadable_item(self.domain, batch_id, index, item)
                if unreadable is not None:
                    # Decided here, in the same commit as the split: a resent batch finds it decided.
                    letter = input_batch.dead_letter(
                        InRecord(
                            record.topic, record.partition, record.offset, key, codecs.dumps(item), headers, record.timestamp
                        ),
                        unreadable,
                    )
                    input_batch.write(
                        self.store,
                        batch_item_key(batch_id, index),
                        codecs.dumps(
                            {"batch_id": batch_id, "index": index, **batch_item_outcome(ids[index], None, letter.error_message)}
                        ),
                    )
                    continue
                aggregate_id = item.get(self.domain.aggregate_id_field)
                command_key = aggregate_key(aggregate_id) if isinstance(aggregate_id, str) and aggregate_id else key
                input_batch.send(
                    self.topics.commands,
                    command_key,
                    codecs.dumps(batch_item(batch_id, index, item)),
                    partition=partition_for(command_key, n),
                    timestamp_ms=record.timestamp,
                    headers=headers,
                )

    async def record_batch_outcomes(self, input_batch: InputBatch) -> None:
        for record in input_batch.records:
            try:
                outcome = codecs.loads_object(record.value)
                batch_id, index = outcome["batch_id"], int(outcome["index"])
            except (codecs.DecodeError, KeyError, TypeError, ValueError):
                log.warning(
                    "skipping a batch outcome record that is not one this service wrote at %s[%s]@%s",
                    record.topic,
                    record.partition,
                    record.offset,
                )
                continue
            input_batch.write(self.store, batch_item_key(batch_id, index), record.value)

    def batch_summary(self, batch_id: str) -> tuple[list[str], dict[int, dict[str, Any]]] | None:
        """The batch's command ids and the outcomes recorded so far by item index (None: unknown batch)."""
        partition = partition_for(batch_id.encode(), self.partitions)
        manifest = self.store.get(partition, batch_manifest_key(batch_id))
        if manifest is None:
            return None
        ids: list[str] = codecs.loads_object(manifest)["ids"]
        prefix = batch_item_prefix(batch_id)
        outcomes: dict[int, dict[str, Any]] = {}
        for key, raw in self.store.items(partition, from_key=prefix):
            if not key.startswith(prefix):
                break
            outcomes[batch_item_index(key, prefix)] = codecs.loads_object(raw)
        return ids, outcomes

    async def submit(self, command_batch: CommandBatch) -> None:
        """Write a command batch to the command batch topic (one record, keyed by its id);
        returns once acknowledged."""
        key = command_batch.batch_id.encode()
        await self.engine.send_all(
            [
                Outgoing(
                    self.topics.command_batches,
                    key,
                    codecs.dumps({"batch_id": command_batch.batch_id, "commands": list(command_batch.items)}),
                    partition=partition_for(key, self.partitions),
                )
            ]
        )
