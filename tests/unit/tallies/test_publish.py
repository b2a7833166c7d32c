"""Publishing tallies on the in-memory topology driver, without a broker: the publish timer sends
a tick onto each by-program partition with changed programs, and the batch that reads it stages
the tallies that differ from the ones last published (the ``published-tallies`` table) with that
table's rows, so a tally goes out once per change, and never again after a rebalance or a
restart that changed nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

import services.tallies.handlers.inputs as inputs_module
from services.tallies.app import TalliesService
from services.tallies.handlers.by_program import ByProgram
from services.tallies.state import PUBLISH_TICK, PackedInputs, ProgramCounts
from shared.engine import partition_for
from shared.engine.testing import TopologyDriver
from shared.settings import Settings
from shared.topics import topic_names
from tests.support.accounts import event

PARTITIONS = 4


@pytest.fixture(params=["at_least_once", "exactly_once"])
def tallies(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[TalliesService, TopologyDriver]]:
    service = TalliesService(Settings(data_dir=tmp_path, topic_partitions=PARTITIONS, processing_guarantee=request.param))
    with TopologyDriver(service.engine) as driver:
        yield service, driver


def change(service: TalliesService, driver: TopologyDriver, account: str, program: str, type_: str, version: int) -> None:
    driver.send(service.topics.account_events, account.encode(), orjson.dumps(event(account, program, type_, version)))


def login(service: TalliesService, driver: TopologyDriver, account: str, program: str, ts: int) -> None:
    driver.send(service.topics.logins, account.encode(), orjson.dumps({"account_id": account, "program_id": program, "ts": ts}))


def parse_change(value: bytes) -> Any:
    """An account-events record read as the service's default projection reads it."""
    topics = topic_names(Settings())
    read = inputs_module.parser_for(topics.account_events, topics)
    assert read is not None
    return read(value)


def tick(service: TalliesService, driver: TopologyDriver) -> None:
    """What the publish timer does once (every partition owned), and its ticks processed."""
    driver.run(service.by_program.send_publish_ticks())
    driver.process()


def published(service: TalliesService, driver: TopologyDriver) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for r in driver.outputs(service.topics.program_tallies):
        assert r.key is not None and r.value is not None
        out.append((r.key.decode(), orjson.loads(r.value)))
    return out


def tally(program: str, active: int, inactive: int, last_login: int | None = None) -> dict[str, Any]:
    return {"program_id": program, "numberActive": active, "numberInactive": inactive, "lastLogin": last_login}


@pytest.fixture(autouse=True)
def owns_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver runs no consumer group: this instance owns every partition (recovered, as
    the driver's instance always is)."""
    monkeypatch.setattr(ByProgram, "owned_partitions", lambda self: set(range(PARTITIONS)))


def test_a_tick_publishes_changed_tallies_once_and_a_second_tick_nothing(tallies: tuple[TalliesService, TopologyDriver]) -> None:
    service, driver = tallies
    change(service, driver, "a1", "P", "AccountCreated", 1)
    change(service, driver, "a2", "P", "AccountCreated", 1)
    change(service, driver, "a2", "P", "AccountDeactivated", 2)
    change(service, driver, "b1", "Q", "AccountCreated", 1)
    login(service, driver, "a1", "P", 1_700_000_000_123)
    driver.process()
    assert published(service, driver) == []  # nothing before a tick
    assert sum(len(p) for p in service.by_program.dirty.values()) == 2

    tick(service, driver)
    assert sorted(published(service, driver)) == [("P", tally("P", 1, 1, 1_700_000_000_123)), ("Q", tally("Q", 1, 0))]
    assert (
        service.by_program.dirty == {}
        and service.by_program.publish_ticks.in_flight() == set()
        and service.by_program.published == 2
    )
    # The table holds what went out, in the program's partition.
    table = driver.table("published-tallies")
    assert orjson.loads(table.get(b"P") or b"null") == tally("P", 1, 1, 1_700_000_000_123)
    assert table.next_offset(service.by_program_topic_name, partition_for("P", PARTITIONS)) is not None

    tick(service, driver)  # nothing dirty: no tick sent at all
    by_program = driver.outputs(service.by_program_topic_name)
    assert sum(r.value == PUBLISH_TICK for r in by_program) == len({partition_for(p, PARTITIONS) for p in "PQ"})
    # A tick with nothing dirty (sent by hand) publishes nothing either.
    for partition in range(PARTITIONS):
        driver.run(service.by_program.publish_ticks.send(partition))
    driver.process()
    assert len(published(service, driver)) == 2


def test_a_change_that_moves_no_count_publishes_nothing_new(tallies: tuple[TalliesService, TopologyDriver]) -> None:
    service, driver = tallies
    change(service, driver, "a1", "P", "AccountCreated", 1)
    driver.process()
    tick(service, driver)
    assert published(service, driver) == [("P", tally("P", 1, 0))]

    change(service, driver, "a1", "P", "AccountUpdated", 2)  # applied (a new version), same status
    change(service, driver, "a1", "P", "AccountUpdated", 2)  # a replay
    login(service, driver, "a1", "P", 5)
    login(service, driver, "a1", "P", 3)  # older than the last login
    driver.process()
    assert service.by_program.dirty == {partition_for("P", PARTITIONS): {"P"}}
    tick(service, driver)
    assert published(service, driver) == [("P", tally("P", 1, 0)), ("P", tally("P", 1, 0, 5))]

    change(service, driver, "a1", "P", "AccountUpdated", 3)
    login(service, driver, "a1", "P", 4)
    driver.process()
    tick(service, driver)
    assert len(published(service, driver)) == 2  # the program was dirty, its tally unchanged
    assert service.by_program.dirty == {}


def test_a_tick_publishes_the_changes_of_its_own_batch(tallies: tuple[TalliesService, TopologyDriver]) -> None:
    """Inputs and a tick in one batch: the tally published is the one after the whole batch, and
    the program is not left dirty for a later tick (none starves under steady input)."""
    service, driver = tallies
    change(service, driver, "a1", "P", "AccountCreated", 1)
    driver.process()
    partition = partition_for("P", PARTITIONS)
    for a in ("a2", "a3"):
        packed = PackedInputs()
        packed.add(parse_change(orjson.dumps(event(a, "P", "AccountCreated", 1))))
        driver.send(service.by_program_topic_name, None, packed.encode(), partition=partition)
        driver.send(service.by_program_topic_name, None, PUBLISH_TICK, partition=partition)
    change(service, driver, "a1", "P", "AccountDeactivated", 2)
    [batch, *_] = [b for b in driver.process() if b.topic == service.by_program_topic_name]
    assert len(batch.records) == 4  # the two ticks and two inputs, with a1's change behind them
    assert published(service, driver) == [("P", tally("P", 3, 0))]
    assert service.by_program.dirty == {partition: {"P"}}  # a1's deactivation came after the ticks
    tick(service, driver)
    assert published(service, driver) == [("P", tally("P", 3, 0)), ("P", tally("P", 2, 1))]


def test_a_rebuild_after_a_rewind_or_a_restart_republishes_nothing_unchanged(
    tallies: tuple[TalliesService, TopologyDriver],
) -> None:
    service, driver = tallies
    for p in range(6):
        change(service, driver, f"a{p}", f"P{p}", "AccountCreated", 1)
        login(service, driver, f"a{p}", f"P{p}", 100 + p)
    change(service, driver, "b0", "P0", "AccountCreated", 1)
    driver.process()
    tick(service, driver)
    assert len(published(service, driver)) == 6

    # A rebalance: every input partition read again from the start, counts rebuilt, every owned
    # program marked dirty.
    for topic in (service.topics.account_events, service.topics.logins, service.by_program_topic_name):
        for partition in range(PARTITIONS):
            driver.rewind(topic, partition, 0)
    driver.process()
    driver.run(service.by_program.rebuild_counts())
    assert sum(len(p) for p in service.by_program.dirty.values()) == 6
    tick(service, driver)
    assert len(published(service, driver)) == 6 and service.by_program.dirty == {}

    # A restart with the data dir kept: nothing in memory, the tables as committed.
    service.counts, service.by_program.dirty = ProgramCounts(), {}
    service.by_program.publish_ticks.forget()
    driver.run(service.by_program.rebuild_counts())
    change(service, driver, "b0", "P0", "AccountDeactivated", 2)  # one real change meanwhile
    driver.process()
    tick(service, driver)
    assert published(service, driver)[6:] == [("P0", tally("P0", 1, 1, 100))]
    assert service.by_program.dirty == {}


def test_a_rebuild_with_nothing_published_yet_publishes_each_program_once(tallies: tuple[TalliesService, TopologyDriver]) -> None:
    """As after an upgrade over a data dir from before ``published-tallies``."""
    service, driver = tallies
    for p in range(5):
        change(service, driver, f"a{p}", f"P{p}", "AccountCreated", 1)
    driver.process()
    service.by_program.dirty = {}  # as if published by the timer of before, which kept no table
    driver.run(service.by_program.rebuild_counts())
    tick(service, driver)
    tick(service, driver)
    assert sorted(published(service, driver)) == [(f"P{p}", tally(f"P{p}", 1, 0)) for p in range(5)]


def test_counts_not_kept_in_memory_are_counted_from_the_batch(tallies: tuple[TalliesService, TopologyDriver]) -> None:
    """A partition processed before its counts were rebuilt: the tally comes from the memberships
    as the batch sees them, its own writes included."""
    service, driver = tallies
    change(service, driver, "a1", "P", "AccountCreated", 1)
    change(service, driver, "a2", "P", "AccountCreated", 1)
    driver.process()
    service.counts = ProgramCounts()
    partition = partition_for("P", PARTITIONS)
    packed = PackedInputs()
    packed.add(parse_change(orjson.dumps(event("a2", "P", "AccountDeactivated", 2))))
    driver.send(service.by_program_topic_name, None, packed.encode(), partition=partition)
    driver.send(service.by_program_topic_name, None, PUBLISH_TICK, partition=partition)
    driver.process()
    assert published(service, driver) == [("P", tally("P", 1, 1))]


def test_a_tick_is_sent_at_most_once_per_partition_until_processed(tallies: tuple[TalliesService, TopologyDriver]) -> None:
    service, driver = tallies
    change(service, driver, "a1", "P", "AccountCreated", 1)
    driver.process()
    partition = partition_for("P", PARTITIONS)
    driver.run(service.by_program.send_publish_ticks())
    driver.run(service.by_program.send_publish_ticks())
    ticks = [r for r in driver.outputs(service.by_program_topic_name) if r.value == PUBLISH_TICK]
    assert [r.partition for r in ticks] == [partition] and service.by_program.publish_ticks.in_flight() == {partition}
    driver.process()
    assert service.by_program.publish_ticks.in_flight() == set() and len(published(service, driver)) == 1


def test_a_tick_that_cannot_be_sent_is_sent_with_the_next_interval(
    tallies: tuple[TalliesService, TopologyDriver], monkeypatch: pytest.MonkeyPatch
) -> None:
    service, driver = tallies
    change(service, driver, "a1", "P", "AccountCreated", 1)
    driver.process()

    async def refused(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("broker away")

    with monkeypatch.context() as m:
        m.setattr(service.engine, "send", refused)
        driver.run(service.by_program.send_publish_ticks())  # does not raise
    assert service.by_program.publish_ticks.in_flight() == set() and published(service, driver) == []
    tick(service, driver)
    assert published(service, driver) == [("P", tally("P", 1, 0))]
