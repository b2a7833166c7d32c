"""A batch whose commit fails on the brokers' side is delivered again instead of stopping the worker
(``Engine._deliver``, see ``shared/engine/_retry.py``), on the topology driver's in-memory topics:
under exactly_once the partition's producer is initialised again and its tables restored from the
changelog first, so a commit that landed though its answer was lost is not applied twice."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from aiokafka.errors import KafkaTimeoutError, NotLeaderForPartitionError, ProducerFenced, TopicAuthorizationFailedError
from faust.types import TP

from shared.engine import Engine, InputBatch
from shared.engine import _engine as engine_module
from shared.engine._consumer import NotAMember
from shared.engine._engine import faust_app
from shared.engine._producer import NoTransactionalProducer, Outgoing
from shared.engine.testing import MemoryProducer, MemoryTransactions, TopologyDriver
from shared.metrics import REGISTRY
from shared.settings import Settings

#: What a planned failure does: fail before anything is appended, or after the records landed
#: (a commit that went through though its answer never came back).
BEFORE, AFTER = "before", "after"


class FlakyTransactions(MemoryTransactions):
    """Transactions whose next commits fail as planned, then go through."""

    def __init__(self, settings: Settings, records: MemoryProducer, plan: list[tuple[str, BaseException]]) -> None:
        super().__init__(settings, records)
        self.plan = plan
        self.discarded: list[tuple[str, int]] = []

    async def commit(
        self, topic: str, partition: int, records: Sequence[Outgoing], next_offset: int, what: str, reached: Callable[[str], None]
    ) -> dict[tuple[str, int], int]:
        if self.plan:
            when, error = self.plan.pop(0)
            if when == AFTER:
                await super().commit(topic, partition, records, next_offset, what, reached)
            raise error
        return await super().commit(topic, partition, records, next_offset, what, reached)

    async def discard(self, topic: str, partition: int, timeout_s: float) -> None:
        self.discarded.append((topic, partition))


class FlakyProducer(MemoryProducer):
    """The at-least-once batch producer, failing its next sends as planned (nothing appended)."""

    def __init__(self, settings: Settings, driver: TopologyDriver, failures: list[BaseException]) -> None:
        super().__init__(settings, driver.topics)
        self.failures = failures

    async def send(self, records: Sequence[Outgoing], what: str, before_retry: object = None) -> dict[tuple[str, int], int]:
        if self.failures and records:
            raise self.failures.pop(0)
        return await super().send(records, what)


def memory_producer(eng: Engine) -> MemoryProducer:
    assert isinstance(eng.producer, MemoryProducer)
    return eng.producer


def counting_engine(tmp_path: Path, service: str, guarantee: str) -> Engine:
    """A handler that counts records per key in a table and sends one event per record."""
    eng = Engine(service, Settings(data_dir=tmp_path, topic_partitions=1, processing_guarantee=guarantee), 18997)
    counts = eng.table("counts")

    @eng.handler("in", name="count", offsets=counts)
    async def count(batch: InputBatch) -> None:
        for record in batch.records:
            assert record.key is not None
            n = int(batch.read(counts, record.key) or b"0") + 1
            batch.write(counts, record.key, str(n).encode())
            batch.send("events", record.key, f"{record.offset}:{n}".encode(), partition=0)

    return eng


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_module, "retry_delay_s", lambda failures: 0.0)


def still_owner(eng: Engine, owner: list[bool] | None = None) -> list[TP]:
    """Have the engine's ownership check pass (or raise while ``owner[0]`` is False); returns the checks."""
    checked: list[TP] = []

    async def ensure_owner(tp: TP) -> None:
        checked.append(tp)
        if owner is not None and not owner[0]:
            raise NotAMember("revoked")

    eng._ensure_owner = ensure_owner  # type: ignore[method-assign]
    return checked


def retries(service: str, reason: str) -> float:
    return REGISTRY.get_sample_value("statefleet_batch_retries_total", {"service": service, "reason": reason}) or 0.0


def deliver(driver: TopologyDriver, topic: str = "in", partition: int = 0) -> None:
    driver.run(driver.engine._deliver(TP(topic, partition), driver.topics.log(topic, partition)))


def test_a_transaction_that_landed_though_its_commit_failed_is_not_applied_twice(tmp_path: Path) -> None:
    eng = counting_engine(tmp_path, "retry-landed", "exactly_once")
    with TopologyDriver(eng) as driver:
        flaky = FlakyTransactions(eng.settings, memory_producer(eng), [(AFTER, KafkaTimeoutError())])
        eng.transactions = flaky
        checks = still_owner(eng)
        for key in (b"a", b"b", b"a"):
            driver.send("in", key, b"")
        deliver(driver)
        # Delivered once more after the failure: the restore brought the table to the changelog,
        # which holds the landed transaction, so every record was a replay and nothing was redone.
        assert [r.value for r in driver.outputs("events")] == [b"0:1", b"1:1", b"2:2"]
        assert driver.table("counts").get(b"a") == b"2" and driver.table("counts").get(b"b") == b"1"
        assert driver.table("counts").next_offset("in", 0) == 3
        assert flaky.discarded == [("in", 0)] and flaky.renewed == [("in", 0)] and len(checks) == 1
        assert retries("retry-landed", "KafkaTimeoutError") == 1
        # The next batch goes on from there, with the fresh producer and no restore.
        driver.send("in", b"a", b"")
        driver.run(eng._deliver(TP("in", 0), driver.topics.log("in", 0)[3:]))
        assert [r.value for r in driver.outputs("events")][-1] == b"3:3"
        assert flaky.renewed == [("in", 0)]


def test_a_transaction_that_failed_before_it_landed_is_redone_once_it_goes_through(tmp_path: Path) -> None:
    eng = counting_engine(tmp_path, "retry-aborted", "exactly_once")
    with TopologyDriver(eng) as driver:
        flaky = FlakyTransactions(
            eng.settings, memory_producer(eng), [(BEFORE, ProducerFenced()), (BEFORE, NotLeaderForPartitionError())]
        )
        eng.transactions = flaky
        still_owner(eng)
        for key in (b"a", b"a"):
            driver.send("in", key, b"")
        deliver(driver)
        assert [r.value for r in driver.outputs("events")] == [b"0:1", b"1:2"]
        assert driver.table("counts").get(b"a") == b"2"
        assert flaky.renewed == [("in", 0), ("in", 0)] and flaky.committed == 1
        assert retries("retry-aborted", "ProducerFenced") == 1
        assert retries("retry-aborted", "NotLeaderForPartitionError") == 1


def test_a_partition_no_longer_ours_is_left_to_its_owner_and_settled_before_it_is_ours_again(tmp_path: Path) -> None:
    eng = counting_engine(tmp_path, "retry-revoked", "exactly_once")
    with TopologyDriver(eng) as driver:
        flaky = FlakyTransactions(eng.settings, memory_producer(eng), [(AFTER, KafkaTimeoutError())])
        eng.transactions = flaky
        owner = [False]
        still_owner(eng, owner)
        driver.send("in", b"a", b"")
        with pytest.raises(NotAMember):
            deliver(driver)  # the consumer seeks back to the batch; nothing initialised again
        assert flaky.renewed == []
        # Fetched again while still assigned: the landed commit is settled before the handler runs.
        owner[0] = True
        deliver(driver)
        assert flaky.renewed == [("in", 0)]
        assert [r.value for r in driver.outputs("events")] == [b"0:1"]
        assert driver.table("counts").get(b"a") == b"1"


def test_an_at_least_once_commit_whose_sends_failed_is_delivered_again(tmp_path: Path) -> None:
    eng = counting_engine(tmp_path, "retry-alo", "at_least_once")
    with TopologyDriver(eng) as driver:
        eng.batch_producer = FlakyProducer(eng.settings, driver, [KafkaTimeoutError(), NotLeaderForPartitionError()])
        still_owner(eng)
        for key in (b"a", b"b", b"a"):
            driver.send("in", key, b"")
        deliver(driver)
        assert [r.value for r in driver.outputs("events")] == [b"0:1", b"1:1", b"2:2"]
        assert driver.table("counts").get(b"a") == b"2" and driver.table("counts").next_offset("in", 0) == 3
        assert retries("retry-alo", "KafkaTimeoutError") == 1 and retries("retry-alo", "NotLeaderForPartitionError") == 1


class Crashed(Exception):
    pass


def crash_recorder(eng: Engine) -> list[BaseException]:
    crashes: list[BaseException] = []

    async def crash(exc: BaseException) -> None:
        crashes.append(exc)

    faust_app(eng).crash = crash  # type: ignore[method-assign,assignment]
    return crashes


def test_a_handlers_own_failure_still_stops_the_worker(tmp_path: Path) -> None:
    eng = Engine("retry-bug", Settings(data_dir=tmp_path, topic_partitions=1, processing_guarantee="exactly_once"), 18996)
    table = eng.table("t")

    @eng.handler("in", name="buggy", offsets=table)
    async def buggy(batch: InputBatch) -> None:
        raise Crashed("a bug")

    with TopologyDriver(eng) as driver:
        crashes = crash_recorder(eng)
        checks = still_owner(eng)
        driver.send("in", b"a", b"")
        with pytest.raises(Crashed):
            deliver(driver)
        assert [type(c) for c in crashes] == [Crashed] and checks == []


def test_a_refusal_for_want_of_an_acl_still_stops_the_worker(tmp_path: Path) -> None:
    eng = counting_engine(tmp_path, "retry-denied", "exactly_once")
    with TopologyDriver(eng) as driver:
        flaky = FlakyTransactions(eng.settings, memory_producer(eng), [(BEFORE, TopicAuthorizationFailedError())])
        eng.transactions = flaky
        crashes = crash_recorder(eng)
        still_owner(eng)
        driver.send("in", b"a", b"")
        with pytest.raises(TopicAuthorizationFailedError):
            deliver(driver)
        assert [type(c) for c in crashes] == [TopicAuthorizationFailedError] and flaky.renewed == []


def test_a_batch_whose_partition_lost_its_producer_gets_a_fresh_one_while_the_partition_is_ours(tmp_path: Path) -> None:
    # A revocation closed the partition's producer while its batch was being delivered, and the
    # partition came back: the batch is delivered again with a producer initialised afresh,
    # rather than the worker stopping over the missing producer.
    eng = counting_engine(tmp_path, "retry-no-producer", "exactly_once")
    with TopologyDriver(eng) as driver:
        flaky = FlakyTransactions(eng.settings, memory_producer(eng), [(BEFORE, NoTransactionalProducer("in[0]"))])
        eng.transactions = flaky
        checks = still_owner(eng)
        driver.send("in", b"a", b"")
        deliver(driver)
        assert [r.value for r in driver.outputs("events")] == [b"0:1"]
        assert flaky.renewed == [("in", 0)] and len(checks) == 1
        assert retries("retry-no-producer", "NoTransactionalProducer") == 1
