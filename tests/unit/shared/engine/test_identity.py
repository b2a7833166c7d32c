"""The check of a partition's local state against the changelog it claims to come from
(:mod:`shared.engine._identity`), on real RocksDB databases; the changelog is a list of records."""

from __future__ import annotations

import asyncio
from io import BytesIO
from pathlib import Path

import pytest
import rocksdict

from shared.engine._identity import (
    CHANGELOG_SHORTER,
    CLUSTER_CHANGED,
    NOT_IN_CHANGELOG,
    TOPIC_RECREATED,
    ChangelogNow,
    Incarnation,
    MetadataRequest_v12,
    MetadataResponse_v12,
    TopicIdMetadataRequest,
    Uuid,
    check_partition,
    discard,
    holds_state,
    record,
    recorded,
    recorded_is_current,
)
from shared.engine._rocksdb import NEXT_OFFSET_PREFIX, PartitionWrite, engine_family, open_partition_db, persisted_offset

HERE = Incarnation("cluster-a", "0" * 31 + "1")

Changelog = list[tuple[int, bytes, bytes | None]]


def reader(changelog: Changelog, reads: list[tuple[int, int]] | None = None):  # type: ignore[no-untyped-def]
    async def read_range(low: int, high: int) -> Changelog:
        if reads is not None:
            reads.append((low, high))
        return [r for r in changelog if low <= r[0] <= high]

    return read_range


def apply(db: rocksdict.Rdict, changelog: Changelog) -> None:
    """What a restore does: every record into its family, then the last offset."""
    write = PartitionWrite(db)
    for _, key, value in changelog:
        write.apply(key, value)
    write.set_persisted_offset(changelog[-1][0])
    write.write()


def history(n: int, tag: bytes = b"v") -> Changelog:
    """``n`` changelog records over a few keys, with next-offset rows and a tombstone."""
    out: Changelog = []
    for offset in range(n):
        if offset % 10 == 9:
            out.append((offset, NEXT_OFFSET_PREFIX + b"input", str(offset).encode()))
        elif offset % 7 == 6:
            out.append((offset, b"key-%d" % (offset % 5), None))
        else:
            out.append((offset, b"key-%d" % (offset % 5), tag + b"%d" % offset))
    return out


@pytest.fixture
def db(tmp_path: Path) -> rocksdict.Rdict:
    return open_partition_db(tmp_path / "table-0.db")


def check(db: rocksdict.Rdict, changelog: Changelog, incarnation: Incarnation | None = HERE, start: int = 0):  # type: ignore[no-untyped-def]
    end = changelog[-1][0] + 1 if changelog else 0
    return asyncio.run(check_partition(db, ChangelogNow(incarnation, start, end), reader(changelog)))


def test_an_empty_database_is_kept(db: rocksdict.Rdict) -> None:
    assert not holds_state(db)
    assert check(db, history(30)).keep


def test_a_database_that_only_recorded_its_incarnation_is_empty(db: rocksdict.Rdict) -> None:
    record(db, HERE)
    assert not holds_state(db)
    assert check(db, history(30), Incarnation("cluster-b", HERE.topic_id)).keep  # nothing to discard


def test_state_of_the_recorded_incarnation_is_kept(db: rocksdict.Rdict) -> None:
    changelog = history(40)
    apply(db, changelog)
    record(db, HERE)
    assert check(db, changelog + history(60)[40:]).keep


def test_another_topic_id_discards(db: rocksdict.Rdict) -> None:
    apply(db, history(40))
    record(db, HERE)
    verdict = check(db, history(80, b"new"), Incarnation("cluster-a", "0" * 31 + "2"))
    assert not verdict.keep and verdict.cause == TOPIC_RECREATED
    assert "deleted and created again" in (verdict.reason or "")


def test_another_cluster_discards(db: rocksdict.Rdict) -> None:
    apply(db, history(40))
    record(db, HERE)
    verdict = check(db, history(80), Incarnation("cluster-b", HERE.topic_id))
    assert not verdict.keep and verdict.cause == CLUSTER_CHANGED
    assert "cluster-a → cluster-b" in (verdict.reason or "")


def test_a_changelog_ending_before_the_local_offset_discards_whatever_was_recorded(db: rocksdict.Rdict) -> None:
    apply(db, history(40))
    record(db, HERE)
    verdict = check(db, history(25))
    assert not verdict.keep and verdict.cause == CHANGELOG_SHORTER
    assert "ends at offset 25, before the local offset 40" in (verdict.reason or "")


def test_an_earlier_layout_matching_the_changelog_is_adopted(db: rocksdict.Rdict) -> None:
    changelog = history(300)
    apply(db, changelog[:200])
    reads: list[tuple[int, int]] = []
    verdict = asyncio.run(check_partition(db, ChangelogNow(HERE, 0, 300), reader(changelog, reads)))
    assert verdict.keep and verdict.adopted
    assert reads == [(136, 199)]  # the last 64 records up to the local offset, nothing after it


def test_an_earlier_layout_built_from_another_changelog_is_discarded(db: rocksdict.Rdict) -> None:
    apply(db, history(200, b"old"))
    verdict = check(db, history(300, b"new"))
    assert not verdict.keep and verdict.cause == NOT_IN_CHANGELOG
    assert "differ from the changelog" in (verdict.reason or "")


def test_an_earlier_layout_compares_next_offset_rows_too(db: rocksdict.Rdict) -> None:
    """Same rows, but the engine's next-offset row of another input history: not adopted."""
    changelog = history(100)
    apply(db, changelog)
    engine_family(db).put(NEXT_OFFSET_PREFIX + b"input", b"12345")
    assert not check(db, changelog).keep


def test_an_earlier_layout_with_nothing_to_compare_is_discarded(db: rocksdict.Rdict) -> None:
    """Every record up to the local offset compacted or aborted away: the window widens to the
    log start, finds nothing, and the state is not trusted."""
    apply(db, history(50))
    later: Changelog = [(offset, b"key-x", b"v") for offset in range(300, 320)]
    reads: list[tuple[int, int]] = []
    verdict = asyncio.run(check_partition(db, ChangelogNow(HERE, 0, 320), reader(later, reads)))
    assert not verdict.keep and verdict.cause == NOT_IN_CHANGELOG
    assert reads[-1] == (0, 49)


def test_without_topic_ids_recorded_state_is_kept_and_offsets_still_checked(db: rocksdict.Rdict) -> None:
    apply(db, history(40))
    record(db, HERE)
    assert check(db, history(80), incarnation=None).keep
    assert not check(db, history(20), incarnation=None).keep


def test_discard_empties_both_families_and_the_offset(db: rocksdict.Rdict) -> None:
    apply(db, history(120))
    record(db, HERE)
    db.put(b"\xff\xff\xff", b"last key of the default family")
    assert holds_state(db)
    discard(db)
    assert not holds_state(db)
    assert persisted_offset(db) is None and recorded(db) is None
    assert list(db.keys()) == [] and list(engine_family(db).keys()) == []


def test_only_a_copy_of_the_current_incarnation_may_be_read_unchecked(db: rocksdict.Rdict) -> None:
    assert not recorded_is_current(db, HERE)  # nothing recorded: a copy of an earlier version
    record(db, HERE)
    assert recorded_is_current(db, HERE)
    assert not recorded_is_current(db, Incarnation("cluster-a", "f" * 32))
    assert not recorded_is_current(db, None)


def test_metadata_v12_round_trips_topic_ids() -> None:
    request = TopicIdMetadataRequest(["b", "a", "a"]).prepare({3: (0, 13)})
    assert isinstance(request, MetadataRequest_v12)
    assert request.build_request_header(1, "client").SCHEMA.names[-1] == "tags"  # a flexible header
    encoded = request.encode()
    assert encoded.count(b"\x00" * 16) == 2  # each topic asked by name, with a null id
    topic_id = "0123456789abcdef0123456789abcdef"
    response = MetadataResponse_v12(
        0, [(1, "127.0.0.1", 9092, None, {})], "cid", 1, [(0, "a", topic_id, False, [], -2147483648, {})], {}
    )
    decoded = MetadataResponse_v12.decode(BytesIO(response.encode()))
    assert decoded.cluster_id == "cid"
    assert decoded.topics[0][1:3] == ("a", topic_id)
    assert Uuid.decode(BytesIO(Uuid.encode(topic_id))) == topic_id
