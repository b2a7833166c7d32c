"""How tallies are kept in RocksDB, and the in-memory counts derived from it.

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

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from services.tallies.domain import Login, Membership, build_record, count_delta, latest_login
from shared import codecs
from shared.accounts import AccountChange, tally_counts
from shared.engine import partition_for

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


def count_memberships(rows: Iterable[tuple[bytes, bytes]]) -> tuple[int, int] | None:
    """(numberActive, numberInactive) over one program's membership rows; None when it has none."""
    active = inactive = 0
    seen = False
    for _, raw in rows:
        seen = True
        a, i = tally_counts(decode_membership(raw).status)
        active += a
        inactive += i
    return (active, inactive) if seen else None


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
        for partition, items in partitions.items():
            counts: dict[str, list[int]] = {}
            for key, raw in items:
                rows += 1
                program, _ = split_membership_key(key)
                active, inactive = tally_counts(decode_membership(raw).status)
                entry = counts.setdefault(program, [0, 0])
                entry[0] += active
                entry[1] += inactive
            fresh[partition] = counts
            matched[partition] = (applied or {}).get(partition)
        self.by_partition = fresh
        self.matched = matched
        return rows

    def move(self, partition: int, program_id: str, before: str | None, after: str) -> None:
        d_active, d_inactive = count_delta(before, after)
        entry = self.by_partition.setdefault(partition, {}).setdefault(program_id, [0, 0])
        entry[0] += d_active
        entry[1] += d_inactive

    def holds(self, partition: int) -> bool:
        """Whether the counts of ``partition`` are kept here (it is, or was until now, owned)."""
        return partition in self.by_partition

    def get(self, partition: int, program_id: str) -> tuple[int, int] | None:
        entry = self.by_partition.get(partition, {}).get(program_id)
        return (entry[0], entry[1]) if entry is not None else None

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
    login ts. Applying them is the same per-change version check as applying one at a
    time, so a replayed record changes nothing."""

    changes: list[AccountChange] = field(default_factory=list)
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

    def add(self, item: AccountChange | Login) -> None:
        inputs = self.programs.get(item.program_id)
        if inputs is None:
            inputs = self.programs[item.program_id] = ProgramInputs()
        if isinstance(item, Login):
            inputs.last_login = latest_login(inputs.last_login, item.ts)
        else:
            inputs.changes.append(item)
            self.changes += 1
        self.records += 1

    def encode(self) -> bytes:
        return codecs.dumps(
            {
                "p": [
                    [program, [[c.account_id, c.type, c.version] for c in inputs.changes], inputs.last_login]
                    for program, inputs in self.programs.items()
                ],
                "n": self.records,
            }
        )

    @staticmethod
    def decode(raw: bytes | None) -> PackedInputs:
        obj = codecs.loads_object(raw)
        packed = PackedInputs(records=int(obj["n"]))
        for program, changes, last_login in obj["p"]:
            packed.programs[program] = ProgramInputs(
                changes=[build_record(AccountChange, (a, program, t, v, None)) for a, t, v in changes], last_login=last_login
            )
            packed.changes += len(changes)
        return packed


def pack_by_partition(items: Iterable[AccountChange | Login], partitions: int) -> list[tuple[int, PackedInputs]]:
    """Group a batch's inputs by the by-program partition of their program, keeping each
    account's changes in order; a partition's changes past :data:`MAX_CHANGES_PER_RECORD`
    start another record."""
    packed: dict[int, list[PackedInputs]] = {}
    partition_of: dict[str, int] = {}
    for item in items:
        partition = partition_of.get(item.program_id)
        if partition is None:
            partition = partition_of[item.program_id] = partition_for(item.program_id, partitions)
        parts = packed.get(partition)
        if parts is None:
            parts = packed[partition] = [PackedInputs()]
        if isinstance(item, AccountChange) and parts[-1].changes >= MAX_CHANGES_PER_RECORD:
            parts.append(PackedInputs())
        parts[-1].add(item)
    return [(partition, part) for partition, parts in packed.items() for part in parts]
