"""The batch a handler stages and its commit, on a small topology run by the in-memory driver:
what a batch reads (its own writes first), the staged view's ordered scans, and the commit's
order (records sent, then the changelog rows with the next offset last, then the local rows,
then the after-commit callbacks), at least once and as one transaction."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from shared.engine import DeadLetterRoute, Engine, InputBatch, Table
from shared.engine._batch import StagedView
from shared.engine._durable import SortedView, next_offset_key
from shared.engine._faust import FAUST_OFFSET_KEY
from shared.engine._producer import Outgoing, Retry
from shared.engine._rocksdb import engine_family, is_engine_key
from shared.engine.testing import MemoryProducer, TopologyDriver
from shared.settings import Settings

IN, OUT = "in", "out"


class Topology:
    def __init__(self, tmp_path: Path, **settings: object) -> None:
        self.settings = Settings(data_dir=tmp_path, topic_partitions=2, **settings)  # type: ignore[arg-type]
        self.engine = Engine("probe", self.settings, 18999)
        self.table: Table = self.engine.table("rows")


@pytest.fixture
def topology(tmp_path: Path) -> Topology:
    return Topology(tmp_path)


@pytest.fixture
def driver(topology: Topology) -> Iterator[TopologyDriver]:
    with TopologyDriver(topology.engine) as driver:
        yield driver


def put_each(topology: Topology) -> None:
    """A handler writing each input record's key and value as a row."""

    @topology.engine.handler(IN, name="put", offsets=topology.table)
    async def put(batch: InputBatch) -> None:
        for record in batch.records:
            assert record.key is not None
            batch.write(topology.table, record.key, record.value)


def raw_scan(view: StagedView | SortedView, start: bytes = b"") -> list[tuple[bytes, bytes]]:
    """Every row ``view`` shows from ``start`` on, with no filter of its own."""
    it = view.iter()
    it.seek(start)
    out: list[tuple[bytes, bytes]] = []
    while it.valid():
        out.append((it.key(), it.value()))
        it.next()
    return out


def scan(view: StagedView, start: bytes = b"") -> list[tuple[bytes, bytes]]:
    return [
        (key, value)
        for key, value in raw_scan(view, start)
        if key != FAUST_OFFSET_KEY and not is_engine_key(key)  # the engine's own rows
    ]


# -- what a batch reads -------------------------------------------------------------------------


def test_a_batch_reads_its_own_writes_before_the_table_and_the_last_write_wins(
    topology: Topology, driver: TopologyDriver
) -> None:
    put_each(topology)
    driver.send(IN, b"k", b"stored", partition=0)
    driver.process()
    seen: list[bytes | None] = []

    @topology.engine.handler("more", name="rewrite", offsets=topology.table)
    async def rewrite(batch: InputBatch) -> None:
        seen.append(batch.read(topology.table, b"k"))
        batch.write(topology.table, b"k", b"first")
        batch.write(topology.table, b"j", b"other")
        batch.write(topology.table, b"k", b"second")
        seen.append(batch.read(topology.table, b"k"))
        batch.write(topology.table, b"j", None)
        seen.append(batch.read(topology.table, b"j"))
        assert list(batch.rows[topology.table]) == [(0, b"k"), (0, b"j")]  # a rewritten key moves to the end

    driver.pipe("more", b"x", b"", partition=0)
    assert seen == [b"stored", b"second", None]
    changelog = [(r.key, r.value) for r in driver.changelog("rows") if r.key in (b"k", b"j")]
    assert changelog == [(b"k", b"stored"), (b"k", b"second"), (b"j", None)]  # one row per key and batch
    assert driver.table("rows").get(b"k", partition=0) == b"second"


def test_a_write_to_another_partition_lands_there(topology: Topology, driver: TopologyDriver) -> None:
    @topology.engine.handler(IN, name="elsewhere", offsets=topology.table)
    async def elsewhere(batch: InputBatch) -> None:
        batch.write(topology.table, b"k", b"v", partition=1)

    driver.pipe(IN, b"k", b"", partition=0)
    rows = driver.table("rows")
    assert rows.get(b"k", partition=1) == b"v" and rows.get(b"k", partition=0) is None
    assert rows.next_offset(IN, 0) == 1 and rows.next_offset(IN, 1) is None


# -- the staged view ----------------------------------------------------------------------------


def test_the_staged_view_lays_the_batchs_writes_over_the_stored_rows_in_key_order(
    topology: Topology, driver: TopologyDriver
) -> None:
    put_each(topology)
    for key in (b"a", b"c", b"e", b"g"):
        driver.send(IN, key, key.upper(), partition=0)
    driver.process()
    scans: dict[str, list[tuple[bytes, bytes]]] = {}
    got: list[bytes | None] = []

    @topology.engine.handler("view", name="view", offsets=topology.table)
    async def view(batch: InputBatch) -> None:
        batch.write(topology.table, b"b", b"staged b")
        batch.write(topology.table, b"c", b"staged c")  # replaces a stored row
        batch.write(topology.table, b"e", None)  # deletes one
        batch.write(topology.table, b"h", b"staged h")  # after every stored row
        batch.write(topology.table, b"z", b"elsewhere", partition=1)  # not in this partition's view
        staged = batch.view(topology.table)
        scans["all"] = scan(staged)
        scans["from d"] = scan(staged, b"d")
        scans["from c"] = scan(staged, b"c")
        got.extend([staged.get(b"a"), staged.get(b"c"), staged.get(b"e")])

    driver.pipe("view", b"x", b"", partition=0)
    assert scans["all"] == [(b"a", b"A"), (b"b", b"staged b"), (b"c", b"staged c"), (b"g", b"G"), (b"h", b"staged h")]
    assert scans["from d"] == [(b"g", b"G"), (b"h", b"staged h")]
    assert scans["from c"] == [(b"c", b"staged c"), (b"g", b"G"), (b"h", b"staged h")]
    assert got == [b"A", b"staged c", None]


def test_a_staged_view_of_an_empty_partition_holds_the_staged_rows_only(topology: Topology, driver: TopologyDriver) -> None:
    scanned: list[list[tuple[bytes, bytes]]] = []

    @topology.engine.handler(IN, name="view", offsets=topology.table)
    async def view(batch: InputBatch) -> None:
        batch.write(topology.table, b"b", b"2")
        batch.write(topology.table, b"a", b"1")
        scanned.append(scan(batch.view(topology.table)))

    driver.pipe(IN, b"x", b"", partition=1)
    assert scanned == [[(b"a", b"1"), (b"b", b"2")]]


def test_the_tables_reads_and_views_leave_the_engines_own_rows_out(topology: Topology, driver: TopologyDriver) -> None:
    put_each(topology)
    for key in (b"\x00a", b"a", b"z", b"\xff"):  # on either side of the engine's rows
        driver.send(IN, key, key.upper(), partition=0)
    driver.process()
    table = topology.table
    # The engine's rows are in the partition's engine family; the default family holds the service's only.
    engine = engine_family(table.db(0))
    assert engine.get(FAUST_OFFSET_KEY) is not None and table.get(0, next_offset_key(IN)) is not None
    assert engine.get(next_offset_key(IN)) == table.get(0, next_offset_key(IN))
    rows = [(b"\x00a", b"\x00A"), (b"a", b"A"), (b"z", b"Z"), (b"\xff", b"\xff")]
    assert list(table.db(0).items()) == rows
    assert list(table.items(0)) == rows
    assert list(table.items(0, from_key=b"\x00b")) == rows[1:]
    assert list(table.items(0, backwards=True)) == rows[::-1]
    assert raw_scan(table.view(0)) == rows
    assert raw_scan(table.view(0), b"\x00b") == rows[1:]
    assert table.view(0).get(FAUST_OFFSET_KEY) is None and table.view(0).get(b"a") == b"A"
    staged: list[list[tuple[bytes, bytes]]] = []

    @topology.engine.handler("view", name="view", offsets=topology.table)
    async def view(batch: InputBatch) -> None:
        batch.write(topology.table, b"b", b"B")
        staged.append(raw_scan(batch.view(topology.table)))

    driver.pipe("view", b"x", b"", partition=0)
    assert staged == [[*rows[:2], (b"b", b"B"), *rows[2:]]]


# -- the commit's order -------------------------------------------------------------------------


class WatchingProducer(MemoryProducer):
    """Notes, as each send starts, what it holds and whether the table's row ``k`` is local yet."""

    def __init__(self, driver: TopologyDriver, table: Table, fail_first: bool = False) -> None:
        super().__init__(driver.engine.settings, driver.topics)
        self.table = table
        self.fail_first = fail_first
        self.sends: list[tuple[list[tuple[str, bytes | None]], bytes | None]] = []

    async def send(self, records: Sequence[Outgoing], what: str, before_retry: Retry | None = None) -> dict[tuple[str, int], int]:
        self.sends.append(([(r.topic, r.key) for r in records], self.table.get(0, b"k")))
        if self.fail_first:
            self.fail_first = False
            raise ConnectionError("the broker is away")
        return await super().send(records, what, before_retry)


def send_and_write(topology: Topology, after_commit: list[bytes | None]) -> None:
    @topology.engine.handler(IN, name="both", offsets=topology.table)
    async def both(batch: InputBatch) -> None:
        batch.send(OUT, b"o", b"out", partition=0)
        batch.write(topology.table, b"k", b"v")
        batch.after_commit(lambda: after_commit.append(topology.table.get(0, b"k")))


def test_records_are_sent_then_the_changelog_rows_with_the_next_offset_last_then_the_local_rows(
    topology: Topology, driver: TopologyDriver
) -> None:
    after_commit: list[bytes | None] = []
    send_and_write(topology, after_commit)
    watching = topology.engine.producer = WatchingProducer(driver, topology.table)
    driver.pipe(IN, b"x", b"", partition=0)
    changelog = topology.table.changelog
    assert watching.sends == [([(OUT, b"o")], None), ([(changelog, b"k"), (changelog, next_offset_key(IN))], None)]
    assert after_commit == [b"v"]  # the callbacks run once the rows are local
    assert driver.table("rows").next_offset(IN, 0) == 1


def test_a_failed_send_commits_nothing_and_the_batch_is_handed_over_again(topology: Topology, driver: TopologyDriver) -> None:
    after_commit: list[bytes | None] = []
    send_and_write(topology, after_commit)
    watching = topology.engine.producer = WatchingProducer(driver, topology.table, fail_first=True)
    driver.send(IN, b"x", b"", partition=0)
    with pytest.raises(ConnectionError):
        driver.process()
    assert driver.outputs(OUT) == [] and driver.changelog("rows") == []
    assert topology.table.get(0, b"k") is None and after_commit == []

    driver.process()
    assert [r.value for r in driver.outputs(OUT)] == [b"out"]
    assert topology.table.get(0, b"k") == b"v" and after_commit == [b"v"]
    assert len(watching.sends) == 3


def test_a_before_commit_callback_writes_a_row_summing_up_the_batch_once_as_the_commit_begins(
    topology: Topology, driver: TopologyDriver
) -> None:
    @topology.engine.handler(IN, name="summed", offsets=topology.table)
    async def summed(batch: InputBatch) -> None:
        for record in batch.records:
            assert record.key is not None
            batch.write(topology.table, record.key, record.value)
        batch.before_commit(lambda: batch.write(topology.table, b"rows", str(len(batch.rows[topology.table])).encode()))

    for key in (b"a", b"b", b"c"):
        driver.send(IN, key, b"v", partition=0)
    driver.process()
    assert topology.table.get(0, b"rows") == b"3"
    changelog = [r.key for r in driver.changelog("rows")]
    assert changelog == [b"a", b"b", b"c", b"rows", next_offset_key(IN)]


def test_a_handler_that_raises_commits_nothing(topology: Topology, driver: TopologyDriver) -> None:
    @topology.engine.handler(IN, name="fails", offsets=topology.table)
    async def fails(batch: InputBatch) -> None:
        batch.send(OUT, b"o", b"out")
        batch.write(topology.table, b"k", b"v")
        raise ValueError("the handler's own bug")

    with pytest.raises(ValueError, match="own bug"):
        driver.pipe(IN, b"x", b"", partition=0)
    assert driver.outputs(OUT) == [] and driver.changelog("rows") == []
    assert driver.table("rows").next_offset(IN, 0) is None


def test_a_handler_without_an_offsets_table_cannot_write_rows(topology: Topology, driver: TopologyDriver) -> None:
    @topology.engine.handler(IN, name="stateless", offsets=None)
    async def stateless(batch: InputBatch) -> None:
        batch.write(topology.table, b"k", b"v")

    with pytest.raises(RuntimeError, match="cannot write rows"):
        driver.pipe(IN, b"x", b"", partition=0)
    assert topology.table.get(0, b"k") is None


def test_a_dead_letter_needs_a_route_and_goes_out_with_the_batch(topology: Topology, driver: TopologyDriver) -> None:
    @topology.engine.handler(
        IN, name="routed", offsets=topology.table, dead_letters=DeadLetterRoute("probe", "dead-letters", "retry-probe")
    )
    async def routed(batch: InputBatch) -> None:
        for record in batch.records:
            batch.dead_letter(record, ValueError("unreadable"))

    @topology.engine.handler("unrouted", name="unrouted", offsets=topology.table)
    async def unrouted(batch: InputBatch) -> None:
        for record in batch.records:
            batch.dead_letter(record, ValueError("unreadable"))

    driver.pipe(IN, b"x", b"bad", partition=0)
    [letter] = driver.outputs("dead-letters")
    assert letter.value == b"bad" and dict(letter.headers)["dlq.retry.topic"] == b"retry-probe"
    with pytest.raises(RuntimeError, match="no dead-letter route"):
        driver.pipe("unrouted", b"x", b"bad", partition=0)


def test_as_one_transaction_the_records_and_the_changelog_rows_go_out_together(tmp_path: Path) -> None:
    topology = Topology(tmp_path, processing_guarantee="exactly_once")
    after_commit: list[bytes | None] = []
    send_and_write(topology, after_commit)
    with TopologyDriver(topology.engine) as driver:
        assert topology.engine.transactional
        watching = WatchingProducer(driver, topology.table)
        assert topology.engine.transactions is not None
        topology.engine.transactions.records = watching
        driver.pipe(IN, b"x", b"", partition=0)
    changelog = topology.table.changelog
    assert watching.sends == [([(OUT, b"o"), (changelog, b"k"), (changelog, next_offset_key(IN))], None)]
    assert after_commit == [b"v"]
