"""The commands sub-topology: deciding commands against the ``accounts`` table.

``validate`` (``account-commands``)
    Decides every command of the input batch in order against an in-batch copy of the
    ``accounts`` rows (:func:`~services.validator.domain.plan_batch`, so command n+1
    sees command n) and stages the events, rejections and outcome records, then the
    changed ``accounts`` rows: the rows are written only once the broker has
    acknowledged every record that implies them. A SIGKILL at any point
    therefore leaves one of two situations: the state was not written, and the batch
    is decided again against the same state, re-sending identical events (same
    event_id, same version) that consumers drop; or it was written, and the replayed
    records are below the stored next offset (or, failing that, recognised by their
    command ids) and emit nothing. State is never ahead of the events it implies.

    A command whose record is not on the partition its account_id hashes to (no key,
    another key, another partitioner) is re-sent there first, so one account's
    commands are always decided by one instance, in order, against one state row.

``redeliver`` (``retry-validator``)
    Redelivered dead letters: commands go back onto ``account-commands`` (keyed by
    account_id, headers kept so a further failure counts one more attempt) and are
    then decided like fresh ones; redelivered ``account-events`` records go back into
    the projection. What still cannot be read becomes a dead letter again.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter

from services.validator.domain import (
    Accepted,
    Account,
    AccountState,
    Command,
    Duplicate,
    MalformedCommand,
    parse_command,
    plan_batch,
)
from services.validator.handlers.command_batches import BatchItemRef, batch_reference, send_item_outcome
from services.validator.handlers.outcomes import now_ms
from services.validator.handlers.program_listings import send_routed
from services.validator.handlers.topics import ValidatorTopics
from services.validator.outcome_records import batch_item_outcome, outcome_record, pending_record
from services.validator.state import account_key, decode_state, encode_state
from shared import codecs, dead_letters
from shared.accounts import InvalidEvent, parse_event
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


def read_command(record: InRecord) -> Command:
    return parse_command(codecs.loads_object(record.value), default_issued_at=record.timestamp or 0)


def command_id_of(record: InRecord) -> str:
    """The command id a record that is not a readable command carries, if any."""
    try:
        value = codecs.loads_object(record.value).get("command_id")
    except codecs.DecodeError:
        return ""
    return value if isinstance(value, str) else ""


class Commands:
    def __init__(self, engine: Engine, settings: Settings, topics: ValidatorTopics) -> None:
        self.engine = engine
        self.settings = settings
        self.topics = topics
        self.partitions = settings.topic_partitions
        self.store = engine.table("accounts")
        # Each input's next expected offsets live in the table its handler writes, so they
        # move with the partition and are restored with it.
        engine.handler(topics.commands, name="commands", offsets=self.store, dead_letters=topics.dead_letter_route())(
            self.validate
        )
        engine.handler(topics.retry, name="retry", offsets=self.store, dead_letters=topics.dead_letter_route())(self.redeliver)

    async def validate(self, input_batch: InputBatch) -> None:
        """Decide the input batch's commands in order, stage the outcomes, then the state they imply."""
        n = self.partitions
        commands: list[Command] = []
        items: dict[int, BatchItemRef] = {}  # position in commands → the command batch item it is
        for record in input_batch.records:
            item = batch_reference(record.headers)
            try:
                command = read_command(record)
            except (codecs.DecodeError, MalformedCommand) as exc:
                input_batch.dead_letter(record, exc)
                DEAD_LETTERED.inc()
                if item is not None:
                    self.send_item_outcome(input_batch, item, batch_item_outcome(command_id_of(record), None, str(exc)))
                continue
            if command.storable:
                key = account_key(command.account_id)
                home = partition_for(key, n)
                if record.partition != home or record.key != key:
                    # Not where this account's commands are decided: move it there, unchanged.
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

        def load(account_id: str) -> AccountState | None:
            raw = self.store.get(input_batch.partition, account_key(account_id))
            return decode_state(account_id, raw) if raw is not None else None

        plan = plan_batch(commands, load, self.settings.command_history_per_account)
        at = now_ms()
        for position, (command, outcome) in enumerate(zip(commands, plan.outcomes, strict=True)):
            item = items.get(position)
            if item is not None:
                self.send_item_outcome(input_batch, item, batch_item_outcome(command.command_id, outcome))
            if isinstance(outcome, Duplicate):
                DUPLICATE.inc()
                continue
            key = account_key(command.account_id)
            if isinstance(outcome, Accepted):
                input_batch.send(self.topics.events, key, codecs.dumps(outcome.event.to_json()))
                ACCEPTED.inc()
            else:
                input_batch.send(self.topics.rejections, key, codecs.dumps(outcome.rejection.to_json()))
                REJECTED.inc()
            input_batch.send(self.topics.outcomes, command.command_id.encode(), codecs.dumps(outcome_record(outcome, at=at)))
        # Events, rejections, outcome records, reroutes and dead letters are acknowledged
        # before any state that implies them is written (the engine's commit order).
        for account_id, state in plan.states.items():
            input_batch.write(self.store, account_key(account_id), encode_state(account_id, state))

    def send_item_outcome(self, input_batch: InputBatch, item: BatchItemRef, outcome: dict[str, Any]) -> None:
        send_item_outcome(input_batch, self.topics, self.partitions, item, outcome)

    async def redeliver(self, input_batch: InputBatch) -> None:
        for record in input_batch.records:
            origin = dead_letters.headers_dict(record.headers).get(dead_letters.ORIGINAL_TOPIC, "")
            try:
                if origin == self.topics.events:
                    send_routed(input_batch, self.topics, parse_event(codecs.loads_object(record.value)))
                    continue
                command = read_command(record)
            except (codecs.DecodeError, MalformedCommand, InvalidEvent) as exc:
                input_batch.dead_letter(record, exc)
                continue
            key = account_key(command.account_id)
            input_batch.send(
                self.topics.commands,
                key,
                record.value,
                partition=partition_for(key, self.partitions) if command.storable else None,
                timestamp_ms=record.timestamp,
                headers=record.headers or None,
            )

    async def submit(self, command: dict[str, Any]) -> None:
        """Write a command to ``account-commands``, marking it pending first; returns once both are acknowledged."""
        command_id, account_id = command["command_id"], command["account_id"]
        await self.engine.send_all(
            [
                Outgoing(
                    self.topics.outcomes, command_id.encode(), codecs.dumps(pending_record(command_id, account_id, at=now_ms()))
                ),
                Outgoing(self.topics.commands, account_id.encode(), codecs.dumps(command)),
            ]
        )

    # -- reads (GET /accounts/{account_id}) -------------------------------------------------------

    def account(self, account_id: str) -> Account | None:
        key = account_key(account_id)
        raw = self.store.get(partition_for(key, self.partitions), key)
        return decode_state(account_id, raw).account if raw is not None else None
