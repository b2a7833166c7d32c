"""How tallies are kept in RocksDB, and the in-memory counts derived from it, for any
projection (:mod:`shared.projection`): a program below is the projection's category (a
customer…), an account its entity (an order…), a login's ts its mark, and the counts its
totals (numberActive, numberInactive for the accounts).

The ``memberships`` table is the state: one row per (program, account) holding the
account's status and the version it was last changed at. Counts are not stored;
they are derived from memberships when partitions are assigned and kept up to date
in memory as memberships change. A crash between two writes therefore cannot leave
counts and memberships disagreeing: after a restart the counts are rebuilt from
whatever memberships were restored.

The tables: ``memberships``: program_id NUL account_id → ``status:version``;
``last-logins``: program_id → largest login ts. Program ids are non-empty and contain no NUL.

The ``published-tallies`` table (program_id → the tally JSON last staged for
``program-tallies``) is written by the same batches, so a tally is published when, and only
when, it differs from that row.

Records of the internal by-program topic are :class:`PackedInputs` (a JSON object, so
their first byte is ``{``) or :data:`PUBLISH_TICK`, which no packed record ever equals.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import Any

from services.tallies import SERVICE
from services.tallies.domain import PROJECTION
from shared import codecs
from shared.engine import partition_for
from shared.projection import Change, Mark, Membership, Projection, build_record, delta, latest

Contribution = Callable[[str], tuple[int, ...]]


def cached(contribution: Contribution) -> Contribution:
    """``contribution`` remembered per status (statuses repeat: a few per projection, or a few
    thousand where they hold an amount); it is called several times per applied change."""
    return lru_cache(maxsize=4096)(contribution)


#: The default projection's, for callers that name none.
DEFAULT_CONTRIBUTION = cached(PROJECTION.contribution)

SEPARATOR = b"\x00"

#: The value of a by-program record that asks the handler of its partition to publish the
#: partition's changed tallies (sent by the publish timer). :meth:`PackedInputs.encode`
#: writes a JSON object, which starts with ``{``: it never writes this value.
PUBLISH_TICK = b"publish-tick"


def membership_key(program_id: str, account_id: str) -> bytes:
    return program_id.encode() + SEPARATOR + account_id.encode()


def split_membership_key(key: bytes) -> tuple[str, str]:
    program, _, account = key.partition(SEPARATOR)
    return program.decode(), account.decode()


def encode_membership(m: Membership) -> bytes:
    return f"{m.status}:{m.version}".encode()


def decode_membership(raw: bytes) -> Membership:
    status, _, version = raw.decode().rpartition(":")
    return build_record(Membership, (status, int(version)))


def program_prefix(program_id: str) -> bytes:
    """Every membership key of ``program_id`` starts with this (and no other program's does)."""
    return program_id.encode() + SEPARATOR


def count_memberships(
    rows: Iterable[tuple[bytes, bytes]], contribution: Contribution = DEFAULT_CONTRIBUTION
) -> tuple[int, ...] | None:
    """The totals (numberActive, numberInactive…) over one program's membership rows; None when it has none."""
    totals: list[int] | None = None
    for _, raw in rows:
        counted = contribution(decode_membership(raw).status)
        if totals is None:
            totals = [0] * len(counted)
        for i, value in enumerate(counted):
            totals[i] += value
    return tuple(totals) if totals is not None else None


@dataclass
class ProgramCounts:
    """numberActive / numberInactive per program, for the partitions this instance owns.

    Each partition's counts are known to match its memberships up to a changelog offset of the
    local copy (``matched``): the offset it was counted at, moved on by this instance's own
    writes. Rows only ever reach an owned partition's copy through those writes; anything else
    (a restore, a standby's reading) moves the copy's offset past the one matched, and the
    partition is counted again at the next rebuild."""

    by_partition: dict[int, dict[str, list[int]]] = field(default_factory=dict)
    #: Per partition counted here, the memberships changelog offset its counts match.
    matched: dict[int, int | None] = field(default_factory=dict)
    #: What a member of each status adds to its program's counts (the projection's, cached).
    contribution: Contribution = DEFAULT_CONTRIBUTION
    #: How a program's counts move when an account goes from one status (None: new) to another
    #: (:func:`shared.projection.delta`, remembered per pair: applied for every change).
    moved: Callable[[str | None, str], tuple[int, ...]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.moved = lru_cache(maxsize=4096)(partial(delta, self.contribution))

    def current(self, partition: int, applied: int | None) -> bool:
        """Whether ``partition``'s counts match its rows, whose local copy has applied the
        changelog up to ``applied``."""
        return partition in self.matched and self.matched[partition] == applied and partition in self.by_partition

    def note_applied(self, partition: int, applied: int | None) -> None:
        """This instance's own write brought ``partition``'s copy to ``applied`` (the counts moved
        with it)."""
        if partition in self.matched:
            self.matched[partition] = applied

    def rebuild(
        self,
        partitions: dict[int, Iterable[tuple[bytes, bytes]]],
        *,
        keep: Iterable[int] = (),
        applied: dict[int, int | None] | None = None,
    ) -> int:
        """Recount ``partitions`` from their memberships (their copies at the ``applied``
        changelog offsets), keep the counts of ``keep`` as they are, and forget every other
        partition's; returns rows read."""
        rows = 0
        kept = [p for p in keep if p in self.by_partition and p in self.matched]
        fresh: dict[int, dict[str, list[int]]] = {p: self.by_partition[p] for p in kept}
        matched: dict[int, int | None] = {p: self.matched[p] for p in kept}
        contribution = self.contribution
        for partition, items in partitions.items():
            counts: dict[str, list[int]] = {}
            for key, raw in items:
                rows += 1
                program, _ = split_membership_key(key)
                counted = contribution(decode_membership(raw).status)
                entry = counts.get(program)
                if entry is None:
                    entry = counts[program] = [0] * len(counted)
                for i, value in enumerate(counted):
                    entry[i] += value
            fresh[partition] = counts
            matched[partition] = (applied or {}).get(partition)
        self.by_partition = fresh
        self.matched = matched
        return rows

    def move(self, partition: int, program_id: str, before: str | None, after: str) -> None:
        """An account of ``program_id`` went from status ``before`` (None: new) to ``after``."""
        moved = self.moved(before, after)
        programs = self.by_partition.get(partition)
        if programs is None:
            programs = self.by_partition[partition] = {}
        entry = programs.get(program_id)
        if entry is None:
            programs[program_id] = list(moved)
        else:
            for i, value in enumerate(moved):  # add_to, inlined: once per applied change
                if value:
                    entry[i] += value

    def holds(self, partition: int) -> bool:
        """Whether the counts of ``partition`` are kept here (it is, or was until now, owned)."""
        return partition in self.by_partition

    def get(self, partition: int, program_id: str) -> tuple[int, ...] | None:
        entry = self.by_partition.get(partition, {}).get(program_id)
        return tuple(entry) if entry is not None else None

    def programs_of(self, partition: int) -> Iterable[str]:
        return self.by_partition.get(partition, {}).keys()

    def programs(self) -> Iterator[tuple[int, str]]:
        for partition, counts in self.by_partition.items():
            for program in counts:
                yield partition, program


#: Most account changes packed into one record of the by-program topic (keeps records far
#: below the broker's size limit).
MAX_CHANGES_PER_RECORD = 5000


@dataclass
class ProgramInputs:
    """One program's inputs from one batch: account changes in arrival order, and the largest
    login ts (mark). Applying them is the same per-change version check as applying one at a
    time, so a replayed record changes nothing."""

    changes: list[Change] = field(default_factory=list)
    last_login: int | None = None


@dataclass
class PackedInputs:
    """The inputs of one batch bound for one partition of the by-program topic, as one record.

    Packing per partition rather than per program spares the second hop a record per
    program per batch. ``records`` is how many input records it stands for (for the
    processed-messages metric of the second hop)."""

    programs: dict[str, ProgramInputs] = field(default_factory=dict)
    records: int = 0
    changes: int = 0

    def add(self, item: Change | Mark) -> None:
        inputs = self.programs.get(item.category)
        if inputs is None:
            inputs = self.programs[item.category] = ProgramInputs()
        if isinstance(item, Mark):
            inputs.last_login = latest(inputs.last_login, item.value)
        else:
            inputs.changes.append(item)  # type: ignore[arg-type]
            self.changes += 1
        self.records += 1

    def encode(self) -> bytes:
        return codecs.dumps(
            {
                "p": [
                    [program, [[c.entity, c.event, c.version] for c in inputs.changes], inputs.last_login]
                    for program, inputs in self.programs.items()
                ],
                "n": self.records,
            }
        )

    @staticmethod
    def decode(raw: bytes | None) -> PackedInputs:
        obj: Any = codecs.loads_object(raw)
        packed = PackedInputs(records=int(obj["n"]))
        for program, changes, last_login in obj["p"]:
            packed.programs[program] = ProgramInputs(
                changes=[build_record(Change, (a, program, e, v)) for a, e, v in changes], last_login=last_login
            )
            packed.changes += len(changes)
        return packed


def pack_by_partition(items: Iterable[Change | Mark], partitions: int) -> list[tuple[int, PackedInputs]]:
    """Group a batch's inputs by the by-program partition of their program, keeping each
    account's changes in order; a partition's changes past :data:`MAX_CHANGES_PER_RECORD`
    start another record."""
    packed: dict[int, list[PackedInputs]] = {}
    partition_of: dict[str, int] = {}
    for item in items:
        category = item.category
        partition = partition_of.get(category)
        if partition is None:
            partition = partition_of[category] = partition_for(category, partitions)
        parts = packed.get(partition)
        if parts is None:
            parts = packed[partition] = [PackedInputs()]
        if not isinstance(item, Mark) and parts[-1].changes >= MAX_CHANGES_PER_RECORD:
            parts.append(PackedInputs())
        parts[-1].add(item)
    return [(partition, part) for partition, parts in packed.items() for part in parts]


def service_name(projection: Projection) -> str:
    """The engine's name for the service running ``projection``: its consumer group, changelogs,
    retry topic and local data are named after it. ``tallies`` for the bundled default (as
    before projections), ``tallies-<name>`` for any other, so two never share state."""
    return SERVICE if projection.name == PROJECTION.name else f"{SERVICE}-{projection.name}"
