"""Hop 2 of the tallies: ``apply_inputs`` reads the internal ``…-by-program`` topic. Per program
partition it holds the memberships table (the state), the last-logins table and the
published-tallies table (the tally last published per program), updates the derived counts and
publishes the tallies (see :mod:`services.tallies.app` for why every input record is applied
exactly once in effect, and how tallies are published)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from itertools import takewhile
from typing import Any

from services.tallies.state import (
    PUBLISH_TICK,
    PackedInputs,
    ProgramCounts,
    count_memberships,
    decode_membership,
    encode_membership,
    membership_key,
    program_prefix,
    split_membership_key,
)
from shared import codecs
from shared.engine import Engine, InputBatch, OrderedRows, Table, partition_for
from shared.projection import Change, Projection, add_to, advance
from shared.settings import Settings

log = logging.getLogger(__name__)


class ByProgram:
    """The ``by-program`` handler, its counts, its publishing and the reads they answer."""

    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        projection: Projection,
        *,
        by_program_topic: str,
        output_topic: str,
        memberships: Table,
        logins: Table,
        published: Table,
        counts: ProgramCounts,
    ) -> None:
        self.engine = engine
        self.projection = projection
        self.evolve = projection.evolve
        self.partitions = settings.topic_partitions
        self.output_topic = output_topic
        self.memberships_store = memberships
        self.logins_store = logins
        self.published_store = published
        self.counts = counts
        #: Per owned by-program partition, the programs whose tally may differ from the one published.
        self.dirty: dict[int, set[str]] = {}
        #: Publish ticks to the by-program partitions with programs to publish.
        self.publish_ticks = engine.ticker(
            by_program_topic, PUBLISH_TICK, interval_s=settings.tally_publish_interval_s, name="publish tick of by-program"
        )
        #: Tallies this instance's committed batches published.
        self.published = 0
        engine.handler(
            by_program_topic,
            name="by-program",
            internal_partitions=self.partitions,
            offsets=[memberships, logins, published],
            sends=(output_topic,),
        )(self.apply_inputs)
        engine.timer(settings.tally_publish_interval_s, name="publish")(self.send_publish_ticks)
        engine.on_recovered(memberships, self.rebuild_counts)

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
