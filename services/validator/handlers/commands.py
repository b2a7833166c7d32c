"""The commands sub-topology: deciding commands against the ``accounts`` table.

``validate`` (the domain's command topic, ``account-commands`` for accounts)
    Decides every command of the input batch in order against an in-batch copy of the
    ``accounts`` rows (:func:`shared.domain.plan_batch` with the service's domain, so
    command n+1 sees command n) and stages the events, rejections and outcome records, then the
    changed ``accounts`` rows: the rows are written only once the broker has
    acknowledged every record that implies them. A SIGKILL at any point
    therefore leaves one of two situations: the state was not written, and the batch
    is decided again against the same state, re-sending identical events (same
    event_id, same version) that consumers drop; or it was written, and the replayed
    records are below the stored next offset (or, failing that, recognised by their
    command ids) and emit nothing. State is never ahead of the events it implies.

    A command whose record is not on the partition its aggregate id hashes to (no key,
    another key, another partitioner) is re-sent there first, so one aggregate's
    commands are always decided by one instance, in order, against one state row.

``redeliver`` (``retry-validator``)
    Redelivered dead letters: commands go back onto the command topic (keyed by
    aggregate id, headers kept so a further failure counts one more attempt) and are
    then decided like fresh ones; redelivered ``account-events`` records go back into
    the accounts domain's projection. What still cannot be read becomes a dead letter again.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter

from services.validator.domain import ACCOUNTS
from services.validator.handlers.command_batches import BatchItemRef, batch_reference, send_item_outcome
from services.validator.handlers.outcomes import now_ms
from services.validator.handlers.program_listings import send_routed
from services.validator.handlers.topics import ValidatorTopics
from services.validator.outcome_records import batch_item_outcome, outcome_record, pending_record
from services.validator.state import aggregate_key, decode_state, encode_state
from shared import codecs, dead_letters
from shared.accounts import InvalidEvent, parse_event
from shared.domain import Accepted, Aggregate, Command, Domain, Duplicate, MalformedCommand, Row, parse_command, plan_batch
from shared.engine import Engine, InputBatch, Outgoing, partition_for
from shared.engine import Record as InRecord
from shared.metrics import REGISTRY
from shared.settings import Settings

COMMAND_OUTCOMES = Counter(
    "statefleet_validator_commands_total",
    "Commands the validator answered, by outcome (accepted, rejected, duplicate, rerouted, dead_lettered)",
    ["outcome"],
    registry=REGISTRY,
)
# Bound once: looking a child up by its labels costs more than the increment, once per command.
ACCEPTED, REJECTED, DUPLICATE, REROUTED, DEAD_LETTERED = (
    COMMAND_OUTCOMES.labels(outcome) for outcome in ("accepted", "rejected", "duplicate", "rerouted", "dead_lettered")
)


def read_command(domain: Domain[Any], record: InRecord) -> Command:
    return parse_command(domain, codecs.loads_object(record.value), default_issued_at=record.timestamp or 0)


def command_id_of(record: InRecord) -> str:
    """The command id a record that is not a readable command carries, if any."""
    try:
        value = codecs.loads_object(record.value).get("command_id")
    except codecs.DecodeError:
        return ""
    return value if isinstance(value, str) else ""


class Commands:
    def __init__(self, engine: Engine, settings: Settings, topics: ValidatorTopics, domain: Domain[Any]) -> None:
        self.engine = engine
        self.domain = domain
        self.settings = settings
        self.topics = topics
        self.partitions = settings.topic_partitions
        self.store = engine.table("accounts")
        # Each input's next expected offsets live in the table its handler writes, so they
        # move with the partition and are restored with it.
        engine.handler(
            topics.commands,
            name="commands",
            offsets=self.store,
            dead_letters=topics.dead_letter_route(),
            sends=(topics.events, topics.rejections, topics.outcomes, topics.batch_outcomes, topics.commands),
        )(self.validate)
        engine.handler(
            topics.retry,
            name="retry",
            offsets=self.store,
            dead_letters=topics.dead_letter_route(),
            sends=(topics.commands, topics.by_program),
        )(self.redeliver)

    async def validate(self, input_batch: InputBatch) -> None:
        """Decide the input batch's commands in order, stage the outcomes, then the state they imply."""
        n, domain = self.partitions, self.domain
        commands: list[Command] = []
        items: dict[int, BatchItemRef] = {}  # position in commands → the command batch item it is
        for record in input_batch.records:
            item = batch_reference(record.headers)
            try:
                command = read_command(domain, record)
            except (codecs.DecodeError, MalformedCommand) as exc:
                input_batch.dead_letter(record, exc)
                DEAD_LETTERED.inc()
                if item is not None:
                    self.send_item_outcome(input_batch, item, batch_item_outcome(command_id_of(record), None, str(exc)))
                continue
            if command.storable:
                key = aggregate_key(command.aggregate_id)
                home = partition_for(key, n)
                if record.partition != home or record.key != key:
                    # Not where this aggregate's commands are decided: move it there, unchanged.
                    input_batch.send(
                        self.topics.commands,
                        key,
                        record.value,
                        partition=home,
                        timestamp_ms=record.timestamp,
                        headers=record.headers or None,
                    )
                    REROUTED.inc()
                    continue
            if item is not None:
                items[len(commands)] = item
            commands.append(command)

        def load(aggregate_id: str) -> Row[Any] | None:
            raw = self.store.get(input_batch.partition, aggregate_key(aggregate_id))
            return decode_state(domain, aggregate_id, raw) if raw is not None else None

        plan = plan_batch(domain, commands, load, self.settings.command_history_per_account)
        at = now_ms()
        for position, (command, outcome) in enumerate(zip(commands, plan.outcomes, strict=True)):
            item = items.get(position)
            if item is not None:
                self.send_item_outcome(input_batch, item, batch_item_outcome(command.command_id, outcome))
            if isinstance(outcome, Duplicate):
                DUPLICATE.inc()
                continue
            key = aggregate_key(command.aggregate_id)
            if isinstance(outcome, Accepted):
                event = domain.event_json(outcome.event)
                input_batch.send(self.topics.events, key, codecs.dumps(event))
                kept = outcome_record(domain, outcome, at=at, event_json=event)
                ACCEPTED.inc()
            else:
                input_batch.send(self.topics.rejections, key, codecs.dumps(domain.rejection_json(outcome.rejection)))
                kept = outcome_record(domain, outcome, at=at)
                REJECTED.inc()
            input_batch.send(self.topics.outcomes, command.command_id.encode(), codecs.dumps(kept))
        # Events, rejections, outcome records, reroutes and dead letters are acknowledged
        # before any state that implies them is written (the engine's commit order).
        for aggregate_id, row in plan.states.items():
            input_batch.write(self.store, aggregate_key(aggregate_id), encode_state(domain, row))

    def send_item_outcome(self, input_batch: InputBatch, item: BatchItemRef, outcome: dict[str, Any]) -> None:
        send_item_outcome(input_batch, self.topics, self.partitions, item, outcome)

    async def redeliver(self, input_batch: InputBatch) -> None:
        for record in input_batch.records:
            origin = dead_letters.headers_dict(record.headers).get(dead_letters.ORIGINAL_TOPIC, "")
            try:
                if origin == self.topics.events and self.domain is ACCOUNTS:
                    send_routed(input_batch, self.topics, parse_event(codecs.loads_object(record.value)))
                    continue
                command = read_command(self.domain, record)
            except (codecs.DecodeError, MalformedCommand, InvalidEvent) as exc:
                input_batch.dead_letter(record, exc)
                continue
            key = aggregate_key(command.aggregate_id)
            input_batch.send(
                self.topics.commands,
                key,
                record.value,
                partition=partition_for(key, self.partitions) if command.storable else None,
                timestamp_ms=record.timestamp,
                headers=record.headers or None,
            )

    async def submit(self, command: dict[str, Any]) -> None:
        """Write a command to the command topic, marking it pending first; returns once both are acknowledged."""
        command_id, aggregate_id = command["command_id"], command[self.domain.aggregate_id_field]
        pending = pending_record(self.domain, command_id, aggregate_id, at=now_ms())
        await self.engine.send_all(
            [
                Outgoing(self.topics.outcomes, command_id.encode(), codecs.dumps(pending)),
                Outgoing(self.topics.commands, aggregate_id.encode(), codecs.dumps(command)),
            ]
        )

    # -- reads (GET /aggregates/{aggregate_id}, GET /accounts/{account_id}) ------------------------

    def aggregate(self, aggregate_id: str) -> Aggregate[Any] | None:
        key = aggregate_key(aggregate_id)
        raw = self.store.get(partition_for(key, self.partitions), key)
        return decode_state(self.domain, aggregate_id, raw).aggregate if raw is not None else None
