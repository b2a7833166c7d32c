"""OrderedInput and DurableTable without Kafka: replays below the stored next offset are
dropped, holes are read back, the next-offset rows follow the last record of each
partition, several tables resume from the smallest offset, and rows reach the local
database only once the changelog has acknowledged them."""

from __future__ import annotations

import asyncio
import logging
import tempfile
from typing import Any

import pytest
from rocksdict import Rdict

from shared.engine._batch import write_all
from shared.engine._consumer import NotAMember
from shared.engine._durable import (
    NEXT_OFFSET_PREFIX,
    DurableTable,
    InRecord,
    OrderedInput,
    acknowledged,
    input_id_key,
    next_offset_key,
    ordered_rows,
)
from shared.engine._faust import FAUST_OFFSET_KEY
from shared.engine._rocksdb import engine_family, is_engine_key, open_partition_db
from tests.support.services import wait_for_async


class FakeStore:
    def __init__(self, rows: dict[tuple[int, bytes], bytes]) -> None:
        self.rows = rows

    def get(self, partition: int, key: bytes) -> bytes | None:
        return self.rows.get((partition, key))


class FakeBackfill:
    def __init__(self, log_start: int = 0) -> None:
        self.reads: list[tuple[str, int, int, int]] = []
        self.start = log_start

    async def log_start(self, topic: str, partition: int) -> int:
        return self.start

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[InRecord]:
        self.reads.append((topic, partition, start, end))
        return [InRecord(topic, partition, o, b"k", b"back", [], 1000) for o in range(start, end)]


def events(topic: str, partition: int, *offsets: int) -> list[InRecord]:
    return [InRecord(topic, partition, o, b"k", b"v", [], 1000) for o in offsets]


def run(store: dict[tuple[int, bytes], bytes], evs: list[InRecord], backfill: FakeBackfill | None = None) -> Any:
    backfill = backfill or FakeBackfill()
    reader = OrderedInput(app=None, stores=FakeStore(store), backfill=backfill)  # type: ignore[arg-type]
    return asyncio.run(reader.batch_records(evs)), backfill, reader


def test_contiguous_input_passes_through_and_advances_the_offsets() -> None:
    store = {(0, next_offset_key("t")): b"5", (1, next_offset_key("t")): b"0"}
    batch, backfill, _ = run(store, events("t", 0, 5, 6, 7) + events("t", 1, 0, 1))
    assert [(r.partition, r.offset) for r in batch.records] == [(0, 5), (0, 6), (0, 7), (1, 0), (1, 1)]
    assert batch.offset_rows == {(0, next_offset_key("t")): b"8", (1, next_offset_key("t")): b"2"}
    assert backfill.reads == [] and batch.backfilled == []


def test_replays_below_the_next_offset_are_dropped() -> None:
    batch, _, reader = run({(3, next_offset_key("t")): b"10"}, events("t", 3, 7, 8, 9, 10, 11))
    assert [r.offset for r in batch.records] == [10, 11]
    assert reader.replays_dropped == 3
    assert batch.offset_rows == {(3, next_offset_key("t")): b"12"}


def test_a_hole_is_read_back_before_the_record_after_it() -> None:
    batch, backfill, reader = run({(2, next_offset_key("t")): b"218"}, events("t", 2, 218, 219, 220, 235, 236))
    assert [r.offset for r in batch.records] == [218, 219, 220, *range(221, 235), 235, 236]
    assert [r.value for r in batch.records if 221 <= r.offset < 235] == [b"back"] * 14
    assert backfill.reads == [("t", 2, 221, 235)]
    assert batch.backfilled == [("t", 2, 221, 234)]
    assert reader.records_backfilled == 14
    assert batch.offset_rows == {(2, next_offset_key("t")): b"237"}


def test_a_partition_never_seen_starts_at_the_log_start() -> None:
    batch, backfill, _ = run({}, events("t", 0, 3, 4), FakeBackfill(log_start=0))
    assert [r.offset for r in batch.records] == [0, 1, 2, 3, 4]
    assert backfill.reads == [("t", 0, 0, 3)]


def test_topics_keep_separate_offsets() -> None:
    batch, _, _ = run({(0, next_offset_key("a")): b"4"}, events("a", 0, 4) + events("b", 0, 0))
    assert batch.offset_rows == {(0, next_offset_key("a")): b"5", (0, next_offset_key("b")): b"1"}


def test_ordered_rows_put_later_parts_last() -> None:
    rows = ordered_rows([((0, b"x"), b"1"), ((0, b"off"), b"old")], [((0, b"off"), b"9")])
    assert list(rows.items()) == [((0, b"x"), b"1"), ((0, b"off"), b"9")]


def test_several_tables_resume_from_the_smallest_next_offset() -> None:
    a = FakeStore({(0, next_offset_key("t")): b"9"})
    b = FakeStore({(0, next_offset_key("t")): b"7"})
    reader = OrderedInput(app=None, stores=[a, b], backfill=FakeBackfill())  # type: ignore[arg-type]
    batch = asyncio.run(reader.batch_records(events("t", 0, 7, 8, 9)))
    assert [r.offset for r in batch.records] == [7, 8, 9]
    assert batch.offset_rows == {(0, next_offset_key("t")): b"10"}


def test_a_table_without_the_row_means_the_log_start() -> None:
    a = FakeStore({(0, next_offset_key("t")): b"5"})
    backfill = FakeBackfill(log_start=2)
    reader = OrderedInput(app=None, stores=[a, FakeStore({})], backfill=backfill)  # type: ignore[arg-type]
    batch = asyncio.run(reader.batch_records(events("t", 0, 5)))
    assert [r.offset for r in batch.records] == [2, 3, 4, 5]
    assert backfill.reads == [("t", 0, 2, 5)]


class CommittedBackfill(FakeBackfill):
    """A log whose offsets in ``markers`` hold no committed record (markers, aborted records)."""

    def __init__(self, markers: set[int]) -> None:
        super().__init__()
        self.markers = markers

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[InRecord]:
        self.reads.append((topic, partition, start, end))
        return [InRecord(topic, partition, o, b"k", b"back", [], 1000) for o in range(start, end) if o not in self.markers]


def committed_reader(store: dict[tuple[int, bytes], bytes], backfill: FakeBackfill) -> OrderedInput:
    return OrderedInput(app=None, stores=FakeStore(store), backfill=backfill, read_committed=True)  # type: ignore[arg-type]


def test_read_committed_gaps_inside_one_fetch_are_not_read_back() -> None:
    # The consumer read offsets 11 and 14..15 itself and found no committed record there.
    backfill = CommittedBackfill(markers={11, 14, 15})
    reader = committed_reader({(0, next_offset_key("events")): b"10"}, backfill)
    batch = asyncio.run(reader.batch_records(events("events", 0, 10, 12, 13, 16)))
    assert [r.offset for r in batch.records] == [10, 12, 13, 16]
    assert backfill.reads == [] and reader.empty_gaps_accepted == 2 and batch.backfilled == []
    assert batch.offset_rows[(0, next_offset_key("events"))] == b"17"


def test_read_committed_a_marker_before_a_fetch_is_read_back_once_and_accepted(caplog: pytest.LogCaptureFixture) -> None:
    backfill = CommittedBackfill(markers={10})
    reader = committed_reader({(0, next_offset_key("events")): b"10"}, backfill)
    with caplog.at_level(logging.WARNING):
        batch = asyncio.run(reader.batch_records(events("events", 0, 11, 12)))
    assert [r.offset for r in batch.records] == [11, 12] and batch.backfilled == []
    assert backfill.reads == [("events", 0, 10, 11)] and reader.records_backfilled == 0
    assert "skipped" not in caplog.text


def test_read_committed_a_fetch_continuing_the_last_one_needs_no_read_back() -> None:
    # The consumer handed over records up to 9 before and fetched on with no seek: offset 10
    # (the previous transaction's marker) was read by it and held no committed record.
    backfill = CommittedBackfill(markers={10})
    reader = committed_reader({(0, next_offset_key("events")): b"10"}, backfill)
    batch = asyncio.run(reader.batch_records(events("events", 0, 11, 12), continues_from=10))
    assert [r.offset for r in batch.records] == [11, 12] and backfill.reads == []


def test_read_committed_a_continuing_fetch_past_unprocessed_records_is_still_read_back() -> None:
    # The handler is behind what the consumer handed over (its batch was not committed).
    backfill = CommittedBackfill(markers=set())
    reader = committed_reader({(0, next_offset_key("events")): b"5"}, backfill)
    batch = asyncio.run(reader.batch_records(events("events", 0, 11), continues_from=10))
    assert [r.offset for r in batch.records] == [5, 6, 7, 8, 9, 10, 11] and backfill.reads == [("events", 0, 5, 11)]


def test_read_committed_a_real_skip_before_a_fetch_is_still_read_back() -> None:
    backfill = CommittedBackfill(markers={10})
    reader = committed_reader({(0, next_offset_key("events")): b"10"}, backfill)
    batch = asyncio.run(reader.batch_records(events("events", 0, 13)))
    assert [r.offset for r in batch.records] == [11, 12, 13]
    assert batch.backfilled == [("events", 0, 10, 12)]


def test_read_committed_a_range_confirmed_empty_is_not_read_again() -> None:
    backfill = CommittedBackfill(markers={10})
    store = {(0, next_offset_key("events")): b"10"}
    reader = committed_reader(store, backfill)

    async def scenario() -> Any:
        assert await reader.confirm_empty("events", 0, 10, 11)  # e.g. the trailing-hole watch
        assert reader.settled_offset("events", 0) == 11
        return await reader.batch_records(events("events", 0, 11))

    batch = asyncio.run(scenario())
    assert [r.offset for r in batch.records] == [11]
    assert backfill.reads == [("events", 0, 10, 11)]  # once, by confirm_empty


def test_reading_uncommitted_records_a_gap_inside_a_fetch_is_still_read_back() -> None:
    batch, backfill, _ = run({(0, next_offset_key("events")): b"10"}, events("events", 0, 10, 12))
    assert [r.offset for r in batch.records] == [10, 11, 12] and backfill.reads == [("events", 0, 11, 12)]


def test_next_offset_keys_are_recognised() -> None:
    assert is_engine_key(next_offset_key("account-events"))
    assert next_offset_key("x").startswith(NEXT_OFFSET_PREFIX)
    assert not is_engine_key(b"program\x00account")


# -- DurableTable / write_all against a fake producer and fake RocksDB -------------------------


class Metadata:
    def __init__(self, offset: int) -> None:
        self.offset = offset


class FakeProducer:
    """The engine producer's interface: records each send; nothing is acknowledged until ``ack_all``."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int, bytes | None, bytes | None]] = []
        self.acked: asyncio.Future[None] | None = None

    async def send(self, records: list[Any], what: str, before_retry: Any = None) -> dict[tuple[str, int], int]:
        last: dict[tuple[str, int], int] = {}
        for r in records:
            self.sent.append((r.topic, r.partition, r.key, r.value))
            last[(r.topic, r.partition)] = last.get((r.topic, r.partition), -1) + 1
        self.acked = asyncio.get_running_loop().create_future()
        await self.acked
        return last

    def ack_all(self, error: BaseException | None = None) -> None:
        assert self.acked is not None
        if error is not None:
            self.acked.set_exception(error)
        else:
            self.acked.set_result(None)


class FakeData:
    """A table's store with real RocksDB partitions (rocksdict, opened as the engine's store opens
    them: with their engine family), in a temporary directory."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="durable-test-")
        self.dbs: dict[int, Rdict] = {}

    def _db_for_partition(self, partition: int) -> Rdict:
        if partition not in self.dbs:
            self.dbs[partition] = open_partition_db(f"{self.dir}/{partition}.db")
        return self.dbs[partition]

    @property
    def persisted(self) -> dict[tuple[str, int], int]:
        """The changelog offset each partition's rows were written up to (Faust's offset row, in
        the engine family)."""
        out: dict[tuple[str, int], int] = {}
        for partition, db in self.dbs.items():
            raw = engine_family(db).get(FAUST_OFFSET_KEY)
            if raw is not None:
                out[(self.topic, partition)] = int(raw)
        return out

    topic = ""


class FakeChangelog:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_topic_name(self) -> str:
        return self.name


class FakeTable:
    def __init__(self, name: str) -> None:
        self.changelog_topic = FakeChangelog(f"{name}-changelog")
        self.data = FakeData()
        self.data.topic = f"{name}-changelog"


class FakeApp:
    def __init__(self) -> None:
        self.producer = FakeProducer()


def tables() -> tuple[FakeApp, DurableTable, DurableTable]:
    app = FakeApp()
    return app, DurableTable(app, FakeTable("a")), DurableTable(app, FakeTable("b"))  # type: ignore[arg-type]


def test_write_all_puts_nothing_locally_before_every_table_is_acknowledged() -> None:
    app, a, b = tables()

    async def scenario() -> None:
        task = asyncio.ensure_future(
            write_all(
                app.producer,  # type: ignore[arg-type]
                [  # type: ignore[arg-type]
                    (a, {(0, b"x"): b"1", (1, b"y"): b"2", (0, b"off"): b"9"}),
                    (b, {(0, b"z"): b"3"}),
                ],
                "test",
            )
        )
        await wait_for_async(lambda: app.producer.acked is not None, 5, interval=0, message="the records sent, awaiting acks")
        assert [(t, p, k) for t, p, k, _ in app.producer.sent] == [
            ("a-changelog", 0, b"x"),
            ("a-changelog", 1, b"y"),
            ("a-changelog", 0, b"off"),
            ("b-changelog", 0, b"z"),
        ]
        assert a.get(0, b"x") is None and b.get(0, b"z") is None
        app.producer.ack_all()
        await task

    asyncio.run(scenario())
    assert (a.get(0, b"x"), a.get(1, b"y"), a.get(0, b"off"), b.get(0, b"z")) == (b"1", b"2", b"9", b"3")
    assert a.table.data.persisted == {("a-changelog", 0): 1, ("a-changelog", 1): 0}
    assert b.table.data.persisted == {("b-changelog", 0): 0}


def test_a_failed_acknowledgement_leaves_the_local_tables_untouched() -> None:
    app, a, b = tables()

    async def scenario() -> None:
        task = asyncio.ensure_future(
            write_all(
                app.producer,  # type: ignore[arg-type]
                [(a, {(0, b"x"): b"1"}), (b, {(0, b"z"): b"3"})],
                "test",  # type: ignore[arg-type]
            )
        )
        await wait_for_async(lambda: app.producer.acked is not None, 5, interval=0, message="the records sent, awaiting acks")
        app.producer.ack_all(RuntimeError("broker said no"))
        try:
            await task
        except RuntimeError:
            return
        raise AssertionError("the failure must propagate")

    asyncio.run(scenario())
    assert a.get(0, b"x") is None and b.get(0, b"z") is None
    assert a.table.data.persisted == {} and b.table.data.persisted == {}


def test_writes_put_the_offsets_after_the_state_of_every_table() -> None:
    _, a, b = tables()
    reader = OrderedInput(app=None, stores=[a, b], backfill=FakeBackfill())  # type: ignore[arg-type]
    batch = asyncio.run(reader.batch_records(events("t", 0, 0, 1)))
    writes = reader.writes(batch, {b: {(0, b"z"): b"3"}})
    assert [(w[0], list(w[1].items())) for w in writes] == [
        (a, [((0, next_offset_key("t")), b"2")]),
        (b, [((0, b"z"), b"3"), ((0, next_offset_key("t")), b"2")]),
    ]
    _, other, _ = tables()
    try:
        reader.writes(batch, {other: {(0, b"q"): b"1"}})
    except ValueError:
        pass
    else:
        raise AssertionError("state rows of a table without the offsets must be refused")


class AfterWarnings(logging.Handler):
    """Calls ``then`` once ``count`` records have been logged: an event ordered after them."""

    def __init__(self, count: int, then: Any) -> None:
        super().__init__(logging.WARNING)
        self.count, self.then = count, then

    def emit(self, record: logging.LogRecord) -> None:
        self.count -= 1
        if self.count == 0:
            self.then()


def test_a_slow_acknowledgement_is_logged_until_it_arrives(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> list[Any]:
        loop = asyncio.get_running_loop()
        first, second = loop.create_future(), loop.create_future()
        first.set_result("first")
        # The second arrives after the second warning: it is what ends them.
        handler = AfterWarnings(2, lambda: second.set_result("second"))
        durable_log = logging.getLogger("shared.engine._durable")
        durable_log.addHandler(handler)
        try:
            return await acknowledged([first, second], "2 records to t", warn_every_s=0.01)
        finally:
            durable_log.removeHandler(handler)

    with caplog.at_level(logging.WARNING, logger="shared.engine._durable"):
        assert asyncio.run(scenario()) == ["first", "second"]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and all(w.startswith("2 records to t: still not acknowledged") for w in warnings)


def test_waiting_for_acknowledgements_can_be_cancelled() -> None:
    async def scenario() -> asyncio.Future[Any]:
        pending: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        awaited = asyncio.Event()

        async def acknowledgement() -> Any:
            awaited.set()
            return await pending

        waiter = asyncio.ensure_future(acknowledged([acknowledgement()], "t", warn_every_s=0.05))
        # Cancelled once it waits: a task cancelled before it ran would never reach the code under test.
        await wait_for_async(awaited.is_set, 5, interval=0, message="the acknowledgement awaited")
        waiter.cancel()
        try:
            await waiter
        except asyncio.CancelledError:
            return pending
        raise AssertionError("the wait must end cancelled")

    assert asyncio.run(scenario()).cancelled()


def test_a_member_the_group_dropped_while_the_changelog_acknowledged_writes_nothing_locally() -> None:
    """The process may be stopped between the changelog's acknowledgement and the local write;
    a member the group dropped meanwhile must not write the acknowledged (later) offset."""
    app, a, b = tables()
    calls: list[str] = []

    async def dropped_after_the_send() -> None:
        calls.append("asked")
        if len(calls) > 1:
            raise NotAMember("dropped")

    async def scenario() -> None:
        task = asyncio.ensure_future(
            write_all(
                app.producer,  # type: ignore[arg-type]
                [(a, {(0, b"x"): b"1"}), (b, {(0, b"z"): b"3"})],
                "test",  # type: ignore[arg-type]
                dropped_after_the_send,
            )
        )
        await wait_for_async(lambda: app.producer.acked is not None, 5, interval=0, message="the records sent, awaiting acks")
        app.producer.ack_all()
        with pytest.raises(NotAMember):
            await task

    asyncio.run(scenario())
    assert calls == ["asked", "asked"] and len(app.producer.sent) == 2
    assert a.get(0, b"x") is None and b.get(0, b"z") is None
    assert a.table.data.persisted == {} and b.table.data.persisted == {}


def test_a_member_the_group_dropped_before_the_changelog_send_sends_no_row() -> None:
    """Stopped while the batch's outputs were being acknowledged and dropped meanwhile, the
    member must not append its rows after those of the partition's next owner."""
    app, a, _ = tables()

    async def dropped() -> None:
        raise NotAMember("dropped")

    async def scenario() -> None:
        with pytest.raises(NotAMember):
            await write_all(app.producer, [(a, {(0, b"x"): b"1"})], "test", dropped)  # type: ignore[arg-type]

    asyncio.run(scenario())
    assert app.producer.sent == []
    assert a.get(0, b"x") is None and a.table.data.persisted == {}


class LaterStore(FakeStore):
    """A table added to a handler that already ran (``Engine.table(..., added_later=True)``)."""

    added_later = True


def test_a_table_added_later_without_next_offsets_resumes_from_the_other_tables() -> None:
    old = FakeStore({(0, next_offset_key("t")): b"500"})
    backfill = FakeBackfill()
    reader = OrderedInput(app=None, stores=[old, LaterStore({})], backfill=backfill)  # type: ignore[arg-type]
    assert reader.next_offset("t", 0) == 500
    batch = asyncio.run(reader.batch_records(events("t", 0, 500, 501)))
    assert [r.offset for r in batch.records] == [500, 501] and backfill.reads == []  # nothing read back
    # Once it has its own rows, the smallest copy wins as for any table.
    stores = [old, LaterStore({(0, next_offset_key("t")): b"490"})]
    reader = OrderedInput(app=None, stores=stores, backfill=backfill)  # type: ignore[arg-type]
    assert reader.next_offset("t", 0) == 490
    # A table not marked so, without rows, still sends the input back to the log start.
    assert OrderedInput(app=None, stores=[old, FakeStore({})], backfill=backfill).next_offset("t", 0) is None  # type: ignore[arg-type]


def named_reader(store: dict[tuple[int, bytes], bytes], topic_id: str | None) -> OrderedInput:
    return OrderedInput(app=None, stores=FakeStore(store), backfill=FakeBackfill(), input_ids=lambda topic: topic_id)  # type: ignore[arg-type]


def test_the_next_offsets_name_the_input_they_count() -> None:
    store = {(0, next_offset_key("t")): b"5"}
    batch = asyncio.run(named_reader(store, "a" * 32).batch_records(events("t", 0, 5, 6)))
    assert batch.offset_rows == {(0, next_offset_key("t")): b"7", (0, input_id_key("t")): b"a" * 32}
    # Once the tables hold the name, batches no longer write it.
    store.update(batch.offset_rows)
    reader = named_reader(store, "a" * 32)
    assert asyncio.run(reader.batch_records(events("t", 0, 7))).offset_rows == {(0, next_offset_key("t")): b"8"}
    assert asyncio.run(reader.batch_records(events("t", 0, 8))).offset_rows == {(0, next_offset_key("t")): b"9"}


def test_next_offsets_of_a_deleted_input_count_for_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """The input deleted and created again: offsets 0.. of the new topic are not replays of the old one's."""
    store = {(0, next_offset_key("t")): b"500", (0, input_id_key("t")): b"a" * 32}
    reader = named_reader(store, "b" * 32)
    with caplog.at_level(logging.WARNING):
        batch = asyncio.run(reader.batch_records(events("t", 0, 0, 1, 2)))
    assert [r.offset for r in batch.records] == [0, 1, 2] and reader.replays_dropped == 0
    assert batch.offset_rows == {(0, next_offset_key("t")): b"3", (0, input_id_key("t")): b"b" * 32}
    assert "deleted and created again since (topic id " + "a" * 32 in caplog.text


def test_next_offsets_of_an_earlier_version_count_the_input_there_is() -> None:
    store = {(0, next_offset_key("t")): b"500"}
    reader = named_reader(store, "b" * 32)
    assert reader.next_offset("t", 0) == 500
    batch = asyncio.run(reader.batch_records(events("t", 0, 499, 500)))
    assert [r.offset for r in batch.records] == [500]
