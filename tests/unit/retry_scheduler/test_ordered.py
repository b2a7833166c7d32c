"""Ordered retries on the in-memory topology driver: dead letters of an ordered topic are placed
by their lane (origin topic, key); later records of a blocked key are held behind its head and
released one at a time, in order, each on the acknowledgement of the one before; a parked head
keeps them held until an operator replays it, skips it or parks the key; past the cap they are
parked; every change of a lane's head is published on the blocked-keys topic."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from services.retry_scheduler.app import RetrySchedulerService
from services.retry_scheduler.entries import decode_decided, unpack_decided
from services.retry_scheduler.handlers.kinds import KIND_CANCEL, KIND_DECIDED_PACK, KIND_LANE, KIND_ORDERED
from services.retry_scheduler.handlers.ordered import lane_command_body
from services.retry_scheduler.routes.ordered import blocked_cursor, blocked_key_json, blocked_sort, decode_blocked_cursor
from services.retry_scheduler.routes.pages import merge_pages
from services.retry_scheduler.scans import scan_lanes
from services.retry_scheduler.state import Lane, decode_lane, lane_row_key
from shared import dead_letters as dl
from shared.engine import Record, partition_for
from shared.engine.testing import TopologyDriver
from shared.http.pagination import InvalidCursor, encode_cursor
from shared.ordered_retries import HELD_BEHIND, LAST_TAKEN, head_position, header, lane_key
from shared.settings import Settings
from tests.support.dead_letters import letter_headers

PARTITIONS = 4
RETRY_TOPIC = "retry-orders"
ORDERED_TOPIC = "orders"
HOUR_MS = 3_600_000
MAX_HELD = 2
KEY = b"customer-7"
LANE = lane_key(ORDERED_TOPIC, KEY)

Scheduler = tuple[RetrySchedulerService, TopologyDriver]


@pytest.fixture(params=["at_least_once", "exactly_once"])
def scheduler(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Scheduler]:
    """Under either guarantee: exactly once, redeliveries and blocked-keys records go out in the
    inbox batch's transaction; at least once, redeliveries are sent at once."""
    service = RetrySchedulerService(
        Settings(
            processing_guarantee=request.param,
            data_dir=tmp_path,
            topic_partitions=PARTITIONS,
            retry_max_attempts=3,
            retry_base_delay_ms=HOUR_MS,
            retry_max_delay_ms=HOUR_MS,
            retry_jitter="none",
            retry_ordered_topics=f"{ORDERED_TOPIC}, other",
            retry_ordered_max_held=MAX_HELD,
        )
    )
    with TopologyDriver(service.engine) as driver:
        yield service, driver


def now_ms() -> int:
    return int(time.time() * 1000)


def headers_of(
    dlq_id: str, *, attempt: int, failed_at: int, origin: str = ORDERED_TOPIC, offset: int | None = None
) -> list[tuple[str, bytes]]:
    """A letter's headers; ``offset``: its record's offset on its origin topic (partition 0)."""
    headers = letter_headers(dlq_id, RETRY_TOPIC, attempt=attempt, failed_at=failed_at, origin=origin)
    if offset is None:
        return headers
    return [(k, v) for k, v in headers if k != dl.ORIGINAL_OFFSET] + [(dl.ORIGINAL_OFFSET, str(offset).encode())]


def fail(
    s: Scheduler, dlq_id: str, *, attempt: int = 1, due_now: bool = False, key: bytes = KEY, offset: int | None = None
) -> None:
    """A consumer's failure of a record: a dead letter (due at once with ``due_now``)."""
    service, driver = s
    failed_at = now_ms() - (2 * HOUR_MS if due_now else 0)
    headers = headers_of(dlq_id, attempt=attempt, failed_at=failed_at, offset=offset)
    driver.pipe(service.topics.dead_letters, key, dlq_id.encode(), headers=headers)


def defer(s: Scheduler, dlq_id: str, behind: str, *, key: bytes = KEY, offset: int | None = None) -> None:
    """A record its consumer did not process because the key was blocked."""
    service, driver = s
    headers = [*headers_of(dlq_id, attempt=0, failed_at=now_ms(), offset=offset), (HELD_BEHIND, behind.encode())]
    driver.pipe(service.topics.dead_letters, key, dlq_id.encode(), headers=headers)


def ack(s: Scheduler, dlq_id: str) -> None:
    service, driver = s
    driver.pipe(service.topics.retry_acks, LANE, dlq_id.encode())


def tick(s: Scheduler) -> None:
    service, driver = s
    for partition in range(PARTITIONS):
        driver.run(service.ticks.ticker.send(partition))
    driver.process()


def lane_command(s: Scheduler, action: str, actor: str | None = None) -> None:
    service, driver = s
    body = orjson.dumps(lane_command_body(LANE, action, actor))
    driver.pipe(service.inbox_topic_name, LANE, KIND_LANE + body, partition=partition_for(LANE, PARTITIONS))


def redelivered(s: Scheduler) -> list[str]:
    """The ``dlq.id`` of every redelivery so far, in order."""
    return [r.value.decode() for r in s[1].outputs(RETRY_TOPIC) if r.value is not None]


def blocked_keys(s: Scheduler) -> list[tuple[bytes | None, str | None, str | None]]:
    """(key, head, last taken in) of every blocked-keys record so far."""
    out = []
    for r in s[1].outputs(s[0].topics.retry_blocked_keys):
        last = header(r.headers, LAST_TAKEN)
        out.append((r.key, r.value.decode() if r.value is not None else None, last.decode() if last else None))
    return out


def head_positions(s: Scheduler) -> list[tuple[str | None, tuple[int, int] | None]]:
    """(head, where it was read on its origin topic) of every blocked-keys record so far."""
    return [
        (r.value.decode() if r.value is not None else None, head_position(r.headers))
        for r in s[1].outputs(s[0].topics.retry_blocked_keys)
    ]


def parked_reason(s: Scheduler, dlq_id: str) -> str | None:
    driver = s[1]
    for partition in range(PARTITIONS):
        raw = driver.table("parked").get(b"#" + dlq_id.encode(), partition=partition)
        if raw is not None:
            return str(orjson.loads(raw)["pr"])
    return None


def test_letters_of_an_ordered_topic_are_placed_by_their_lane_and_others_by_their_id(scheduler: Scheduler) -> None:
    service, driver = scheduler
    for dlq_id in ("a1", "a2", "a3"):
        fail(scheduler, dlq_id)
    driver.pipe(
        service.topics.dead_letters, KEY, b"v", headers=headers_of("u1", attempt=1, failed_at=now_ms(), origin="unordered")
    )
    inbox: list[Record] = driver.outputs(service.inbox_topic_name)
    ordered = [r for r in inbox if r.value is not None and r.value[:1] == KIND_ORDERED]
    assert [r.key for r in ordered] == [b"a1", b"a2", b"a3"]
    assert {r.partition for r in ordered} == {partition_for(LANE, PARTITIONS)}
    [unordered] = [r for r in inbox if r.value is not None and r.value[:1] == KIND_DECIDED_PACK]
    assert unordered.partition == partition_for(b"u1", PARTITIONS) and unordered.value is not None
    assert [decode_decided(d).id for d in unpack_decided(unordered.value[1:])] == ["u1"]


def test_later_records_of_a_blocked_key_are_held_without_a_backoff_of_their_own(scheduler: Scheduler) -> None:
    fail(scheduler, "d1", due_now=True)
    defer(scheduler, "d2", behind="d1")
    fail(scheduler, "d3", due_now=True)  # a failure of a later record (its consumer did not know yet): held too
    assert blocked_keys(scheduler) == [(LANE, "d1", "d1"), (LANE, "d1", "d2"), (LANE, "d1", "d3")]
    tick(scheduler)
    assert redelivered(scheduler) == ["d1"]  # d3 was due as well, but waits behind d1
    tick(scheduler)
    assert redelivered(scheduler) == ["d1"]


def test_held_records_are_released_one_at_a_time_in_order_on_acknowledgement(scheduler: Scheduler) -> None:
    driver = scheduler[1]
    fail(scheduler, "d1", due_now=True)
    defer(scheduler, "d2", behind="d1")
    defer(scheduler, "d3", behind="d1")
    ack(scheduler, "d1")  # not redelivered yet: a stray acknowledgement releases nothing
    assert redelivered(scheduler) == []
    tick(scheduler)
    ack(scheduler, "d3")  # not the head
    assert redelivered(scheduler) == ["d1"]
    ack(scheduler, "d1")
    assert redelivered(scheduler) == ["d1", "d2"]
    released = driver.outputs(RETRY_TOPIC)[-1]
    assert header(released.headers, HELD_BEHIND) == b"d1" and header(released.headers, dl.ATTEMPT) == b"0"
    ack(scheduler, "d1")  # a copy of the first acknowledgement
    assert redelivered(scheduler) == ["d1", "d2"]
    ack(scheduler, "d2")
    ack(scheduler, "d3")
    assert redelivered(scheduler) == ["d1", "d2", "d3"]
    assert blocked_keys(scheduler)[-3:] == [(LANE, "d2", None), (LANE, "d3", None), (LANE, None, None)]
    tick(scheduler)
    assert redelivered(scheduler) == ["d1", "d2", "d3"]


def test_every_blocked_keys_record_says_where_its_head_was_read_on_its_origin_topic(scheduler: Scheduler) -> None:
    driver = scheduler[1]
    fail(scheduler, "d1", due_now=True, offset=9)
    defer(scheduler, "d2", behind="d1", offset=10)
    defer(scheduler, "d2", behind="d1", offset=10)  # a copy: taken in again, the head unchanged
    assert head_positions(scheduler) == [("d1", (0, 9))] * 3
    tick(scheduler)
    ack(scheduler, "d1")  # d2 released: the head, and its place, move on
    assert head_positions(scheduler)[-1] == ("d2", (0, 10))
    ack(scheduler, "d2")
    assert head_positions(scheduler)[-1] == (None, None)  # free: nothing in hand any more
    fail(scheduler, "d3", offset=20)  # blocked again: the new head's place, kept in its lane row
    assert head_positions(scheduler)[-1] == ("d3", (0, 20))
    raw = driver.table("index").get(lane_row_key(LANE), partition=partition_for(LANE, PARTITIONS))
    assert raw is not None and decode_lane(raw) == Lane("d3", head_partition=0, head_offset=20)


def test_a_released_record_that_fails_is_the_head_and_waits_its_backoff(scheduler: Scheduler) -> None:
    service, _ = scheduler
    fail(scheduler, "d1", due_now=True)
    defer(scheduler, "d2", behind="d1")
    defer(scheduler, "d3", behind="d1")
    tick(scheduler)
    ack(scheduler, "d1")
    fail(scheduler, "d2", attempt=1)  # its first real failure: newer than the deferred attempt 0
    entry = service.stats.scheduled_entry("d2")
    assert entry is not None and entry.attempt == 1
    ack(scheduler, "d2")  # ignored: d2 is scheduled, not out
    assert redelivered(scheduler) == ["d1", "d2"]


def test_a_deferred_record_of_a_free_key_is_redelivered_at_once_as_the_head(scheduler: Scheduler) -> None:
    defer(scheduler, "d1", behind="gone")
    assert redelivered(scheduler) == ["d1"]
    assert blocked_keys(scheduler) == [(LANE, "d1", "d1")]
    defer(scheduler, "d1", behind="gone")  # a copy: its writer is told it was taken in, nothing else
    assert redelivered(scheduler) == ["d1"] and blocked_keys(scheduler)[-1] == (LANE, "d1", "d1")
    ack(scheduler, "d1")
    assert blocked_keys(scheduler)[-1] == (LANE, None, None)
    defer(scheduler, "d1", behind="gone")  # a copy read after the key was free: not made head again
    assert redelivered(scheduler) == ["d1"] and blocked_keys(scheduler)[-1] == (LANE, None, "d1")


def test_a_parked_head_keeps_the_rest_held_until_it_is_replayed(scheduler: Scheduler) -> None:
    fail(scheduler, "d1", attempt=3)  # out of attempts: parked, and still the head
    defer(scheduler, "d2", behind="d1")
    assert parked_reason(scheduler, "d1") is not None
    tick(scheduler)
    assert redelivered(scheduler) == []
    lane_command(scheduler, "replay-head")
    assert redelivered(scheduler) == ["d1"] and parked_reason(scheduler, "d1") is None
    ack(scheduler, "d1")
    assert redelivered(scheduler) == ["d1", "d2"]


def test_a_replayed_head_records_who_replayed_it(scheduler: Scheduler) -> None:
    service, _ = scheduler
    fail(scheduler, "d1", attempt=3)
    lane_command(scheduler, "replay-head", actor="orders-team")
    assert redelivered(scheduler) == ["d1"]
    fail(scheduler, "d1", attempt=4)  # it fails again: parked, its history naming the token that replayed it
    entry = service.stats.parked_entry("d1", partition_for(LANE, PARTITIONS))
    assert entry is not None and [(h.action, h.attempt, h.actor) for h in entry.history] == [("unpark", 3, "orders-team")]


def test_skipping_a_parked_head_releases_the_next(scheduler: Scheduler) -> None:
    fail(scheduler, "d1", attempt=3)
    defer(scheduler, "d2", behind="d1")
    lane_command(scheduler, "skip-head")
    assert parked_reason(scheduler, "d1") is None  # dropped, never redelivered
    assert redelivered(scheduler) == ["d2"]
    assert blocked_keys(scheduler)[-1] == (LANE, "d2", None)


def test_parking_a_key_parks_its_head_and_held_records_and_frees_it(scheduler: Scheduler) -> None:
    service, _ = scheduler
    fail(scheduler, "d1")
    defer(scheduler, "d2", behind="d1")
    defer(scheduler, "d3", behind="d1")
    lane_command(scheduler, "park-key")
    assert [parked_reason(scheduler, d) for d in ("d1", "d2", "d3")] == [
        "its key was parked by an operator (ordered retries)"
    ] * 3
    assert service.stats.scheduled_entry("d1") is None
    assert blocked_keys(scheduler)[-1] == (LANE, None, None)
    tick(scheduler)
    assert redelivered(scheduler) == []
    defer(scheduler, "d4", behind="d1")  # the key is free: a later record is not held
    assert redelivered(scheduler) == ["d4"]


def test_past_the_cap_later_records_are_parked_with_the_reason(scheduler: Scheduler) -> None:
    fail(scheduler, "d1", due_now=True)
    for dlq_id in ("d2", "d3", "d4"):
        defer(scheduler, dlq_id, behind="d1")
    reason = parked_reason(scheduler, "d4")
    assert reason is not None and "cap" in reason
    assert blocked_keys(scheduler)[-1] == (LANE, "d1", "d4")  # taken in, so its writer stops waiting for it
    tick(scheduler)
    ack(scheduler, "d1")
    ack(scheduler, "d2")
    ack(scheduler, "d3")
    assert redelivered(scheduler) == ["d1", "d2", "d3"]
    assert blocked_keys(scheduler)[-1] == (LANE, None, None)


def test_a_held_letter_out_of_attempts_is_parked_when_its_turn_comes_and_holds_the_rest(scheduler: Scheduler) -> None:
    fail(scheduler, "d1", due_now=True)
    fail(scheduler, "d2", attempt=3)  # out of attempts, behind d1
    defer(scheduler, "d3", behind="d1")
    assert parked_reason(scheduler, "d2") is None  # held, not parked before its turn
    tick(scheduler)
    ack(scheduler, "d1")
    assert parked_reason(scheduler, "d2") is not None
    assert redelivered(scheduler) == ["d1"]  # d3 waits behind the parked d2
    assert blocked_keys(scheduler)[-1] == (LANE, "d2", None)


def test_a_blocked_keys_view_names_its_head_its_state_and_its_held_records(scheduler: Scheduler) -> None:
    service, _ = scheduler
    assert service.stats.lane_view(LANE, 10) is None
    fail(scheduler, "d1", due_now=True)
    defer(scheduler, "d2", behind="d1")
    defer(scheduler, "d3", behind="d1")
    assert service.stats.lane_view(LANE, 1) == {"head": "d1", "head_status": "scheduled", "held": 2, "held_ids": ["d2"]}
    counts = service.stats.lane_counts(set(range(PARTITIONS)))
    assert (counts.blocked_keys, counts.held) == (1, 2)
    tick(scheduler)
    assert service.stats.lane_view(LANE, 10) == {"head": "d1", "head_status": "away", "held": 2, "held_ids": ["d2", "d3"]}
    ack(scheduler, "d1")
    fail(scheduler, "d2", attempt=3)
    assert service.stats.lane_view(LANE, 10) == {"head": "d2", "head_status": "parked", "held": 1, "held_ids": ["d3"]}


def test_without_ordered_topics_nothing_changes(tmp_path: Path) -> None:
    service = RetrySchedulerService(Settings(data_dir=tmp_path, topic_partitions=PARTITIONS))
    assert service.acks is None  # retry-acks is not read
    assert {t.name for t in service.topic_specs()}.isdisjoint({"retry-acks", "retry-blocked-keys"})
    with TopologyDriver(service.engine) as driver:
        headers = [*headers_of("d1", attempt=1, failed_at=now_ms()), (HELD_BEHIND, b"d0")]
        driver.pipe(service.topics.dead_letters, KEY, b"v", headers=headers)
        [routed] = driver.outputs(service.inbox_topic_name)
        assert routed.value is not None and routed.value[:1] == KIND_DECIDED_PACK
        assert routed.partition == partition_for(b"d1", PARTITIONS)
        entry = service.stats.scheduled_entry("d1")
        assert entry is not None and entry.attempt == 1  # scheduled by its id with its backoff, as ever


def test_parking_a_key_with_many_held_records_goes_on_in_rounds_and_holds_nothing_back(
    scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    service, driver = scheduler
    monkeypatch.setattr(service.ordered, "max_held", 10)
    monkeypatch.setattr("services.retry_scheduler.handlers.ordered.PARK_CHUNK", 2)
    fail(scheduler, "d1", due_now=True)
    tick(scheduler)  # d1 is out
    for n in range(2, 7):
        defer(scheduler, f"d{n}", behind="d1")
    lane_command(scheduler, "park-key")  # the driver hands over the follow-up rounds too
    rounds = [r for r in driver.outputs(service.inbox_topic_name) if r.value is not None and r.value[:1] == KIND_LANE]
    assert len(rounds) == 3  # 5 held records, 2 per round
    assert [parked_reason(scheduler, f"d{n}") is not None for n in range(2, 7)] == [True] * 5
    assert service.stats.lane_view(LANE, 10) is None and blocked_keys(scheduler)[-1] == (LANE, None, None)
    ack(scheduler, "d1")
    assert redelivered(scheduler) == ["d1"]


def test_an_acknowledgement_without_a_lane_or_an_id_is_ignored(scheduler: Scheduler) -> None:
    service, driver = scheduler
    fail(scheduler, "d1", due_now=True)
    defer(scheduler, "d2", behind="d1")
    tick(scheduler)
    inbox_before = len(driver.outputs(service.inbox_topic_name))
    driver.pipe(service.topics.retry_acks, None, b"d1")
    driver.pipe(service.topics.retry_acks, b"no separator", b"d1")
    driver.pipe(service.topics.retry_acks, LANE, None)
    assert len(driver.outputs(service.inbox_topic_name)) == inbox_before  # none forwarded
    assert redelivered(scheduler) == ["d1"]
    ack(scheduler, "d1")
    assert redelivered(scheduler) == ["d1", "d2"]


def test_cancelling_a_scheduled_head_by_its_id_releases_the_next_as_skip_head_does(scheduler: Scheduler) -> None:
    service, driver = scheduler
    fail(scheduler, "d1")  # scheduled an hour from now
    defer(scheduler, "d2", behind="d1")
    body = orjson.dumps({"id": "d1", "req": "r1"})
    driver.pipe(service.inbox_topic_name, b"d1", KIND_CANCEL + body, partition=partition_for(LANE, PARTITIONS))
    assert service.stats.scheduled_entry("d1", partition_for(LANE, PARTITIONS)) is None
    assert redelivered(scheduler) == ["d2"], "the held record is released, not left behind a head that never comes back"
    assert blocked_keys(scheduler)[-1] == (LANE, "d2", None)
    tick(scheduler)
    assert redelivered(scheduler) == ["d2"]


def test_a_letter_of_an_ordered_topic_is_read_in_its_keys_partition_and_a_held_one_says_so(scheduler: Scheduler) -> None:
    service = scheduler[0]
    lane_partition = partition_for(LANE, PARTITIONS)
    far = next(f"d{i}" for i in range(100) if partition_for(f"d{i}".encode(), PARTITIONS) != lane_partition)
    fail(scheduler, far)
    defer(scheduler, "held", behind=far)
    assert service.stats.scheduled_entry(far) is None, "not in its id's own partition"
    assert service.stats.knows(far, lane_partition) and not service.stats.knows(far, partition_for(far.encode(), PARTITIONS))
    entry = service.stats.scheduled_entry(far, lane_partition)
    assert entry is not None and entry.id == far
    held = service.stats.held_entry("held", lane_partition)
    assert held is not None and header(held.headers, HELD_BEHIND) == far.encode()
    assert service.stats.scheduled_entry("held", lane_partition) is None


def blocked_listed(service: RetrySchedulerService, origin_topic: str | None = None) -> list[dict[str, object]]:
    """What GET /ordered-keys/blocked lists of every partition, merged as the route merges them."""
    items = []
    for p in range(PARTITIONS):
        scan = scan_lanes(service.state.index.view(p), after=None, limit=100, origin_topic=origin_topic, budget=1000)
        assert scan.exhausted
        items += [blocked_key_json(key[1:], raw, service.stats.head_status(p, decode_lane(raw).head)) for key, raw in scan.items]
    merged, _ = merge_pages([{"items": items}], 100, blocked_sort, bytes.fromhex)
    return merged


def test_blocked_keys_are_listed_by_origin_topic_and_key_with_their_head_and_held_count(scheduler: Scheduler) -> None:
    service, driver = scheduler
    fail(scheduler, "d1", attempt=3)  # parked head of customer-7
    defer(scheduler, "d2", behind="d1")
    fail(scheduler, "e1", due_now=True, key=b"customer-3")  # scheduled head, nothing held
    not_text = b"\xff\xfe-7"
    driver.pipe(
        service.topics.dead_letters, not_text, b"o1", headers=headers_of("o1", attempt=1, failed_at=now_ms(), origin="other")
    )
    fields = ("origin_topic", "key", "key_base64", "head", "head_status", "held")
    assert [tuple(i[f] for f in fields) for i in blocked_listed(service)] == [
        ("orders", "customer-3", "Y3VzdG9tZXItMw==", "e1", "scheduled", 0),
        ("orders", "customer-7", "Y3VzdG9tZXItNw==", "d1", "parked", 1),
        ("other", None, "//4tNw==", "o1", "scheduled", 0),  # not UTF-8: its bytes only
    ]
    assert [i["head"] for i in blocked_listed(service, "other")] == ["o1"]
    assert blocked_listed(service, "order") == []  # a topic's name, not a prefix of it
    tick(scheduler)
    assert [i["head_status"] for i in blocked_listed(service, "orders")] == ["away", "parked"]
    lane_command(scheduler, "park-key")
    assert [i["key"] for i in blocked_listed(service, "orders")] == ["customer-3"]


def test_a_page_of_blocked_keys_resumes_after_its_cursor(scheduler: Scheduler) -> None:
    service, _ = scheduler
    for n in range(5):
        fail(scheduler, f"k{n}", key=f"key-{n}".encode())
    lanes = sorted(lane_key(ORDERED_TOPIC, f"key-{n}".encode()) for n in range(5))
    after = decode_blocked_cursor(blocked_cursor(lanes[1]))
    assert after == lanes[1]
    found = []
    for p in range(PARTITIONS):
        scan = scan_lanes(service.state.index.view(p), after=lane_row_key(after), limit=10, origin_topic=None, budget=1000)
        found += [key[1:] for key, _ in scan.items]
    assert sorted(found) == lanes[2:]
    assert decode_blocked_cursor(None) is None
    for other in (encode_cursor("not hex", "ordered-keys"), encode_cursor(lanes[0].hex(), "parked"), "bm8tY29sb24"):
        with pytest.raises(InvalidCursor):
            decode_blocked_cursor(other)
