"""exactly_once on the real broker: one transactional producer per input partition, and an
owner that was replaced cannot commit anything any more (zombie fencing), whether it was
stalled in the middle of a transaction or starts a new one after the new owner took over.
Also: the ChangelogReader's highwaters with read_committed stop at the last committed
record, so Faust's recovery can reach them."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from faust.types import TP

from shared.engine._copies import ChangelogEnds
from shared.engine._producer import BatchProducer, Outgoing, PartitionTransactions, transactional_id
from shared.engine._restore import ChangelogReader
from shared.metrics import REGISTRY
from shared.settings import Settings
from tests.support.kafka import create_topics, read_all

pytestmark = pytest.mark.integration


def settings(bootstrap: str) -> Settings:
    return Settings(kafka_bootstrap_servers=bootstrap, processing_guarantee="exactly_once")


def owner(bootstrap: str, group: str, name: str) -> PartitionTransactions:
    s = settings(bootstrap)
    return PartitionTransactions(s, group, name, BatchProducer(s, name), service=name)


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def committed_offset(bootstrap: str, group: str, tp: TopicPartition) -> int | None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        offset: int | None = await consumer.committed(tp)  # aiokafka's methods are not annotated
        return offset
    finally:
        await consumer.stop()


def test_the_transactional_id_names_group_topic_and_partition() -> None:
    assert transactional_id("p.statefleet-tallies", "p.account-events", 3) == "p.statefleet-tallies.p.account-events.3"


def test_a_stalled_owner_cannot_commit_after_the_new_owner_started(kafka_bootstrap: str, prefix: str) -> None:
    source, out = f"{prefix}input", f"{prefix}out"
    create_topics([source, out], partitions=1)
    group = f"{prefix}statefleet-svc"

    async def scenario() -> None:
        old, new = owner(kafka_bootstrap, group, "old"), owner(kafka_bootstrap, group, "new")
        await old.assign([(source, 0)])
        # The old owner is in the middle of a commit: its records are sent, not committed...
        stalled = old._producers[(source, 0)]
        await stalled.begin_transaction()
        await old.records.send_with(stalled, [Outgoing(out, b"k", b"from-old", partition=0)], "old")
        # ...when the partition's new owner initialises its producer: the open transaction is
        # aborted and the old producer fenced.
        await new.assign([(source, 0)])
        with pytest.raises(KafkaError):
            await asyncio.wait_for(stalled.commit_transaction(), 30)
        # Nor can the old owner commit a later batch through the engine's commit.
        with pytest.raises(KafkaError):
            await asyncio.wait_for(
                old.commit(source, 0, [Outgoing(out, b"k", b"from-old-again", partition=0)], 99, "old", lambda _: None), 30
            )
        last = await new.commit(source, 0, [Outgoing(out, b"k", b"from-new", partition=0)], 7, "new", lambda _: None)
        assert last == {(out, 0): last[(out, 0)]}
        assert new.committed == 1 and old.fenced == 1
        # ...and /metrics says so (the owners are named as services here)
        assert metric("statefleet_transactions_fenced_total", service="old") == 1
        assert metric("statefleet_transactions_total", service="new", outcome="committed") == 1
        assert metric("statefleet_transaction_commit_seconds_count", service="new") == 1
        assert await committed_offset(kafka_bootstrap, group, TopicPartition(source, 0)) == 7
        await old.stop()
        await new.stop()
        await old.records.stop()
        await new.records.stop()

    asyncio.run(scenario())
    committed = [r.value for r in read_all(out, isolation_level="read_committed")]
    assert committed == [b"from-new"]
    everything = [r.value for r in read_all(out)]
    assert b"from-old" in everything  # it did reach the log, aborted: only committed readers skip it


def test_changelog_highwaters_stop_at_the_last_committed_record(kafka_bootstrap: str, prefix: str) -> None:
    changelog = f"{prefix}table-changelog"
    create_topics([changelog], partitions=2)
    create_topics([f"{prefix}input"], partitions=1)
    group = f"{prefix}statefleet-svc"

    async def scenario() -> dict[TP, int]:
        writer = owner(kafka_bootstrap, group, "w")
        await writer.assign([(f"{prefix}input", 0)])
        for i in range(3):  # three transactions on partition 0: records at 0, 2, 4; markers at 1, 3, 5
            await writer.commit(
                f"{prefix}input", 0, [Outgoing(changelog, b"k", str(i).encode(), partition=0)], i + 1, "w", lambda _: None
            )
        await writer.stop()
        await writer.records.stop()
        reader = ChangelogReader(settings(kafka_bootstrap))
        try:
            return await reader.highwaters(TP(changelog, 0), TP(changelog, 1))
        finally:
            await reader.stop()

    highwaters = asyncio.run(scenario())
    # Faust takes highwater - 1 as the last offset to apply: the record at 4, not the marker at 5.
    assert highwaters == {TP(changelog, 0): 5, TP(changelog, 1): 0}


def test_unsendable_names_records_that_would_abort_a_transaction(kafka_bootstrap: str, prefix: str) -> None:
    out = f"{prefix}out"
    create_topics([out], partitions=1)

    async def scenario() -> list[str | None]:
        producer = BatchProducer(settings(kafka_bootstrap), "probe")
        try:
            return await producer.unsendable(
                [
                    Outgoing(out, b"k", b"fits"),
                    Outgoing("no such topic!", b"k", b"v"),  # not a legal topic name: no metadata, ever
                    Outgoing(out, b"k", b"x" * 1_000_000),
                ],
                timeout_s=5.0,
            )
        finally:
            await producer.stop()

    fits, unknown, too_large = asyncio.run(scenario())
    assert fits is None
    assert unknown is not None and "'no such topic!' is not available" in unknown
    assert too_large is not None and "larger than a record batch" in too_large


def test_a_changelog_ending_in_a_commit_marker_holds_no_record_past_the_last_one(kafka_bootstrap: str, prefix: str) -> None:
    """What a copy's lag discounts under exactly_once: past the last committed record a
    changelog holds only the transaction's marker, and the read-back says so; a range holding
    a committed record is not mistaken for markers."""
    topic = f"{prefix}markers-changelog"
    create_topics([topic], partitions=1)
    asyncio.run(_markers_check(kafka_bootstrap, prefix, topic))


async def _markers_check(kafka_bootstrap: str, prefix: str, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"{prefix}markers")
    await producer.start()
    try:
        for n in range(3):  # three transactions of one record each: offsets 0, 2, 4, markers 1, 3, 5
            async with producer.transaction():
                await producer.send_and_wait(topic, b"v%d" % n, key=b"k", partition=0)
    finally:
        await producer.stop()
    ends = ChangelogEnds(settings(kafka_bootstrap))
    tp = TP(topic, 0)
    try:
        assert ends.transactional
        assert await ends.end(tp, 1) == 6
        assert await ends.holds_no_records(tp, 5, 6)  # a copy that applied offset 4 is up to date
        assert not await ends.holds_no_records(tp, 3, 6)  # offset 4 is a record it still lacks
        assert await ends.holds_no_records(tp, 5, 6)  # remembered, and asked again after another range
    finally:
        await ends.stop()
