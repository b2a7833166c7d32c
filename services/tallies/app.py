"""The tallies service: its topology and batch handlers on the engine, for the projection
it runs (:mod:`shared.projection`; by default the accounts tallies of
:mod:`services.tallies.domain`, in whose words this is written: a program is the
projection's category, an account its entity, a login's ts its mark).

Two hops, because inputs are keyed by account and tallies by program:

1. ``route_inputs`` reads the projection's input topics (``account-events``, ``logins``) and
   the service's retry topic, validates each record with the projection's reader (events as
   every reader of ``account-events`` does, through :func:`shared.accounts.parse_event`; bad
   ones become dead letters, with the original
   topic, partition and offset, and are never counted), and forwards them to the internal ``…-by-program`` topic,
   packed: one record per program partition per batch (:class:`PackedInputs`).
2. ``apply_inputs`` reads that topic. Per program partition it holds the memberships
   table (the state), the last-logins table and the published-tallies table (the tally
   last published per program), updates the derived counts and publishes the tallies.

The engine hands each handler one input partition's records exactly once, in order, and
commits what the handler staged: sends acknowledged first, then the rows with the
input's next offset (changelog, then RocksDB). ``apply_inputs`` moves the in-memory
counts once its rows are in the local tables. Its input resumes from the smallest of the
three tables' next-offset copies, so a crash that left one table's rows in its changelog
and not another's re-applies the difference, which the version check (memberships), the
maximum (last logins) and the comparison with the published tally make harmless. So
after a SIGKILL, with the local state kept or restored from the changelogs alone, every
input record is applied exactly once in effect: none is skipped, none counts twice.

Tallies go to ``program-tallies`` from the by-program handler itself, in a batch, so that
they commit with the batch's rows (under exactly_once, in its Kafka transaction).
Applied changes mark their programs dirty, per partition. Every
``tally_publish_interval_s`` a timer sends a publish tick (:data:`PUBLISH_TICK`) onto each
owned by-program partition that has dirty programs (at most one outstanding per
partition). A batch holding a tick applies its other records as usual, then stages, for
each dirty program of its partition and each program it changed, the tally as it is after
the batch, but only when it differs from the program's row of ``published-tallies`` (the
tally last published), which it rewrites in the same batch. So a changed tally is
published once, at most once per tick per program: a batch cut short publishes nothing
that a committed reader sees (exactly_once) and is redone whole. After every rebalance, counts are rebuilt from the restored
memberships and every owned program is marked dirty, so nothing a crash interrupted stays
unpublished; the comparison with ``published-tallies`` keeps what was published already
from going out again. (Under at_least_once the engine sends a batch's records before its
rows are written: a crash in between publishes those tallies again.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from itertools import takewhile
from typing import Any

from services.tallies import DEFAULT_PORT, SERVICE
from services.tallies.domain import PROJECTION
from services.tallies.state import (
    PUBLISH_TICK,
    PackedInputs,
    ProgramCounts,
    cached,
    count_memberships,
    decode_membership,
    encode_membership,
    membership_key,
    pack_by_partition,
    program_prefix,
    split_membership_key,
)
from shared import codecs, dead_letters
from shared.engine import DeadLetterRoute, Engine, InputBatch, OrderedRows, TopicSpec, app_id, partition_for
from shared.projection import Change, InvalidInput, Mark, Projection, Reader, add_to, advance, load_projection
from shared.settings import Settings
from shared.topics import TopicNames, topic_names

log = logging.getLogger(__name__)

#: The service's tables, each with its changelog ``<app id>-<table>-changelog`` (compacted):
#: the chart's topic Job creates them for any projection (tools/helm_topics.py).
MEMBERSHIPS, LAST_LOGINS, PUBLISHED_TALLIES = TABLES = ("memberships", "last-logins", "published-tallies")


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


def service_name(projection: Projection) -> str:
    """The engine's name for the service running ``projection``: its consumer group, changelogs,
    retry topic and local data are named after it. ``tallies`` for the bundled default (as
    before projections), ``tallies-<name>`` for any other, so two never share state."""
    return SERVICE if projection.name == PROJECTION.name else f"{SERVICE}-{projection.name}"


def configured_projection(settings: Settings) -> Projection:
    """The projection ``STATEFLEET_TALLIES_PROJECTION`` names, else the accounts tallies."""
    return load_projection(settings.tallies_projection) if settings.tallies_projection else PROJECTION


class TalliesService:
    def __init__(self, settings: Settings, projection: Projection | None = None) -> None:
        self.settings = settings
        self.projection = projection = projection if projection is not None else configured_projection(settings)
        self.name = name = service_name(projection)
        self.topics = topics = topic_names(settings)
        self.input_topics = [topics.name(i.topic) for i in projection.inputs]
        self.output_topic = topics.name(projection.output_topic)
        self.engine = engine = Engine(name, settings, DEFAULT_PORT)
        self.partitions = partitions = settings.topic_partitions
        self.by_program_topic_name = f"{app_id(name, settings)}-by-program"
        self.retry_topic_name = topics.service_retry(name)
        self.evolve = projection.evolve

        self.memberships_store = engine.table(MEMBERSHIPS)
        self.logins_store = engine.table(LAST_LOGINS)
        #: Per program, the tally last staged for ``program-tallies`` (its JSON).
        # Added after deployments ran the by-program handler; a row lost with a cut-short batch
        # only republishes that tally (see rebuild_counts).
        self.published_store = engine.table(PUBLISHED_TALLIES, added_later=True)
        # Every read of a status's contribution goes through the counts' cache of it.
        self.counts = ProgramCounts(contribution=cached(projection.contribution))
        #: Per owned by-program partition, the programs whose tally may differ from the one published.
        self.dirty: dict[int, set[str]] = {}
        #: Publish ticks to the by-program partitions with programs to publish.
        self.publish_ticks = engine.ticker(
            self.by_program_topic_name,
            PUBLISH_TICK,
            interval_s=settings.tally_publish_interval_s,
            name="publish tick of by-program",
        )
        #: Tallies this instance's committed batches published.
        self.published = 0

        # Hop 1 keeps no state of its own: its next offsets are rows of memberships, so
        # they move with the partition and are restored with it.
        engine.handler(
            *self.input_topics,
            self.retry_topic_name,
            name="inputs",
            offsets=self.memberships_store,
            dead_letters=DeadLetterRoute(name, topics.dead_letters, self.retry_topic_name),
            sends=(self.by_program_topic_name,),
        )(self.route_inputs)
        engine.handler(
            self.by_program_topic_name,
            name="by-program",
            internal_partitions=partitions,
            offsets=[self.memberships_store, self.logins_store, self.published_store],
            sends=(self.output_topic,),
        )(self.apply_inputs)
        engine.watch_trailing_holes()
        engine.timer(settings.tally_publish_interval_s, name="publish")(self.send_publish_ticks)
        engine.on_recovered(self.memberships_store, self.rebuild_counts)

    def topic_specs(self) -> list[TopicSpec]:
        n = self.settings.topic_partitions
        return [
            *(TopicSpec(topic, n) for topic in self.input_topics),
            TopicSpec(self.retry_topic_name, n),
            TopicSpec(self.topics.dead_letters, n),
            TopicSpec(self.output_topic, n, compacted=True),
            *self.engine.internal_topic_specs(),
        ]

    # -- hop 1: validate and pack by program partition ----------------------------------------

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

    # -- hop 2: apply per program -----------------------------------------------------------

    async def apply_inputs(self, batch: InputBatch) -> None:
        moves: list[tuple[str, str | None, str]] = []
        programs: set[str] = set()
        applied = 0
        tick = False
        for record in batch.records:
            if record.value == PUBLISH_TICK:
                tick = True
                continue
            try:
                packed = PackedInputs.decode(record.value)
            except (codecs.DecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError):
                log.warning(
                    "skipping a by-program record that is not one this service wrote at %s[%s]@%s",
                    record.topic,
                    record.partition,
                    record.offset,
                )
                continue
            for program_id, inputs in packed.programs.items():
                for change in inputs.changes:
                    self.apply_change(batch, change, moves, programs)
                if inputs.last_login is not None:
                    self.apply_login(batch, program_id, inputs.last_login, programs)
            applied += packed.records
        batch.counted = applied
        partition = batch.partition
        considered: set[str] = set()
        published = 0
        if tick:
            self.publish_ticks.taken(partition)
            # The programs this batch changes go out with it, at their values after the batch,
            # rather than wait for the next tick.
            considered = self.dirty.get(partition, set()) | programs
            published = self.publish_changed(batch, considered, moves)

        def move_counts() -> None:
            # The rows are in the local tables now; the counts follow with no await in between,
            # so a rebuild after a rebalance sees both or neither.
            for program_id, before, after in moves:
                self.counts.move(partition, program_id, before, after)
            self.counts.note_applied(partition, self.memberships_store.applied_offset(partition))
            dirty = self.dirty.setdefault(partition, set())
            if tick:
                dirty -= considered
            else:
                dirty |= programs
            if not dirty:
                del self.dirty[partition]
            self.published += published

        batch.after_commit(move_counts)

    def apply_change(
        self, batch: InputBatch, change: Change, moves: list[tuple[str, str | None, str]], programs: set[str]
    ) -> None:
        """Stage what ``change`` writes (read against this batch's earlier changes)."""
        key = membership_key(change.category, change.entity)
        raw = batch.read(self.memberships_store, key)
        current = decode_membership(raw) if raw is not None else None
        updated = advance(self.evolve, current, change)
        if updated is None:
            return  # a replay: this version is already applied
        batch.write(self.memberships_store, key, encode_membership(updated))
        moves.append((change.category, current.status if current else None, updated.status))
        programs.add(change.category)

    def apply_login(self, batch: InputBatch, program_id: str, ts: int, programs: set[str]) -> None:
        key = program_id.encode()
        raw = batch.read(self.logins_store, key)
        if raw is not None and int(raw) >= ts:
            return
        batch.write(self.logins_store, key, str(ts).encode())
        programs.add(program_id)

    # -- recovery and reads -------------------------------------------------------------------

    async def rebuild_counts(self) -> None:
        """After a rebalance's recovery: count the owned partitions whose rows changed other than
        by this instance's own writes (newly owned, restored, or a standby before); the others'
        counts still match their rows (see :class:`ProgramCounts`)."""
        started = time.perf_counter()
        owned = self.owned_partitions()
        applied = {p: self.memberships_store.applied_offset(p) for p in owned}
        kept = {p for p in owned if self.counts.current(p, applied[p])}
        recounted = owned - kept
        rows = self.counts.rebuild({p: self.memberships_store.items(p) for p in recounted}, keep=kept, applied=applied)
        # Every program of a recounted partition is compared with its published tally at the next
        # tick: what a crash, or the previous owner, left unpublished goes out, and nothing else.
        dirty = {p: self.dirty.get(p, set()) | (self.programs_in([p]) if p in recounted else set()) for p in owned}
        self.dirty = {p: programs for p, programs in dirty.items() if programs}
        self.publish_ticks.forget()
        log.info(
            "counted %d memberships in %d of %d owned partitions (%.2fs; the others' counts match their rows); "
            "%d programs to compare with their published tallies",
            rows,
            len(recounted),
            len(owned),
            time.perf_counter() - started,
            sum(len(programs) for programs in self.dirty.values()),
        )

    def tally(self, program_id: str) -> dict[str, Any] | None:
        """The program's row (its tally) from this instance's copy of its partition (active or not)."""
        partition = self._partition(program_id)
        counts = self._program_counts(partition, program_id)
        raw_login = self.logins_store.get(partition, program_id.encode())
        return self.row_of(program_id, counts, raw_login)

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
        return self.counts.holds(partition) and self.engine.instance.ready()

    def _program_counts(self, partition: int, program_id: str) -> tuple[int, ...] | None:
        if self._counts_current(partition):
            return self.counts.get(partition, program_id)
        # A copy this instance does not process (a standby, a partition it owned before, or one
        # it is restoring): its counts are not kept in memory, so they are counted from its memberships.
        prefix = program_prefix(program_id)
        rows = self.memberships_store.items(partition, from_key=prefix)
        return count_memberships(takewhile(lambda row: row[0].startswith(prefix), rows), self.counts.contribution)

    def owned_partitions(self) -> set[int]:
        return self.memberships_store.owned_partitions()

    def programs_in(self, partitions: Iterable[int]) -> set[str]:
        """The programs of ``partitions``, from this instance's copy of each (owned or not)."""
        programs: set[str] = set()
        for p in partitions:
            if self._counts_current(p):
                programs.update(self.counts.programs_of(p))
            else:
                programs.update(split_membership_key(key)[0] for key, _ in self.memberships_store.items(p))
            programs.update(key.decode() for key, _ in self.logins_store.items(p))
        return programs

    def _partition(self, program_id: str) -> int:
        return partition_for(program_id, self.partitions)

    # -- publishing ---------------------------------------------------------------------------

    async def send_publish_ticks(self) -> None:
        """Ask the handler of every owned partition with changed programs to publish them (the
        timer; it never raises: a tick that could not be sent is sent with the next interval)."""
        if not self.engine.instance.ready() or not self.dirty:
            return
        await self.publish_ticks.send_to(p for p in self.owned_partitions() if self.dirty.get(p))

    def publish_changed(self, batch: InputBatch, programs: Iterable[str], moves: list[tuple[str, str | None, str]]) -> int:
        """Stage on ``batch`` the tally of each of ``programs`` (of the batch's partition) as it is
        after the batch, where it differs from the one last published, with its new
        ``published-tallies`` row; returns how many."""
        deltas: dict[str, list[int]] = {}
        moved = self.counts.moved
        for program_id, before, after in moves:
            entry = deltas.get(program_id)
            if entry is None:
                deltas[program_id] = list(moved(before, after))
            else:
                add_to(entry, moved(before, after))
        staged = 0
        for program_id in sorted(programs):
            row = self.tally_after(batch, program_id, deltas.get(program_id))
            if row is None:
                continue
            key = program_id.encode()
            value = codecs.dumps(row)
            if batch.read(self.published_store, key) == value:
                continue  # published already
            batch.send(self.output_topic, key, value)
            batch.write(self.published_store, key, value)
            staged += 1
        return staged

    def tally_after(self, batch: InputBatch, program_id: str, delta: list[int] | None) -> dict[str, Any] | None:
        """The program's row once ``batch`` is committed: the in-memory counts (moved only after
        the commit) with the batch's moves (``delta``), and the last login as the batch sees it."""
        partition = batch.partition
        counts: tuple[int, ...] | None
        if self.counts.holds(partition):
            counts = self.counts.get(partition, program_id)
            if delta is not None:
                counts = tuple(c + d for c, d in zip(counts, delta, strict=True)) if counts is not None else tuple(delta)
        else:  # not counted in memory (yet): count the memberships as the batch sees them
            counts = count_memberships(program_rows(batch.view(self.memberships_store), program_id), self.counts.contribution)
        raw_login = batch.read(self.logins_store, program_id.encode())
        return self.row_of(program_id, counts, raw_login)

    def row_of(self, program_id: str, counts: tuple[int, ...] | None, raw_login: bytes | None) -> dict[str, Any] | None:
        """A program's row from its counts and its last-logins row (None: neither)."""
        if counts is None and raw_login is None:
            return None
        return self.projection.row(program_id, counts, int(raw_login) if raw_login is not None else None)


def program_rows(view: OrderedRows, program_id: str) -> Iterable[tuple[bytes, bytes]]:
    """The membership rows of ``program_id`` in ``view``, in key order."""
    prefix = program_prefix(program_id)
    it = view.iter()
    it.seek(prefix)
    while it.valid() and it.key().startswith(prefix):
        yield it.key(), it.value()
        it.next()
