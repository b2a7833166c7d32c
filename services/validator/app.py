"""The validator service: its topology and batch handlers on the engine.

Handlers (each gets one input partition's records exactly once, in order; the engine
sends what it staged, waits for the acknowledgements, and only then writes its rows
with the input's next offset, changelog first):

``validate`` (``account-commands``)
    Decides every command of the batch in order against an in-batch copy of the
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

``record_outcomes`` (internal ``…-outcomes``, keyed by command_id)
    Keeps the ``outcomes`` table behind GET /commands/{command_id}. A "pending" record
    (written by POST /commands) never replaces an answer. Each batch also deletes the
    rows older than ``command_outcome_retention_s`` (found through their expiry rows,
    oldest first), so the table holds about one retention period of commands.

``split_batches`` (``account-command-batches``, keyed by batch_id) and ``record_batch_outcomes``
(internal ``…-batch-outcomes``, keyed by batch_id)
    A batch becomes its commands: each item goes onto ``account-commands`` with its own
    command id (its own, or the batch id and its index) and headers naming its batch and
    index, and is then decided by ``validate`` exactly like a single command. ``validate``
    sends each batch item's outcome to ``…-batch-outcomes`` too, and ``record_batch_outcomes``
    keeps it in the ``batches`` table next to the batch's manifest (GET /batches/{batch_id}).
    A resent batch re-sends only the items without a recorded outcome; those the validator
    had already decided are recognised by their command ids and decided nothing again.
    Items that are not even JSON objects are rejected INVALID_COMMAND by the splitter
    itself and dead-lettered one by one; a record that is not a batch is a dead letter.

``route_events`` and ``project`` (``account-events`` → internal ``…-by-program``)
    The category projection: every account of a program with its status, kept in
    ``program-accounts`` and listed newest first by GET /programs/{id}/accounts. Events
    are read with :func:`shared.accounts.parse_event`, as every reader of the topic reads
    them: one that breaks the Event shape is a dead letter (``InvalidEvent``, parked at
    once by the retry scheduler) and is never listed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from prometheus_client import Counter

from services.validator import DEFAULT_PORT, SERVICE
from services.validator.domain import (
    BATCH_ID_HEADER,
    BATCH_INDEX_HEADER,
    PENDING,
    Accepted,
    Account,
    AccountState,
    Command,
    CommandBatch,
    Duplicate,
    Listing,
    MalformedBatch,
    MalformedCommand,
    apply_to_listing,
    batch_item,
    batch_item_outcome,
    outcome_record,
    parse_batch,
    parse_command,
    pending_record,
    plan_batch,
)
from services.validator.state import (
    EXPIRY_PREFIX,
    account_key,
    batch_item_index,
    batch_item_key,
    batch_item_prefix,
    batch_manifest_key,
    decode_listing,
    decode_state,
    encode_listing,
    encode_state,
    expired,
    expiry_key,
    index_key,
    listing_key,
    outcome_status,
    pack_ts,
    program_prefix,
    unpack_ts,
)
from shared import codecs, dead_letters
from shared.accounts import AccountChange, InvalidEvent, parse_event
from shared.engine import (
    DeadLetterRoute,
    Engine,
    InputBatch,
    Outgoing,
    TopicSpec,
    app_id,
    changelog_topic_specs,
    partition_db,
    partition_for,
    partition_items,
)
from shared.engine import Record as InRecord
from shared.metrics import REGISTRY
from shared.settings import Settings
from shared.topics import topic_names

log = logging.getLogger(__name__)


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
OUTCOMES_EXPIRED = Counter(
    "statefleet_validator_outcomes_expired_total",
    "Command outcomes deleted after STATEFLEET_COMMAND_OUTCOME_RETENTION_S",
    registry=REGISTRY,
)

#: Most outcome rows one batch of record_outcomes deletes per partition.
EXPIRE_PER_BATCH = 1000


def now_ms() -> int:
    return int(time.time() * 1000)


def record_timestamp_ms(record: InRecord) -> int:
    return record.timestamp or 0


def encode_routed(change: AccountChange) -> bytes:
    return codecs.dumps({"a": change.account_id, "p": change.program_id, "t": change.type,
                         "v": change.version, "o": change.occurred_at})


def decode_routed(raw: bytes | None) -> AccountChange:
    obj = codecs.loads_object(raw)
    return AccountChange(account_id=obj["a"], program_id=obj["p"], type=obj["t"], version=obj["v"], occurred_at=obj["o"])


def batch_reference(headers: Any) -> tuple[str, int] | None:
    """(batch id, item index) of a command split out of a batch, from its headers."""
    if not headers:
        return None
    found = dead_letters.headers_dict(headers)
    batch_id, index = found.get(BATCH_ID_HEADER), found.get(BATCH_INDEX_HEADER)
    if not batch_id or index is None or not index.isdigit():
        return None
    return batch_id, int(index)


def unreadable_item(batch_id: str, index: int, item: Any) -> Exception | None:
    """Why a batch item cannot be read as a command at all (None: it can; it is then decided
    like any command, and rejected INVALID_COMMAND if it breaks the command schema)."""
    if not isinstance(item, dict):
        return MalformedBatch(f"item {index} of batch {batch_id!r} is not a JSON object")
    try:
        parse_command(batch_item(batch_id, index, item), default_issued_at=0)
    except MalformedCommand as exc:
        return exc
    return None


def command_id_of(record: InRecord) -> str:
    """The command id a record that is not a readable command carries, if any."""
    try:
        value = codecs.loads_object(record.value).get("command_id")
    except codecs.DecodeError:
        return ""
    return value if isinstance(value, str) else ""


class OutcomesBehind(RuntimeError):
    """The outcomes table has not yet recorded every outcome already written for it."""


class ValidatorService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topics = topics = topic_names(settings)
        self.engine = engine = Engine(SERVICE, settings, DEFAULT_PORT)
        self.app = engine.app
        n = settings.topic_partitions
        self.partitions = n
        self.retry_topic_name = topics.service_retry(SERVICE)
        self.outcomes_topic_name = f"{app_id(SERVICE, settings)}-outcomes"
        self.by_program_topic_name = f"{app_id(SERVICE, settings)}-by-program"
        self.batch_outcomes_topic_name = f"{app_id(SERVICE, settings)}-batch-outcomes"

        self.accounts_store = engine.table("accounts")
        self.outcomes_store = engine.table("outcomes")
        self.listing_store = engine.table("program-accounts")
        self.batches_store = engine.table("batches")
        self.accounts = self.accounts_store.table
        self.outcomes = self.outcomes_store.table
        self.program_accounts = self.listing_store.table
        self.batches = self.batches_store.table
        self.waiters: dict[str, list[asyncio.Future[None]]] = {}
        #: Per outcomes partition, the last expiry row deleted: later scans seek past the
        #: tombstones below it instead of stepping over them.
        self._expiry_from: dict[int, bytes] = {}
        dead_letters_route = DeadLetterRoute(SERVICE, topics.dead_letters, self.retry_topic_name)

        # Each input's next expected offsets live in the table its handler writes, so they
        # move with the partition and are restored with it.
        engine.handler(topics.account_commands, name="commands", offsets=self.accounts_store,
                       dead_letters=dead_letters_route)(self.validate)
        engine.handler(self.retry_topic_name, name="retry", offsets=self.accounts_store,
                       dead_letters=dead_letters_route)(self.redeliver)
        engine.handler(self.outcomes_topic_name, name="outcomes", offsets=self.outcomes_store,
                       internal_partitions=n)(self.record_outcomes)
        engine.handler(topics.account_command_batches, name="batches", offsets=self.batches_store,
                       dead_letters=dead_letters_route)(self.split_batches)
        engine.handler(self.batch_outcomes_topic_name, name="batch-outcomes", offsets=self.batches_store,
                       internal_partitions=n)(self.record_batch_outcomes)
        engine.handler(topics.account_events, name="events", offsets=self.listing_store,
                       dead_letters=dead_letters_route)(self.route_events)
        engine.handler(self.by_program_topic_name, name="by-program", offsets=self.listing_store,
                       internal_partitions=n)(self.project)
        engine.watch_trailing_holes()
        engine.on_recovered(self.outcomes_store, self._on_outcomes_recovered)

    def topic_specs(self) -> list[TopicSpec]:
        n = self.settings.topic_partitions
        return [
            TopicSpec(self.topics.account_commands, n),
            TopicSpec(self.topics.account_events, n),
            TopicSpec(self.topics.account_rejections, n),
            TopicSpec(self.topics.dead_letters, n),
            TopicSpec(self.retry_topic_name, n),
            TopicSpec(self.outcomes_topic_name, n),
            TopicSpec(self.topics.account_command_batches, n),
            TopicSpec(self.batch_outcomes_topic_name, n),
            TopicSpec(self.by_program_topic_name, n),
            # Changelogs too, so they exist before the first assignment (Faust would create
            # them at start-up, racing the group's first metadata read).
            *changelog_topic_specs(self.app, self.settings),
        ]

    # -- commands ---------------------------------------------------------------------------

    @staticmethod
    def _read_command(record: InRecord) -> Command:
        return parse_command(codecs.loads_object(record.value), default_issued_at=record_timestamp_ms(record))

    async def validate(self, batch: InputBatch) -> None:
        """Decide the batch's commands in order, stage the outcomes, then the state they imply."""
        n = self.partitions
        commands: list[Command] = []
        items: dict[int, tuple[str, int]] = {}  # position in commands → (batch id, item index)
        for record in batch.records:
            item = batch_reference(record.headers)
            try:
                command = self._read_command(record)
            except (codecs.DecodeError, MalformedCommand) as exc:
                batch.dead_letter(record, exc)
                DEAD_LETTERED.inc()
                if item is not None:
                    self.send_batch_outcome(batch, item, batch_item_outcome(command_id_of(record), None, str(exc)))
                continue
            if command.storable:
                key = account_key(command.account_id)
                home = partition_for(key, n)
                if record.partition != home or record.key != key:
                    # Not where this account's commands are decided: move it there, unchanged.
                    batch.send(self.topics.account_commands, key, record.value, partition=home,
                               timestamp_ms=record.timestamp, headers=record.headers or None)
                    REROUTED.inc()
                    continue
            if item is not None:
                items[len(commands)] = item
            commands.append(command)

        def load(account_id: str) -> AccountState | None:
            raw = self.accounts_store.get(batch.partition, account_key(account_id))
            return decode_state(account_id, raw) if raw is not None else None

        plan = plan_batch(commands, load, self.settings.command_history_per_account)
        at = now_ms()
        for position, (command, outcome) in enumerate(zip(commands, plan.outcomes, strict=True)):
            item = items.get(position)
            if item is not None:
                self.send_batch_outcome(batch, item, batch_item_outcome(command.command_id, outcome))
            if isinstance(outcome, Duplicate):
                DUPLICATE.inc()
                continue
            key = account_key(command.account_id)
            if isinstance(outcome, Accepted):
                batch.send(self.topics.account_events, key, codecs.dumps(outcome.event.to_json()))
                ACCEPTED.inc()
            else:
                batch.send(self.topics.account_rejections, key, codecs.dumps(outcome.rejection.to_json()))
                REJECTED.inc()
            batch.send(self.outcomes_topic_name, command.command_id.encode(), codecs.dumps(outcome_record(outcome, at=at)))
        # Events, rejections, outcome records, reroutes and dead letters are acknowledged
        # before any state that implies them is written (the engine's commit order).
        for account_id, state in plan.states.items():
            batch.write(self.accounts_store, account_key(account_id), encode_state(account_id, state))

    def send_batch_outcome(self, batch: InputBatch, item: tuple[str, int], outcome: dict[str, Any]) -> None:
        batch_id, index = item
        key = batch_id.encode()
        batch.send(self.batch_outcomes_topic_name, key, codecs.dumps({"batch_id": batch_id, "index": index, **outcome}),
                   partition=partition_for(key, self.partitions))

    # -- batches of commands (POST /commands/batch, GET /batches/{batch_id}) ------------------------

    async def split_batches(self, batch: InputBatch) -> None:
        """Each batch's items onto ``account-commands``, but those already decided."""
        n = self.partitions
        for record in batch.records:
            try:
                parsed = parse_batch(codecs.loads_object(record.value), max_commands=self.settings.batch_max_commands)
            except (codecs.DecodeError, MalformedBatch) as exc:
                batch.dead_letter(record, exc)
                continue
            key = parsed.batch_id.encode()
            home = partition_for(key, n)
            if record.partition != home or record.key != key:
                batch.send(self.topics.account_command_batches, key, record.value, partition=home,
                           timestamp_ms=record.timestamp, headers=record.headers or None)
                continue
            ids = parsed.command_ids()
            manifest = batch_manifest_key(parsed.batch_id)
            if batch.read(self.batches_store, manifest) is None:
                batch.write(self.batches_store, manifest, codecs.dumps({"ids": ids}))
            for index, item in enumerate(parsed.items):
                if batch.read(self.batches_store, batch_item_key(parsed.batch_id, index)) is not None:
                    continue  # decided already: a resent batch decides only what was not
                headers = [(BATCH_ID_HEADER, key), (BATCH_INDEX_HEADER, str(index).encode())]
                unreadable = unreadable_item(parsed.batch_id, index, item)
                if unreadable is not None:
                    # Decided here, in the same commit as the split: a resent batch finds it decided.
                    letter = batch.dead_letter(
                        InRecord(record.topic, record.partition, record.offset, key, codecs.dumps(item), headers,
                                 record.timestamp),
                        unreadable,
                    )
                    batch.write(self.batches_store, batch_item_key(parsed.batch_id, index), codecs.dumps(
                        {"batch_id": parsed.batch_id, "index": index,
                         **batch_item_outcome(ids[index], None, letter.error_message)}))
                    continue
                account_id = item.get("account_id")
                command_key = account_key(account_id) if isinstance(account_id, str) and account_id else key
                batch.send(self.topics.account_commands, command_key,
                           codecs.dumps(batch_item(parsed.batch_id, index, item)),
                           partition=partition_for(command_key, n), timestamp_ms=record.timestamp, headers=headers)

    async def record_batch_outcomes(self, batch: InputBatch) -> None:
        for record in batch.records:
            try:
                outcome = codecs.loads_object(record.value)
                batch_id, index = outcome["batch_id"], int(outcome["index"])
            except (codecs.DecodeError, KeyError, TypeError, ValueError):
                log.warning("skipping a batch outcome record that is not one this service wrote at %s[%s]@%s",
                            record.topic, record.partition, record.offset)
                continue
            batch.write(self.batches_store, batch_item_key(batch_id, index), record.value)

    def batch_summary(self, batch_id: str) -> tuple[list[str], dict[int, dict[str, Any]]] | None:
        """The batch's command ids and the outcomes recorded so far by item index (None: unknown batch)."""
        partition = partition_for(batch_id.encode(), self.partitions)
        manifest = self.batches_store.get(partition, batch_manifest_key(batch_id))
        if manifest is None:
            return None
        ids: list[str] = codecs.loads_object(manifest)["ids"]
        prefix = batch_item_prefix(batch_id)
        outcomes: dict[int, dict[str, Any]] = {}
        for key, raw in partition_items(self.batches, partition, from_key=prefix):
            if not key.startswith(prefix):
                break
            outcomes[batch_item_index(key, prefix)] = codecs.loads_object(raw)
        return ids, outcomes

    # -- redelivered dead letters ------------------------------------------------------------------

    async def redeliver(self, batch: InputBatch) -> None:
        for record in batch.records:
            origin = dead_letters.headers_dict(record.headers).get(dead_letters.ORIGINAL_TOPIC, "")
            try:
                if origin == self.topics.account_events:
                    change = parse_event(codecs.loads_object(record.value))
                    batch.send(self.by_program_topic_name, change.program_id.encode(), encode_routed(change))
                    continue
                command = self._read_command(record)
            except (codecs.DecodeError, MalformedCommand, InvalidEvent) as exc:
                batch.dead_letter(record, exc)
                continue
            key = account_key(command.account_id)
            batch.send(
                self.topics.account_commands, key, record.value,
                partition=partition_for(key, self.partitions) if command.storable else None,
                timestamp_ms=record.timestamp, headers=record.headers or None,
            )

    # -- outcomes (GET /commands/{command_id}) --------------------------------------------------

    async def record_outcomes(self, batch: InputBatch) -> None:
        retention_ms = round(self.settings.command_outcome_retention_s * 1000)
        now = now_ms()
        answered: list[str] = []
        for record in batch.records:
            if record.key is None or record.value is None:
                continue
            try:
                status = outcome_status(record.value)
            except codecs.DecodeError:
                log.warning("skipping an outcome record that is not JSON at %s[%s]@%s",
                            record.topic, record.partition, record.offset)
                continue
            known = batch.read(self.outcomes_store, record.key) is not None
            if status == PENDING and known:
                continue  # a command is pending only until it has an answer
            if not known:
                batch.write(self.outcomes_store, expiry_key(now + retention_ms, record.key), b"")
            batch.write(self.outcomes_store, record.key, record.value)
            answered.append(record.key.decode("utf-8", errors="replace"))
        for key in self.expired_outcomes(batch.partition, now):
            batch.write(self.outcomes_store, key, None)

        def wake() -> None:
            for command_id in answered:
                self._wake(command_id)

        batch.after_commit(wake)

    def expired_outcomes(self, partition: int, now: int) -> list[bytes]:
        """Keys of the outcome rows (and their expiry rows) of ``partition`` past retention:
        bounded per batch, oldest first. Each batch expires its own partition only, so no
        two batches write one changelog partition at once."""
        start = self._expiry_from.get(partition, EXPIRY_PREFIX)
        keys = (key for key, _ in partition_items(self.outcomes, partition, from_key=start))
        due = expired(keys, now, EXPIRE_PER_BATCH)
        deletes: list[bytes] = []
        for expiry_row, command_id in due:
            deletes += [command_id, expiry_row]
        if due:
            self._expiry_from[partition] = due[-1][0]
            OUTCOMES_EXPIRED.inc(len(due))
        return deletes

    async def _on_outcomes_recovered(self) -> None:
        # Another instance may have owned a partition meanwhile: scan it from the start.
        self._expiry_from.clear()

    def _wake(self, command_id: str) -> None:
        for fut in self.waiters.pop(command_id, ()):
            if not fut.done():
                fut.set_result(None)

    def outcome(self, command_id: str) -> bytes | None:
        if not command_id or "\x00" in command_id:
            return None  # no command has such an id; the table's own rows start with NUL
        key = command_id.encode()
        return self.outcomes_store.get(partition_for(key, self.partitions), key)

    async def outcome_once_applied(self, command_id: str) -> bytes | None:
        """The outcome of a command not found at first, read again once every outcome record
        already written is in the table: the validator sends a command's event and its
        outcome record together, so whoever saw the event can read the outcome.

        Raises :class:`OutcomesBehind` when they are not recorded within
        ``command_outcome_catch_up_s``: the command may have been decided, so "no such
        command" would be wrong."""
        if not command_id or "\x00" in command_id:
            return None
        partition = partition_for(command_id.encode(), self.partitions)
        if not await self.engine.wait_applied(
            self.outcomes_topic_name, partition, self.settings.command_outcome_catch_up_s,
        ):
            raise OutcomesBehind(f"outcomes of partition {partition} are still being recorded")
        return self.outcome(command_id)

    async def wait_outcome(self, command_id: str, seconds: float, *, final: bool) -> bytes | None:
        """The outcome record once it is final (or, with ``final=False``, once there is one),
        or whatever is there when ``seconds`` have passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while True:
            raw = self.outcome(command_id)
            if raw is not None and (not final or outcome_status(raw) != PENDING):
                return raw
            remaining = deadline - loop.time()
            if remaining <= 0:
                return raw
            fut: asyncio.Future[None] = loop.create_future()
            self.waiters.setdefault(command_id, []).append(fut)
            try:
                await asyncio.wait_for(fut, remaining)
            except TimeoutError:
                pass
            finally:
                waiting = self.waiters.get(command_id)
                if waiting is not None and fut in waiting:
                    waiting.remove(fut)
                    if not waiting:
                        del self.waiters[command_id]

    async def submit(self, command: dict[str, Any]) -> None:
        """Write a command to ``account-commands``, marking it pending first; returns once both are acknowledged."""
        command_id, account_id = command["command_id"], command["account_id"]
        await self.engine.send_all([
            Outgoing(self.outcomes_topic_name, command_id.encode(),
                     codecs.dumps(pending_record(command_id, account_id, at=now_ms()))),
            Outgoing(self.topics.account_commands, account_id.encode(), codecs.dumps(command)),
        ])

    async def submit_batch(self, batch: CommandBatch) -> None:
        """Write a batch to ``account-command-batches`` (one record, keyed by its id); returns once acknowledged."""
        key = batch.batch_id.encode()
        await self.engine.send_all([
            Outgoing(self.topics.account_command_batches, key,
                     codecs.dumps({"batch_id": batch.batch_id, "commands": list(batch.items)}),
                     partition=partition_for(key, self.partitions)),
        ])

    # -- accounts (GET /accounts/{account_id}) --------------------------------------------------

    def account(self, account_id: str) -> Account | None:
        key = account_key(account_id)
        raw = self.accounts_store.get(partition_for(key, self.partitions), key)
        return decode_state(account_id, raw).account if raw is not None else None

    # -- the category projection ------------------------------------------------------------------

    async def route_events(self, batch: InputBatch) -> None:
        for record in batch.records:
            try:
                change = parse_event(codecs.loads_object(record.value))
            except (codecs.DecodeError, InvalidEvent) as exc:
                batch.dead_letter(record, exc)
                continue
            batch.send(self.by_program_topic_name, change.program_id.encode(), encode_routed(change))

    async def project(self, batch: InputBatch) -> None:
        for record in batch.records:
            try:
                change = decode_routed(record.value)
            except (codecs.DecodeError, KeyError):
                log.warning("skipping a by-program record that is not one this service wrote at %s[%s]@%s",
                            record.topic, record.partition, record.offset)
                continue
            self.apply_listing_change(batch, change)

    def apply_listing_change(self, batch: InputBatch, change: AccountChange) -> None:
        """Stage the rows ``change`` writes (read against this batch's earlier writes)."""
        store = self.listing_store
        idx = index_key(change.program_id, change.account_id)
        created = batch.read(store, idx)
        current = None
        if created is not None:
            raw = batch.read(store, listing_key(change.program_id, unpack_ts(created), change.account_id))
            current = decode_listing(change.program_id, raw) if raw is not None else None
        updated = apply_to_listing(current, change)
        if updated is None:
            return
        if created is None:
            batch.write(store, idx, pack_ts(updated.created_at))
        batch.write(store, listing_key(change.program_id, updated.created_at, change.account_id), encode_listing(updated))

    def list_program(
        self, program_id: str, *, limit: int, before: bytes | None, status: str | None,
    ) -> tuple[list[Listing], bool]:
        """Up to ``limit`` of the program's accounts, newest first, strictly before the
        listing key ``before``; and whether more follow."""
        prefix = program_prefix(program_id)
        db = partition_db(self.program_accounts, partition_for(program_id, self.partitions))
        start = before if before is not None else prefix + b"\xff" * 9
        items: list[Listing] = []
        for key, raw in db.items(from_key=start, backwards=True):
            assert isinstance(key, bytes) and isinstance(raw, bytes)
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

