"""How tallies are kept in RocksDB, and the in-memory counts derived from it.

The ``memberships`` table is the state: one row per (program, account) holding the
account's status and the version it was last changed at. Counts are not stored;
they are derived from memberships when partitions are assigned and kept up to date
in memory as memberships change. A crash between two writes therefore cannot leave
counts and memberships disagreeing: after a restart the counts are rebuilt from
whatever memberships were restored.

Both tables (``memberships``: program_id NUL account_id → ``status:version``;
``last-logins``: program_id → largest login ts) also hold the agents' next expected
input offsets, under ``shared.durable.NEXT_OFFSET_PREFIX`` + topic. Program ids are
non-empty and contain no NUL, so no tally key starts with that prefix; listings of the
tables go through ``shared.durable.state_items``, which leaves those rows out.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from services.tallies.domain import ACTIVE, INACTIVE, Membership, count_delta

SEPARATOR = b"\x00"


def membership_key(program_id: str, account_id: str) -> bytes:
    return program_id.encode() + SEPARATOR + account_id.encode()


def split_membership_key(key: bytes) -> tuple[str, str]:
    program, _, account = key.partition(SEPARATOR)
    return program.decode(), account.decode()


def encode_membership(m: Membership) -> bytes:
    return f"{m.status}:{m.version}".encode()


def decode_membership(raw: bytes) -> Membership:
    status, _, version = raw.decode().rpartition(":")
    return Membership(status=status, version=int(version))


@dataclass
class ProgramCounts:
    """numberActive / numberInactive per program, for the partitions this instance owns."""

    by_partition: dict[int, dict[str, list[int]]] = field(default_factory=dict)

    def rebuild(self, partitions: dict[int, Iterable[tuple[bytes, bytes]]]) -> int:
        """Recount from each owned partition's memberships; returns rows read."""
        rows = 0
        fresh: dict[int, dict[str, list[int]]] = {}
        for partition, items in partitions.items():
            counts: dict[str, list[int]] = {}
            for key, raw in items:
                rows += 1
                program, _ = split_membership_key(key)
                status = decode_membership(raw).status
                entry = counts.setdefault(program, [0, 0])
                entry[0] += status == ACTIVE
                entry[1] += status == INACTIVE
            fresh[partition] = counts
        self.by_partition = fresh
        return rows

    def move(self, partition: int, program_id: str, before: str | None, after: str) -> None:
        d_active, d_inactive = count_delta(before, after)
        entry = self.by_partition.setdefault(partition, {}).setdefault(program_id, [0, 0])
        entry[0] += d_active
        entry[1] += d_inactive

    def get(self, partition: int, program_id: str) -> tuple[int, int] | None:
        entry = self.by_partition.get(partition, {}).get(program_id)
        return (entry[0], entry[1]) if entry is not None else None

    def programs(self) -> Iterator[tuple[int, str]]:
        for partition, counts in self.by_partition.items():
            for program in counts:
                yield partition, program
