"""The tallies service: Faust app, tables and agents.

Two hops, because inputs are keyed by account and tallies by program:

1. ``route_inputs`` reads ``account-events``, ``logins`` and the service's retry topic,
   validates each record (bad ones become dead letters, with the original topic,
   partition and offset), and forwards them keyed by program_id to the internal
   ``…-by-program`` topic, one record per program per batch (:class:`ProgramInputs`).
2. ``apply_inputs`` reads that topic. Per program partition it holds the memberships
   table (the state) and the last-logins table, and updates the derived counts.

Both agents take each input partition exactly in order (:class:`~shared.durable.OrderedInput`:
records below the partition's stored next offset are replays and are dropped; records
the Faust stream skipped are read back from Kafka first), and write through
:mod:`shared.durable`, changelog acknowledged before the local RocksDB:

- ``route_inputs`` waits until the broker has acknowledged the batch's by-program
  records and dead letters, then writes its next offsets (rows in ``memberships``,
  partition p for input partition p).
- ``apply_inputs`` reads the batch against an in-batch copy of the rows, then writes
  the changed memberships and last-logins rows, each table followed by its copy of the
  by-program next offsets, all in one round trip (:func:`~shared.durable.write_all`);
  only then does it move the in-memory counts. The input resumes from the smaller of
  the two copies, so a crash that left one table's rows in its changelog and not the
  other's re-applies the difference, which the version check (memberships) and the
  maximum (last logins) make harmless.

So after a SIGKILL, with the local state kept or restored from the changelogs alone,
every input record is applied exactly once in effect: none is skipped, none counts twice.

Changed programs are marked dirty and published to ``program-tallies`` by a timer
(at most once per interval per program, not once per input event). After every
rebalance, counts are rebuilt from the restored memberships and every owned program
is republished, so nothing a crash interrupted stays unpublished.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from services.tallies import DEFAULT_PORT, SERVICE
from services.tallies.domain import (
    AccountChange,
    InvalidInput,
    Login,
    Tally,
    apply_change,
    latest_login,
    parse_account_change,
    parse_login,
)
from services.tallies.state import (
    ProgramCounts,
    decode_membership,
    encode_membership,
    membership_key,
)
from shared import codecs, dead_letters
from shared.dead_letter_sink import DeadLetterSink
from shared.durable import Backfill, DurableTable, OrderedInput, state_items, write_all
from shared.faust_app import app_id, changelog_topic_specs, create_app
from shared.faust_internals import active_partitions
from shared.metrics import BATCH_SECONDS, MESSAGES_PROCESSED
from shared.partitioning import partition_for
from shared.settings import Settings
from shared.topic_admin import TopicSpec
from shared.topics import TopicNames, topic_names
from shared.trailing_holes import TrailingHoleWatch

log = logging.getLogger(__name__)

#: Most account changes packed into one record of the by-program topic.
MAX_CHANGES_PER_RECORD = 500


@dataclass
class ProgramInputs:
    """One program's inputs from one batch, sent as one record: account changes in
    arrival order, and the largest login ts. Packing spares the second hop a message per
    input event; applying it is the same per-change version check, so a replayed record
    changes nothing. ``records`` is how many input records it stands for (for the
    processed-messages metric of the second hop)."""

    changes: list[AccountChange] = field(default_factory=list)
    last_login: int | None = None
    records: int = 0

    def encode(self) -> bytes:
        return codecs.dumps({
            "c": [[c.account_id, c.type, c.version] for c in self.changes], "l": self.last_login, "n": self.records,
        })

    @staticmethod
    def decode(program_id: str, raw: bytes | None) -> ProgramInputs:
        obj = codecs.loads_object(raw)
        changes = [AccountChange(account_id=a, program_id=program_id, type=t, version=v) for a, t, v in obj["c"]]
        last_login = obj["l"]
        records = obj.get("n", len(changes) + (last_login is not None))
        return ProgramInputs(changes=changes, last_login=last_login, records=records)

    def __len__(self) -> int:
        return len(self.changes) + (self.last_login is not None)


def pack_by_program(items: list[AccountChange | Login]) -> list[tuple[str, ProgramInputs]]:
    """Group a batch's inputs by program, keeping each account's changes in order."""
    packed: dict[str, list[ProgramInputs]] = {}
    for item in items:
        parts = packed.setdefault(item.program_id, [ProgramInputs()])
        if isinstance(item, Login):
            parts[-1].last_login = latest_login(parts[-1].last_login, item.ts)
        else:
            if len(parts[-1].changes) >= MAX_CHANGES_PER_RECORD:
                parts.append(ProgramInputs())
            parts[-1].changes.append(item)
        parts[-1].records += 1
    return [(program, part) for program, parts in packed.items() for part in parts]


@dataclass
class BatchWrites:
    """What one batch of the second hop changes: rows to write, then count moves to apply."""

    memberships: dict[tuple[int, bytes], bytes] = field(default_factory=dict)
    last_logins: dict[tuple[int, bytes], bytes] = field(default_factory=dict)
    #: (partition, program_id, status before, status after), in order
    moves: list[tuple[int, str, str | None, str]] = field(default_factory=list)
    programs: set[str] = field(default_factory=set)


def parse_input(topic: str, value: bytes | None, headers: Any, topics: TopicNames) -> AccountChange | Login:
    """Validate one input record; the topic (or, for a retry, its original topic) says what it is."""
    origin = topic
    if topic == topics.service_retry(SERVICE):
        origin = dead_letters.headers_dict(dead_letters.header_items(headers)).get(dead_letters.ORIGINAL_TOPIC, "")
    obj = codecs.loads_object(value)
    if origin == topics.logins:
        item: AccountChange | Login = parse_login(obj)
    elif origin == topics.account_events:
        item = parse_account_change(obj)
    else:
        raise InvalidInput(f"cannot tell what a record from topic {origin!r} is")
    if "\x00" in item.program_id:
        raise InvalidInput("'program_id' must not contain NUL")
    return item


class TalliesService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topics = topic_names(settings)
        self.app = app = create_app(SERVICE, settings, DEFAULT_PORT)
        partitions = settings.topic_partitions
        self.by_program_topic_name = f"{app_id(SERVICE, settings)}-by-program"

        self.inputs = app.topic(
            self.topics.account_events, self.topics.logins, self.topics.service_retry(SERVICE),
            key_type=bytes, value_type=bytes,
        )
        self.by_program = app.topic(
            self.by_program_topic_name, partitions=partitions, internal=True, key_type=bytes, value_type=bytes,
        )
        self.memberships = app.Table(
            "memberships", partitions=partitions, key_type=bytes, value_type=bytes,
        )
        self.last_logins = app.Table(
            "last-logins", partitions=partitions, key_type=bytes, value_type=bytes,
        )
        self.memberships_store = DurableTable(app, self.memberships)
        self.logins_store = DurableTable(app, self.last_logins)
        self.backfill = Backfill(settings)
        # The first hop has no state of its own: its next offsets are rows of memberships,
        # so they move with the partition and are restored with it. The second hop keeps a
        # copy in each table it writes.
        self.input_order = OrderedInput(app, self.memberships_store, self.backfill)
        self.program_order = OrderedInput(app, [self.memberships_store, self.logins_store], self.backfill)
        self.counts = ProgramCounts()
        self.dirty: set[str] = set()
        self.dead_letters = DeadLetterSink(
            app, SERVICE, self.topics.dead_letters, retry_topic=self.topics.service_retry(SERVICE),
        )
        self.published = 0

        app.agent(self.inputs, name=f"{SERVICE}.route_inputs")(self.route_inputs)
        app.agent(self.by_program, name=f"{SERVICE}.apply_inputs")(self.apply_inputs)
        app.timer(settings.tally_publish_interval_s, name=f"{SERVICE}.publish")(self.publish_dirty)
        self.trailing_holes = TrailingHoleWatch(app, SERVICE, {
            **dict.fromkeys(
                (self.topics.account_events, self.topics.logins, self.topics.service_retry(SERVICE)), self.input_order,
            ),
            self.by_program_topic_name: self.program_order,
        }, settings.trailing_hole_check_s)
        self.memberships.on_recover(self.rebuild_counts)

    def topic_specs(self) -> list[TopicSpec]:
        n = self.settings.topic_partitions
        return [
            TopicSpec(self.topics.account_events, n),
            TopicSpec(self.topics.logins, n),
            TopicSpec(self.topics.service_retry(SERVICE), n),
            TopicSpec(self.topics.dead_letters, n),
            TopicSpec(self.topics.program_tallies, n, compacted=True),
            TopicSpec(self.by_program_topic_name, n),
            *changelog_topic_specs(self.app, self.settings),
        ]

    # -- hop 1: validate and key by program ---------------------------------------------

    async def route_inputs(self, stream: Any) -> None:
        async for events in stream.take_events(self.settings.batch_size, self.settings.batch_within_s):
            started = time.perf_counter()
            batch = await self.input_order.batch(events)
            acks: list[Awaitable[Any]] = []
            items: list[AccountChange | Login] = []
            for record in batch.records:
                try:
                    items.append(parse_input(record.topic, record.value, record.headers, self.topics))
                except (codecs.DecodeError, InvalidInput) as exc:
                    _, ack = await self.dead_letters.send_pending(record, exc)
                    acks.append(ack)
            for program_id, inputs in pack_by_program(items):
                acks.append(await self.app.producer.send(
                    self.by_program_topic_name, program_id.encode(), inputs.encode(),
                    partition=None, timestamp=None, headers=None,
                ))
            # Everything the batch sends is acknowledged before its next offsets are written.
            for ack in acks:
                await ack
            await write_all(self.input_order.writes(batch))
            await self.input_order.done(batch)
            MESSAGES_PROCESSED.labels(SERVICE, "inputs").inc(len(batch.records))
            BATCH_SECONDS.labels(SERVICE, "inputs").observe(time.perf_counter() - started)

    # -- hop 2: apply per program -----------------------------------------------------------

    async def apply_inputs(self, stream: Any) -> None:
        async for events in stream.take_events(self.settings.batch_size, self.settings.batch_within_s):
            started = time.perf_counter()
            batch = await self.program_order.batch(events)
            writes = BatchWrites()
            applied = 0
            for record in batch.records:
                try:
                    program_id = (record.key or b"").decode()
                    inputs = ProgramInputs.decode(program_id, record.value)
                except (codecs.DecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError):
                    log.warning("skipping a by-program record that is not one this service wrote at %s[%s]@%s",
                                record.topic, record.partition, record.offset)
                    continue
                for change in inputs.changes:
                    self.apply_change(writes, record.partition, change)
                if inputs.last_login is not None:
                    self.apply_login(writes, record.partition, program_id, inputs.last_login)
                applied += inputs.records
            await write_all(self.program_order.writes(batch, {
                self.memberships_store: writes.memberships, self.logins_store: writes.last_logins,
            }))
            # The rows are in the local tables now; the counts follow with no await in between,
            # so a rebuild after a rebalance sees both or neither.
            for partition, program_id, before, after in writes.moves:
                self.counts.move(partition, program_id, before, after)
            self.dirty.update(writes.programs)
            await self.program_order.done(batch)
            MESSAGES_PROCESSED.labels(SERVICE, "by-program").inc(applied)
            BATCH_SECONDS.labels(SERVICE, "by-program").observe(time.perf_counter() - started)

    def apply_change(self, writes: BatchWrites, partition: int, change: AccountChange) -> None:
        """Add what ``change`` writes to ``writes`` (which also holds this batch's earlier changes)."""
        row = (partition, membership_key(change.program_id, change.account_id))
        raw = writes.memberships.get(row)
        if raw is None:
            raw = self.memberships_store.get(*row)
        current = decode_membership(raw) if raw is not None else None
        updated = apply_change(current, change)
        if updated is None:
            return  # a replay: this version is already applied
        writes.memberships[row] = encode_membership(updated)
        writes.moves.append((partition, change.program_id, current.status if current else None, updated.status))
        writes.programs.add(change.program_id)

    def apply_login(self, writes: BatchWrites, partition: int, program_id: str, ts: int) -> None:
        row = (partition, program_id.encode())
        raw = writes.last_logins.get(row)
        if raw is None:
            raw = self.logins_store.get(*row)
        if raw is not None and int(raw) >= ts:
            return
        writes.last_logins[row] = str(ts).encode()
        writes.programs.add(program_id)

    # -- recovery and publishing --------------------------------------------------------------

    async def rebuild_counts(self) -> None:
        started = time.perf_counter()
        owned = active_partitions(self.app, self.memberships)
        rows = self.counts.rebuild({p: state_items(self.memberships, p) for p in owned})
        self.dirty.update(self.local_programs())
        log.info(
            "rebuilt counts from %d memberships in %d partitions (%.2fs); %d programs to republish",
            rows, len(owned), time.perf_counter() - started, len(self.dirty),
        )

    def tally(self, program_id: str) -> Tally | None:
        partition = self._partition(program_id)
        counts = self.counts.get(partition, program_id)
        raw_login = self.logins_store.get(partition, program_id.encode())
        if counts is None and raw_login is None:
            return None
        active, inactive = counts if counts is not None else (0, 0)
        return Tally(
            program_id=program_id, numberActive=active, numberInactive=inactive,
            lastLogin=int(raw_login) if raw_login is not None else None,
        )

    def local_programs(self) -> set[str]:
        programs = {program for _, program in self.counts.programs()}
        for p in active_partitions(self.app, self.last_logins):
            programs.update(key.decode() for key, _ in state_items(self.last_logins, p))
        return programs

    def _partition(self, program_id: str) -> int:
        return partition_for(program_id, self.settings.topic_partitions)

    async def publish_dirty(self) -> None:
        if not self.dirty or self.app.rebalancing:
            return
        programs, self.dirty = self.dirty, set()
        owned = active_partitions(self.app, self.memberships)
        for program_id in sorted(programs):
            if self._partition(program_id) not in owned:
                continue
            tally = self.tally(program_id)
            if tally is None:
                continue
            await self.app.producer.send(
                self.topics.program_tallies, program_id.encode(), codecs.dumps(tally.to_json()),
                partition=None, timestamp=None, headers=None,
            )
            self.published += 1
