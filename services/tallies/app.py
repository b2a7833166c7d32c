"""The tallies service: its topology and batch handlers on the engine.

Two hops, because inputs are keyed by account and tallies by program:

1. ``route_inputs`` reads ``account-events``, ``logins`` and the service's retry topic,
   validates each record (events as every reader of ``account-events`` does, through
   :func:`shared.accounts.parse_event`; bad ones become dead letters, with the original
   topic, partition and offset, and are never counted), and forwards them to the internal ``…-by-program`` topic,
   packed: one record per program partition per batch (:class:`PackedInputs`).
2. ``apply_inputs`` reads that topic. Per program partition it holds the memberships
   table (the state) and the last-logins table, and updates the derived counts.

The engine hands each handler one input partition's records exactly once, in order, and
commits what the handler staged: sends acknowledged first, then the rows with the
input's next offset (changelog, then RocksDB). ``apply_inputs`` moves the in-memory
counts once its rows are in the local tables. Its input resumes from the smaller of the
two tables' next-offset copies, so a crash that left one table's rows in its changelog
and not the other's re-applies the difference, which the version check (memberships)
and the maximum (last logins) make harmless. So after a SIGKILL, with the local state
kept or restored from the changelogs alone, every input record is applied exactly once
in effect: none is skipped, none counts twice.

Changed programs are marked dirty and published to ``program-tallies`` by a timer
(at most once per interval per program, not once per input event). After every
rebalance, counts are rebuilt from the restored memberships and every owned program
is republished, so nothing a crash interrupted stays unpublished.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from itertools import takewhile
from typing import Any

from services.tallies import DEFAULT_PORT, SERVICE
from services.tallies.domain import (
    InvalidInput,
    Login,
    Tally,
    apply_change,
    parse_account_change,
    parse_login,
)
from services.tallies.state import (
    PackedInputs,
    ProgramCounts,
    count_memberships,
    decode_membership,
    encode_membership,
    membership_key,
    pack_by_partition,
    program_prefix,
    split_membership_key,
)
from shared import codecs, dead_letters
from shared.accounts import AccountChange
from shared.engine import (
    DeadLetterRoute,
    Engine,
    InputBatch,
    Outgoing,
    SendFailed,
    TopicSpec,
    active_partitions,
    app_id,
    partition_for,
    partition_items,
    ready,
    state_items,
)
from shared.settings import Settings
from shared.topics import TopicNames, topic_names

log = logging.getLogger(__name__)


def parse_input(topic: str, value: bytes | None, headers: Any, topics: TopicNames) -> AccountChange | Login:
    """Validate one input record; the topic (or, for a retry, its original topic) says what it is."""
    origin = topic
    if topic == topics.service_retry(SERVICE):
        origin = dead_letters.headers_dict(dead_letters.header_items(headers)).get(dead_letters.ORIGINAL_TOPIC, "")
    parse = parser_for(origin, topics)
    if parse is None:
        raise InvalidInput(f"cannot tell what a record from topic {origin!r} is")
    return parse(value)


def parse_change(value: bytes | None) -> AccountChange | Login:
    return parse_account_change(codecs.loads_object(value))


def parse_login_record(value: bytes | None) -> AccountChange | Login:
    return parse_login(codecs.loads_object(value))


def parser_for(origin: str, topics: TopicNames) -> Callable[[bytes | None], AccountChange | Login] | None:
    """How a record from topic ``origin`` is read (None: no input of this service comes from there)."""
    if origin == topics.account_events:
        return parse_change
    if origin == topics.logins:
        return parse_login_record
    return None


class TalliesService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topics = topics = topic_names(settings)
        self.engine = engine = Engine(SERVICE, settings, DEFAULT_PORT)
        self.app = engine.app
        self.partitions = partitions = settings.topic_partitions
        self.by_program_topic_name = f"{app_id(SERVICE, settings)}-by-program"
        self.retry_topic_name = topics.service_retry(SERVICE)

        self.memberships_store = engine.table("memberships")
        self.logins_store = engine.table("last-logins")
        self.memberships = self.memberships_store.table
        self.last_logins = self.logins_store.table
        self.counts = ProgramCounts()
        self.dirty: set[str] = set()
        self.published = 0

        # Hop 1 keeps no state of its own: its next offsets are rows of memberships, so
        # they move with the partition and are restored with it.
        engine.handler(
            topics.account_events, topics.logins, self.retry_topic_name, name="inputs",
            offsets=self.memberships_store,
            dead_letters=DeadLetterRoute(SERVICE, topics.dead_letters, self.retry_topic_name),
        )(self.route_inputs)
        engine.handler(
            self.by_program_topic_name, name="by-program", internal_partitions=partitions,
            offsets=[self.memberships_store, self.logins_store],
        )(self.apply_inputs)
        engine.watch_trailing_holes()
        engine.timer(settings.tally_publish_interval_s, name="publish")(self.publish_dirty)
        engine.on_recovered(self.memberships_store, self.rebuild_counts)

    def topic_specs(self) -> list[TopicSpec]:
        n = self.settings.topic_partitions
        return [
            TopicSpec(self.topics.account_events, n),
            TopicSpec(self.topics.logins, n),
            TopicSpec(self.retry_topic_name, n),
            TopicSpec(self.topics.dead_letters, n),
            TopicSpec(self.topics.program_tallies, n, compacted=True),
            *self.engine.internal_topic_specs(),
        ]

    # -- hop 1: validate and pack by program partition ----------------------------------------

    async def route_inputs(self, batch: InputBatch) -> None:
        items: list[AccountChange | Login] = []
        # Every record of a batch comes from one topic: one look-up of its reader, unless it is
        # the retry topic, whose records each say where they came from.
        parse = parser_for(batch.topic, self.topics)
        for record in batch.records:
            try:
                if parse is not None:
                    items.append(parse(record.value))
                else:
                    items.append(parse_input(record.topic, record.value, record.headers, self.topics))
            except (codecs.DecodeError, InvalidInput) as exc:
                batch.dead_letter(record, exc)
        for partition, packed in pack_by_partition(items, self.partitions):
            batch.send(self.by_program_topic_name, None, packed.encode(), partition=partition)

    # -- hop 2: apply per program -----------------------------------------------------------

    async def apply_inputs(self, batch: InputBatch) -> None:
        moves: list[tuple[str, str | None, str]] = []
        programs: set[str] = set()
        applied = 0
        for record in batch.records:
            try:
                packed = PackedInputs.decode(record.value)
            except (codecs.DecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError):
                log.warning("skipping a by-program record that is not one this service wrote at %s[%s]@%s",
                            record.topic, record.partition, record.offset)
                continue
            for program_id, inputs in packed.programs.items():
                for change in inputs.changes:
                    self.apply_change(batch, change, moves, programs)
                if inputs.last_login is not None:
                    self.apply_login(batch, program_id, inputs.last_login, programs)
            applied += packed.records
        batch.counted = applied

        def move_counts() -> None:
            # The rows are in the local tables now; the counts follow with no await in between,
            # so a rebuild after a rebalance sees both or neither.
            for program_id, before, after in moves:
                self.counts.move(batch.partition, program_id, before, after)
            self.dirty.update(programs)

        batch.after_commit(move_counts)

    def apply_change(
        self, batch: InputBatch, change: AccountChange, moves: list[tuple[str, str | None, str]], programs: set[str],
    ) -> None:
        """Stage what ``change`` writes (read against this batch's earlier changes)."""
        key = membership_key(change.program_id, change.account_id)
        raw = batch.read(self.memberships_store, key)
        current = decode_membership(raw) if raw is not None else None
        updated = apply_change(current, change)
        if updated is None:
            return  # a replay: this version is already applied
        batch.write(self.memberships_store, key, encode_membership(updated))
        moves.append((change.program_id, current.status if current else None, updated.status))
        programs.add(change.program_id)

    def apply_login(self, batch: InputBatch, program_id: str, ts: int, programs: set[str]) -> None:
        key = program_id.encode()
        raw = batch.read(self.logins_store, key)
        if raw is not None and int(raw) >= ts:
            return
        batch.write(self.logins_store, key, str(ts).encode())
        programs.add(program_id)

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
        """The program's tally from this instance's copy of its partition (active or not)."""
        partition = self._partition(program_id)
        counts = self._program_counts(partition, program_id)
        raw_login = self.logins_store.get(partition, program_id.encode())
        if counts is None and raw_login is None:
            return None
        active, inactive = counts if counts is not None else (0, 0)
        return Tally(
            program_id=program_id, numberActive=active, numberInactive=inactive,
            lastLogin=int(raw_login) if raw_login is not None else None,
        )

    def _counts_current(self, partition: int) -> bool:
        """Whether the in-memory counts answer for ``partition``.

        They are rebuilt from the memberships once a rebalance's recovery is done and move
        with every batch after that, so they match the rows of the partitions this instance
        processes, and only then: from a rebalance's start until its recovery is done they
        are the counts of before it, while the rows under them are being restored. An instance
        that was stopped and removed from the group comes back with the counts of before the
        stop and restores what the others wrote meanwhile: its counts would be answered as a
        copy as fresh as the restored rows (lag 0 once they are caught up), yet be as stale
        as before the restore. Meanwhile the rows themselves answer, with the lag they have."""
        return self.counts.holds(partition) and ready(self.app)

    def _program_counts(self, partition: int, program_id: str) -> tuple[int, int] | None:
        if self._counts_current(partition):
            return self.counts.get(partition, program_id)
        # A copy this instance does not process (a standby, a partition it owned before, or one
        # it is restoring): its counts are not kept in memory, so they are counted from its memberships.
        prefix = program_prefix(program_id)
        rows = partition_items(self.memberships, partition, from_key=prefix)
        return count_memberships(takewhile(lambda row: row[0].startswith(prefix), rows))

    def local_programs(self) -> set[str]:
        """The programs of the partitions this instance owns."""
        return self.programs_in(self.owned_partitions())

    def owned_partitions(self) -> set[int]:
        return active_partitions(self.app, self.memberships)

    def programs_in(self, partitions: Iterable[int]) -> set[str]:
        """The programs of ``partitions``, from this instance's copy of each (owned or not)."""
        programs: set[str] = set()
        for p in partitions:
            if self._counts_current(p):
                programs.update(self.counts.programs_of(p))
            else:
                programs.update(split_membership_key(key)[0] for key, _ in state_items(self.memberships, p))
            programs.update(key.decode() for key, _ in state_items(self.last_logins, p))
        return programs

    def _partition(self, program_id: str) -> int:
        return partition_for(program_id, self.partitions)

    async def publish_dirty(self) -> None:
        """Send the tallies of the programs changed since the last call, all in one go."""
        if not self.dirty or self.app.rebalancing:
            return
        programs, self.dirty = self.dirty, set()
        owned = active_partitions(self.app, self.memberships)
        records: list[Outgoing] = []
        for program_id in sorted(programs):
            if self._partition(program_id) not in owned:
                continue
            tally = self.tally(program_id)
            if tally is not None:
                records.append(Outgoing(self.topics.program_tallies, program_id.encode(), codecs.dumps(tally.to_json())))
        try:
            await self.engine.send_all(records)
        except SendFailed as exc:  # published again with the next interval's changes
            self.dirty |= programs
            log.warning("publishing %d tallies failed (%s); retrying with the next interval", len(records), exc)
            return
        self.published += len(records)
