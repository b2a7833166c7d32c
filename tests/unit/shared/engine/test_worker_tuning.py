"""How the worker is tuned: its consumer's fetch wait, lanes of batches, the frozen start-up objects."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread, Transport
from mode import Service

from shared.engine import Engine
from shared.engine._consumer import BatchConsumer
from shared.engine._engine import _EngineApp
from shared.engine._faust import TableManagerHooks
from shared.engine._gc import freeze_startup_objects
from shared.settings import Settings


@pytest.fixture
def restore_gc() -> Iterator[None]:
    yield
    gc.unfreeze()


async def test_the_worker_consumer_holds_fetches_no_longer_than_the_setting(tmp_path: Path) -> None:
    settings = Settings(data_dir=str(tmp_path), consumer_fetch_max_wait_ms=35, topic_prefix="unit.")
    engine = Engine("tuning", settings, 18999)
    app_consumer = engine._faust_app.consumer
    assert isinstance(app_consumer, BatchConsumer)  # the engine's, over Faust's aiokafka driver
    thread = app_consumer.thread
    assert thread is app_consumer._thread
    assert isinstance(thread, AIOKafkaConsumerThread)
    transport = engine._faust_app.transport
    assert isinstance(transport, Transport)
    consumer = thread._create_worker_consumer(transport)
    assert consumer._fetch_max_wait_ms == 35  # Faust's own choice is 1500
    await consumer.stop()
    assert thread.client is consumer


#: What the engine's worker consumer is built with that Faust would build it with too (aiokafka's
#: attributes and its client's); the fetch wait and the isolation level are the engine's own.
SAME_AS_FAUST = (
    "_group_id",
    "_group_instance_id",
    "_partition_assignment_strategy",
    "_enable_auto_commit",
    "_auto_offset_reset",
    "_max_poll_records",
    "_max_poll_interval_ms",
    "_max_partition_fetch_bytes",
    "_request_timeout_ms",
    "_check_crcs",
    "_session_timeout_ms",
    "_rebalance_timeout_ms",
    "_heartbeat_interval_ms",
)


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_the_worker_consumer_is_faust_s_own_but_for_the_fetch_wait_and_the_isolation_level(
    tmp_path: Path, guarantee: str
) -> None:
    settings = Settings(data_dir=str(tmp_path), processing_guarantee=guarantee, topic_prefix="unit.")
    engine = Engine("tuning", settings, 18999)
    engine.table("counts")
    app_consumer = engine._faust_app.consumer
    assert isinstance(app_consumer, BatchConsumer)
    thread = app_consumer.thread
    transport = engine._faust_app.transport
    assert isinstance(transport, Transport)
    ours = thread._create_worker_consumer(transport)
    faust_s = AIOKafkaConsumerThread._create_worker_consumer(thread, transport)
    try:
        for name in SAME_AS_FAUST:
            assert getattr(ours, name) == getattr(faust_s, name), name
        assert ours._client._bootstrap_servers == faust_s._client._bootstrap_servers
        assert ours._client._client_id == faust_s._client._client_id
        assert ours._client._connections_max_idle_ms == faust_s._client._connections_max_idle_ms
        assert ours._client._security_protocol == faust_s._client._security_protocol
        assert ours._client._metadata_max_age_ms == faust_s._client._metadata_max_age_ms
        assert ours._isolation_level == "read_committed"  # in either guarantee (Faust's: exactly_once only)
        assert ours._fetch_max_wait_ms == settings.consumer_fetch_max_wait_ms
    finally:
        await ours.stop()
        await faust_s.stop()


def test_start_up_objects_are_frozen_out_of_collections(restore_gc: None) -> None:
    startup_object = [["kept for the whole run"]]  # a list: always tracked by the collector
    assert any(o is startup_object for o in gc.get_objects())
    freeze_startup_objects()
    # Frozen: out of every generation, so no collection walks it again.
    assert gc.get_freeze_count() > 0
    assert not any(o is startup_object for o in gc.get_objects())


def test_handlers_share_a_lane_exactly_when_they_write_a_common_table(tmp_path: Path) -> None:
    engine = Engine("lanes", Settings(data_dir=str(tmp_path), topic_prefix="unit."), 18999)
    accounts, outcomes, listing, extra = (engine.table(name) for name in ("accounts", "outcomes", "listing", "extra"))

    async def handle(batch: object) -> None:
        return None

    engine.handler("commands", name="commands", offsets=accounts)(handle)
    engine.handler("outcomes", name="outcomes", offsets=outcomes)(handle)
    engine.handler("events", name="events", offsets=listing)(handle)
    engine.handler("by-program", name="by-program", offsets=[listing, extra])(handle)
    engine.handler("retry", name="retry", offsets=accounts)(handle)
    engine.handler("more", name="more", offsets=extra)(handle)
    engine.handler("dead-letters", "other", name="stateless", offsets=None)(handle)

    app = engine._faust_app
    assert isinstance(app, _EngineApp) and app.delivery is engine.delivery  # what its consumer is given
    lanes = engine.delivery.lanes
    assert lanes["commands"] == lanes["retry"]
    assert lanes["events"] == lanes["by-program"] == lanes["more"]  # "more" joins through "extra"
    assert lanes["dead-letters"] == lanes["other"]
    distinct = {lanes["commands"], lanes["outcomes"], lanes["events"], lanes["dead-letters"]}
    assert len(distinct) == 4


async def test_the_tables_start_at_once_without_faust_s_second_for_late_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(data_dir=str(tmp_path), topic_prefix="unit.")
    engine = Engine("tuning", settings, 18999)
    tables = engine._faust_app.tables
    assert isinstance(tables, TableManagerHooks)  # the engine's, over Faust's
    steps: list[str] = []

    async def update_channels() -> None:
        steps.append("changelog channels")

    async def start_recovery() -> None:
        steps.append("recovery")

    async def no_sleep(service: Service, seconds: float) -> None:
        raise AssertionError(f"the table manager slept {seconds}s on its way to Ready")

    monkeypatch.setattr(tables, "_update_channels", update_channels)
    monkeypatch.setattr(tables.recovery, "start", start_recovery)
    monkeypatch.setattr(Service, "sleep", no_sleep)  # Faust's start sleeps with mode's
    await tables.on_start()
    assert steps == ["changelog channels", "recovery"]
