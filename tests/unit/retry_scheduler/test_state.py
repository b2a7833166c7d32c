"""Schedule keys sort by due time then id; entries round-trip; scans read only what is due."""

from __future__ import annotations

import base64
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rocksdict import Rdict

from services.retry_scheduler.domain import MAX_DUE_MS
from services.retry_scheduler.entries import (
    HISTORY_KEPT,
    Decided,
    Entry,
    Replayed,
    decode_decided,
    decode_entry,
    decode_history,
    encode_decided,
    encode_entry,
    encode_history,
    entry_from_letter,
)
from services.retry_scheduler.scans import (
    GroupFilter,
    ParkedGroup,
    first_due_key,
    scan_due,
    scan_ids,
    scan_page,
    scan_parked_groups,
    scan_parked_matching,
)
from services.retry_scheduler.state import (
    ID_PREFIX,
    BadKey,
    CountChange,
    Counts,
    Done,
    Lane,
    decode_counts,
    decode_index,
    decode_lane,
    due_key,
    due_prefix,
    encode_counts,
    encode_done,
    encode_lane,
    history_key,
    id_key,
    id_of,
    is_due_key,
    split_due_key,
)
from shared.dead_letters import DLQ_HEADERS, parse_dead_letter
from shared.engine._faust import FAUST_OFFSET_KEY
from shared.engine._rocksdb import open_partition_db, set_persisted_offset

dues = st.integers(min_value=0, max_value=MAX_DUE_MS)
ids = st.text(min_size=1, max_size=30)


@given(st.lists(st.tuples(dues, ids), min_size=2, max_size=50, unique=True))
def test_key_order_is_due_order_then_id_order(pairs: list[tuple[int, str]]) -> None:
    by_key = sorted(pairs, key=lambda p: due_key(*p))
    assert by_key == sorted(pairs)


@given(dues, ids)
def test_keys_round_trip_and_sort_before_faust_offset_key(due: int, dlq_id: str) -> None:
    key = due_key(due, dlq_id)
    assert is_due_key(key)
    assert split_due_key(key) == (due, dlq_id)
    assert key < FAUST_OFFSET_KEY
    assert due_prefix(due) <= key < due_prefix(due + 1) or due == MAX_DUE_MS


@given(dues, dues, ids, ids)
def test_an_earlier_due_time_always_sorts_first(d1: int, d2: int, a: str, b: str) -> None:
    if d1 < d2:
        assert due_key(d1, a) < due_key(d2, b)


def test_due_times_out_of_range_are_refused() -> None:
    with pytest.raises(BadKey):
        due_key(-1, "a")
    with pytest.raises(BadKey):
        due_key(MAX_DUE_MS + 1, "a")
    with pytest.raises(BadKey):
        split_due_key(FAUST_OFFSET_KEY)


@given(ids)
def test_id_keys_never_collide_with_faust_offset_key(dlq_id: str) -> None:
    assert id_key(dlq_id) != FAUST_OFFSET_KEY
    assert id_of(id_key(dlq_id)) == dlq_id
    assert not is_due_key(id_key(dlq_id))


def entry(dlq_id: str = "a", due: int = 0, **kw: object) -> Entry:
    base: dict[str, object] = dict(
        id=dlq_id,
        key=b"k\x00\xff",
        value=b"\x00v",
        headers=(("h", b"\x01"), ("dlq.id", dlq_id.encode())),
        retry_topic="retry",
        attempt=2,
        origin_topic="orders",
        origin_partition=3,
        origin_offset=9,
        error_class="Boom",
        error_message="bad",
        first_failed_at=1,
        failed_at=2,
        received_at=3,
        due_at=due,
        max_attempts=5,
    )
    base.update(kw)
    return Entry(**base)  # type: ignore[arg-type]


@given(ids, st.text(max_size=40), st.text(max_size=40), st.integers(1, 2**31 - 1), dues, st.booleans())
def test_decided_letters_carry_the_stored_bytes_unchanged(
    dlq_id: str, topic: str, error_class: str, attempt: int, due: int, parked: bool
) -> None:
    e = entry(
        dlq_id,
        due,
        origin_topic=topic,
        error_class=error_class,
        attempt=attempt,
        parked_at=5 if parked else None,
        parked_reason="why" if parked else None,
    )
    d = decode_decided(encode_decided(Decided.of(e)))
    assert d == Decided(dlq_id, parked, attempt, due, (topic, error_class), encode_entry(e))
    assert decode_entry(d.stored) == e


def test_bytes_that_are_not_a_decided_letter_are_refused() -> None:
    whole = encode_decided(Decided.of(entry()))
    for broken in (b"", b"\x00" * 5, whole[:30]):
        with pytest.raises(ValueError):
            decode_decided(broken)


def test_entries_round_trip_with_binary_key_value_and_headers() -> None:
    e = entry()
    assert decode_entry(encode_entry(e)) == e
    tomb = entry(key=None, value=None, parked_at=7, parked_reason="why")
    assert decode_entry(encode_entry(tomb)) == tomb
    with pytest.raises(ValueError):
        decode_entry(b"{}")
    with pytest.raises(ValueError):
        decode_entry(b"\xff")


def test_entry_from_a_letter_without_headers_gets_the_contract_defaults() -> None:
    letter = parse_dead_letter(
        b"k", b"v", None, topic="dead-letters", partition=1, offset=5, timestamp_ms=1000, default_retry_topic="retry"
    )
    e = entry_from_letter(letter, [], received_at=2000)
    headers = dict(e.headers)
    assert e.attempt == 1 and e.retry_topic == "retry" and e.id == letter.id and len(e.id) == 32
    assert headers["dlq.id"] == e.id.encode() and headers["dlq.attempt"] == b"1"
    assert headers["dlq.original.topic"] == b"dead-letters" and headers["dlq.failed.at"] == b"1000"


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Rdict]:
    d = open_partition_db(tmp_path / "p.db")  # as the engine opens a partition: with its engine rows apart
    set_persisted_offset(d, 42)
    yield d
    d.close()


def fill(db: Rdict, dues: list[int], origin: str = "orders") -> list[bytes]:
    keys = []
    for i, due in enumerate(dues):
        key = due_key(due, f"id{i:04d}")
        db.put(key, encode_entry(entry(f"id{i:04d}", due, origin_topic=origin)))
        keys.append(key)
    return keys


def test_scan_due_reads_only_due_entries_in_order(db: Rdict) -> None:
    fill(db, [300, 100, 200, 1000, 5000])
    scan = scan_due(db, now_ms=300, limit=100)
    assert [split_due_key(k)[0] for k, _ in scan.items] == [100, 200, 300]
    assert scan.examined == 4 and not scan.more_due  # the three due plus the one that ends the scan
    assert decode_entry(scan.items[0][1]).due_at == 100


def test_scan_due_stops_at_the_limit_and_says_more_are_due(db: Rdict) -> None:
    fill(db, [1, 2, 3, 4])
    scan = scan_due(db, now_ms=10, limit=2)
    assert [split_due_key(k)[0] for k, _ in scan.items] == [1, 2] and scan.more_due
    rest = scan_due(db, now_ms=10, limit=2, start=scan.items[-1][0])
    assert [split_due_key(k)[0] for k, _ in rest.items] == [2, 3] and rest.more_due  # start is inclusive


def test_scan_due_never_returns_faust_offset_key(db: Rdict) -> None:
    assert scan_due(db, now_ms=MAX_DUE_MS, limit=10).items == []
    fill(db, [MAX_DUE_MS])
    assert len(scan_due(db, now_ms=MAX_DUE_MS, limit=10).items) == 1


def test_scan_from_a_low_water_key_skips_deleted_entries(db: Rdict) -> None:
    keys = fill(db, [*range(20_000), 10**12])
    for key in keys[:-1]:
        db.delete(key)
    assert first_due_key(db) == keys[-1]

    def fastest(scan: Callable[[], object], rounds: int = 5, scans: int = 10) -> float:
        """The quickest of ``rounds`` timings of ``scans`` scans: a round that a loaded machine
        preempted does not count."""
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            for _ in range(scans):
                scan()
            times.append(time.perf_counter() - started)
        return min(times)

    from_low_water = fastest(lambda: scan_due(db, now_ms=10**11, limit=10, start=due_prefix(20_000)))
    from_first = fastest(lambda: scan_due(db, now_ms=10**11, limit=10))
    # Tombstones of deleted entries are skipped one by one from the first key; not from low water.
    assert from_low_water * 5 < from_first


def test_scan_page_filters_pages_and_respects_the_budget(db: Rdict) -> None:
    fill(db, [10, 20, 30, 40, 50])
    db.put(due_key(25, "other"), encode_entry(entry("other", 25, origin_topic="payments")))
    page = scan_page(db, after=None, limit=2, due_before=None, origin_topic=None, budget=100)
    assert [split_due_key(k) for k, _ in page.items] == [(10, "id0000"), (20, "id0001")] and not page.exhausted
    page = scan_page(db, after=page.items[-1][0], limit=10, due_before=45, origin_topic="orders", budget=100)
    assert [split_due_key(k)[0] for k, _ in page.items] == [30, 40] and page.exhausted
    page = scan_page(db, after=None, limit=10, due_before=None, origin_topic="payments", budget=2)
    assert page.items == [] and page.frontier == due_key(20, "id0001") and not page.exhausted


def test_scan_ids_lists_parked_rows_in_id_order(db: Rdict) -> None:
    for name in ("c", "a", "b"):
        db.put(id_key(name), encode_entry(entry(name)))
    page = scan_ids(db, after=None, limit=2, origin_topic=None, budget=100)
    assert [id_of(k) for k, _ in page.items] == ["a", "b"]
    page = scan_ids(db, after=id_key("b"), limit=2, origin_topic=None, budget=100)
    assert [id_of(k) for k, _ in page.items] == ["c"] and page.exhausted


def test_counts_rebuild_and_follow_changes() -> None:
    a, b = entry("a"), entry("b", error_class="Timeout", origin_topic="payments")
    counts = Counts()
    rows = counts.rebuild(
        {0: [(due_key(1, "a"), encode_entry(a))], 1: [(due_key(1, "b"), encode_entry(b))]}, {1: [(id_key("p"), encode_entry(a))]}
    )
    assert rows == 3
    totals = counts.totals({0, 1})
    assert totals["scheduled"] == 2 and totals["parked"] == 1
    assert totals["by_origin_topic"] == {"orders": 1, "payments": 1}
    assert totals["by_error_class"] == {"Boom": 1, "Timeout": 1}
    assert counts.totals({0})["scheduled"] == 1 and counts.totals({0})["parked"] == 0
    change = CountChange()
    change.add("scheduled", a.counted_as, -1)
    change.add("parked", b.counted_as)
    assert decode_counts(counts.row_with(0, change)) == (Counter(), Counter({b.counted_as: 1}))
    counts.apply(0, change)
    assert counts.totals({0, 1})["by_origin_topic"] == {"payments": 1}
    assert counts.totals({0})["parked_by_origin_topic"] == {"payments": 1}


def test_a_counts_row_reads_back_as_written_and_loads_a_partitions_counts() -> None:
    scheduled = Counter({("orders", "Boom"): 3, ("payments", "Timeout"): 1})
    parked = Counter({("orders", "Boom"): 2})
    counts = Counts()
    counts.load(1, encode_counts(scheduled, parked))
    assert (counts.scheduled[1], counts.parked[1]) == (scheduled, parked)
    assert counts.totals({1})["scheduled"] == 4 and counts.totals({0})["scheduled"] == 0
    counts.forget({0})
    assert counts.totals({1})["scheduled"] == 0
    with pytest.raises(ValueError, match="not a counts row"):
        decode_counts(encode_entry(entry("a")))


@given(st.sampled_from([b"D", b"C", b"U"]), st.integers(0, 2**32 - 1), dues, ids)
def test_index_values_tell_a_scheduled_key_from_a_done_marker(kind: bytes, attempt: int, due: int, dlq_id: str) -> None:
    expiry = due_key(due, dlq_id)
    assert decode_index(encode_done(kind, attempt, expiry)) == Done(kind, attempt, expiry)
    assert decode_index(expiry) == expiry  # a due key always starts with 0x00


@given(
    st.sampled_from([b"D", b"C", b"U"]),
    st.integers(0, 2**32 - 1),
    dues,
    ids,
    st.lists(st.binary(min_size=8, max_size=8), max_size=20),
)
def test_a_done_marker_keeps_the_fingerprints_of_its_ids_letters(
    kind: bytes, attempt: int, due: int, dlq_id: str, prints: list[bytes]
) -> None:
    expiry = due_key(due, dlq_id)
    fingerprints = tuple(p.hex() for p in prints)
    assert decode_index(encode_done(kind, attempt, expiry, fingerprints)) == Done(kind, attempt, expiry, fingerprints)


def test_entry_from_a_letter_clamps_numbers_it_cannot_store() -> None:
    letter = parse_dead_letter(
        b"k",
        b"v",
        [
            ("dlq.attempt", b"99999999999999999999"),
            ("dlq.failed.at", b"-99999999999999999999999"),
            ("dlq.original.offset", b"123456789012345678901234567890"),
        ],
        topic="dead-letters",
        partition=1,
        offset=5,
        timestamp_ms=1000,
        default_retry_topic="retry",
    )
    e = entry_from_letter(letter, [], received_at=2000)
    assert e.attempt == 2**31 - 1 and e.failed_at == 0 and e.origin_offset == 2**63 - 1
    assert decode_entry(encode_entry(e)) == e
    assert dict(e.headers)["dlq.attempt"] == b"99999999999999999999"  # headers go out as they came


@given(dues, st.integers(1, 100), st.booleans())
def test_scheduling_an_entry_changes_its_due_time_and_max_attempts_only(due: int, max_attempts: int, parked: bool) -> None:
    e = entry(parked_at=7 if parked else None, parked_reason="why" if parked else None)
    assert e.scheduled(due, max_attempts) == replace(e, due_at=due, max_attempts=max_attempts)


# -- history and parked groups -----------------------------------------------------------------------


def test_a_dlq_header_the_fields_spell_is_stored_by_its_place_and_read_back_as_it_came() -> None:
    """Only a ``dlq.*`` header whose bytes are what the entry's fields spell is kept by its place in
    :data:`DLQ_HEADERS`; one that says something else (a clamped number) keeps its own bytes."""
    letter = parse_dead_letter(
        b"k",
        b"v",
        [("trace", b"t"), ("dlq.id", b"d1"), ("dlq.attempt", b"99999999999999999999"), ("dlq.retry.topic", b"r")],
        topic="dead-letters",
        partition=1,
        offset=5,
        timestamp_ms=1000,
        default_retry_topic="retry",
    )
    e = entry_from_letter(letter, [*letter.other_headers, ("dlq.id", b"d1"), ("dlq.attempt", b"99999999999999999999")], 2000)
    stored = orjson.loads(encode_entry(e))["h"]
    assert stored[0] == ["trace", "dA=="]
    assert [h for h in stored if isinstance(h, list) and h[0].startswith("dlq.")] == [
        ["dlq.attempt", "OTk5OTk5OTk5OTk5OTk5OTk5OTk="]
    ]
    assert sorted(DLQ_HEADERS[h] for h in stored if isinstance(h, int)) == sorted(set(DLQ_HEADERS) - {"dlq.attempt"})
    assert decode_entry(encode_entry(e)) == e
    with pytest.raises(ValueError):
        decode_entry(orjson.dumps({**orjson.loads(encode_entry(e)), "h": [len(DLQ_HEADERS)]}))


@given(
    st.lists(st.tuples(st.sampled_from([*DLQ_HEADERS, "x"]), st.one_of(st.binary(max_size=8), st.just(b"orders"))), max_size=14),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
)
def test_entries_round_trip_whatever_their_dlq_headers_say(headers: list[tuple[str, bytes]], offset: int) -> None:
    e = entry(headers=tuple(headers), origin_offset=offset)
    assert decode_entry(encode_entry(e)) == e


def test_entries_stored_with_every_header_in_base64_still_decode() -> None:
    """The layout before ``dlq.*`` headers were kept by their place: every header ``[name, base64]``."""
    e = entry()
    earlier = orjson.loads(encode_entry(e))
    earlier["h"] = [[name, base64.b64encode(value).decode()] for name, value in e.headers]
    assert decode_entry(orjson.dumps(earlier)) == e


def test_entries_stored_before_history_existed_still_decode() -> None:
    e = entry()
    old = orjson.loads(encode_entry(e))
    assert "hi" not in old  # an entry without history is stored as before
    assert decode_entry(orjson.dumps(old)).history == ()


@given(
    st.integers(min_value=0, max_value=2**64 - 1),
    st.integers(min_value=0, max_value=2**64 - 1),
    st.booleans(),
    st.one_of(
        st.none(),
        st.tuples(st.integers(min_value=-(2**63), max_value=2**63 - 1), st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    ),
    ids,
)
def test_lane_rows_round_trip_with_their_heads_position_or_without(
    next_held: int, end_held: int, parking: bool, position: tuple[int, int] | None, head: str
) -> None:
    partition, offset = position if position is not None else (None, None)
    lane = Lane(head, next_held, end_held, parking, head_partition=partition, head_offset=offset)
    assert decode_lane(encode_lane(lane)) == lane


def test_lane_rows_written_before_the_heads_position_was_kept_still_decode() -> None:
    # As they were written: next and end held (8 bytes each), the parking bool, the head's id.
    old = struct.pack(">QQ?", 3, 5, True) + b"d1"
    assert decode_lane(old) == Lane("d1", 3, 5, parking=True)
    assert decode_lane(struct.pack(">QQ?", 0, 0, False) + b"d2") == Lane("d2")
    with pytest.raises(ValueError):
        decode_lane(struct.pack(">QQB", 0, 0, 2) + b"short")  # says a position follows, has none


def test_history_round_trips_with_the_entry_and_keeps_the_latest() -> None:
    e = entry().with_history(Replayed(10, "unpark", 2)).with_history(Replayed(20, "group replay", 3))
    assert decode_entry(encode_entry(e)).history == (Replayed(10, "unpark", 2), Replayed(20, "group replay", 3))
    assert e.scheduled(99, 5).history == e.history
    assert decode_history(encode_history(e.history)) == e.history
    many = entry().with_history(*(Replayed(i, "unpark", i) for i in range(HISTORY_KEPT + 5)))
    assert len(many.history) == HISTORY_KEPT and many.history[-1].at == HISTORY_KEPT + 4
    with pytest.raises(ValueError):
        decode_history(b"[[1, 2]]")


def test_history_rows_stay_apart_from_id_rows() -> None:
    assert not history_key("a").startswith(ID_PREFIX)
    assert not is_due_key(history_key("a"))


def _park(db: Rdict, dlq_id: str, topic: str, error_class: str, at: int, message: str = "bad") -> None:
    db[id_key(dlq_id)] = encode_entry(
        entry(dlq_id, origin_topic=topic, error_class=error_class, error_message=message, parked_at=at, parked_reason="why")
    )


def test_parked_rows_are_grouped_with_counts_and_the_newest_error(db: Rdict) -> None:
    _park(db, "a", "orders", "Timeout", 30, "third")
    _park(db, "b", "orders", "Timeout", 10, "first")
    _park(db, "c", "orders", "KeyError", 20)
    _park(db, "d", "payments", "Timeout", 40)
    scan = scan_parked_groups(db, GroupFilter(origin_topic="orders"), budget=100)
    assert scan.resume is None
    by = {(g.origin_topic, g.error_class): g for g in scan.groups}
    assert set(by) == {("orders", "Timeout"), ("orders", "KeyError")}
    t = by[("orders", "Timeout")]
    assert (t.count, t.oldest_parked_at, t.newest_parked_at, t.newest_error_message) == (2, 10, 30, "third")
    ranged = scan_parked_groups(db, GroupFilter("orders", "Timeout", parked_from=5, parked_to=20), budget=100)
    assert [(g.count, g.newest_error_message) for g in ranged.groups] == [(1, "first")]
    first = scan_parked_groups(db, GroupFilter(), budget=2)
    assert first.resume == id_key("b") and sum(g.count for g in first.groups) == 2
    rest = scan_parked_groups(db, GroupFilter(), budget=2, after=first.resume)
    assert rest.resume is None and sum(g.count for g in rest.groups) == 2


def test_groups_merge_across_partitions() -> None:
    one = ParkedGroup("o", "E", 2, 10, 30, "thirty")
    one.merge(ParkedGroup("o", "E", 1, 5, 40, "forty"))
    one.merge(ParkedGroup("o", "E", 1, 20, 25, "older"))
    assert (one.count, one.oldest_parked_at, one.newest_parked_at, one.newest_error_message) == (4, 5, 40, "forty")
    assert ParkedGroup.from_json(one.to_json()) == one


def test_matching_parked_rows_are_read_in_rounds(db: Rdict) -> None:
    for i in range(7):
        _park(db, f"m{i}", "orders", "Timeout" if i % 2 == 0 else "Other", i)
    flt = GroupFilter("orders", "Timeout")
    first, resume = scan_parked_matching(db, flt, after=None, limit=2, budget=100)
    assert [id_of(k) for k, _, _ in first] == ["m0", "m2"] and resume is not None
    rest, end = scan_parked_matching(db, flt, after=resume, limit=10, budget=100)
    assert [id_of(k) for k, _, _ in rest] == ["m4", "m6"] and end is None
    budgeted, stopped = scan_parked_matching(db, flt, after=None, limit=None, budget=3)
    assert [id_of(k) for k, _, _ in budgeted] == ["m0", "m2"] and stopped == id_key("m2")
    assert GroupFilter.from_json(flt.to_json()) == flt
