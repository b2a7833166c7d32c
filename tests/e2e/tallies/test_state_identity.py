"""A worker started on a data dir kept from topics that no longer exist (deleted and created
again under the same names, or another Kafka cluster) discards that local state, restores it
from the changelogs there are now and serves exact tallies, saying why; it never crash-loops
on a changelog shorter than its local offset (docs/contract.md, "Local state")."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from shared.engine._rocksdb import ENGINE_FAMILY
from tests.e2e.tallies.test_tallies_e2e import all_tallies, assert_tallies_settle, wait_all_input_consumed
from tests.e2e.tallies.test_upgrade_data_dir import partition_databases, to_earlier_layout
from tests.integration.retry_scheduler.test_restore_metrics import samples
from tests.support.accounts import History, generate
from tests.support.kafka import BOOTSTRAP, delete_topics_with_prefix, produce
from tests.support.services import ServiceProcess, free_port, wait_for, wait_for_async
from tools import kafka_broker

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: Every partition with a changelog lag is restored in bulk (and so is a discarded one, in full).
ENV = {"STATEFLEET_BULK_RESTORE_MIN_LAG": "1"}
DISCARDED = "discarding the local state of"


def topics_of(tally_topics: dict[str, str]) -> dict[str, bool]:
    """The test's input and output topics, each with whether it is compacted."""
    return {name: name == tally_topics["tallies"] for name in tally_topics.values()}


def recreate(bootstrap: str, prefix: str, topics: dict[str, bool]) -> None:
    """Delete every topic of ``prefix`` (the service's changelogs too) and create the test's own
    ``topics`` again under the same names, as an environment reset does (a service creates the
    topics it owns as it starts)."""

    async def run() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:

            async def gone() -> bool:
                return not any(name.startswith(prefix) for name in await admin.list_topics())

            await wait_for_async(gone, 60, message=f"the topics of {prefix} deleted")
            if topics:
                await create(admin, topics)
        finally:
            await admin.close()

    delete_topics_with_prefix(prefix)
    asyncio.run(run())


async def create(admin: AIOKafkaAdminClient, topics: dict[str, bool]) -> None:
    new = [
        NewTopic(name, 8, 1, topic_configs={"cleanup.policy": "compact"} if compact else {}) for name, compact in topics.items()
    ]
    await admin.create_topics(new)

    async def led() -> bool:
        described = await admin.describe_topics(list(topics))
        return all(d["error_code"] == 0 and d["partitions"] and all(p["leader"] >= 0 for p in d["partitions"]) for d in described)

    await wait_for_async(led, 30, interval=0.1, message="the recreated topics led")


def count(history: History, topics: dict[str, str], connection: dict[str, Any] | None = None) -> None:
    """Send ``history`` to the tallies' inputs."""
    produce(topics["events"], history.events, connection=connection)
    produce(topics["logins"], history.logins, connection=connection)


def counted_and_stopped(start_tallies: Any, instance: str, history: History, topics: dict[str, str]) -> None:
    """Instance ``instance`` counts ``history`` to exact tallies, and stops."""
    proc = start_tallies(instance, **ENV)
    count(history, topics)
    assert_tallies_settle(proc, history.expected)
    proc.stop()


def back_after_another_counted(start_tallies: Any, topics: dict[str, str], prefix: str, history: History) -> ServiceProcess:
    """The topics recreated and ``history`` counted on them by instance b (a fresh data dir);
    then instance a, started again on its old data dir, serves exact tallies of ``history``."""
    recreate(BOOTSTRAP, prefix, topics_of(topics))
    counted_and_stopped(start_tallies, "b", history, topics)
    back: ServiceProcess = start_tallies("a", **ENV)
    assert_tallies_settle(back, history.expected)
    return back


def discarded(proc: ServiceProcess) -> dict[str, float]:
    """statefleet_local_state_discarded_total by cause."""
    out: dict[str, float] = {}
    for labels, value in samples(proc.url, "statefleet_local_state_discarded_total").items():
        cause = dict(labels)["cause"]
        out[cause] = out.get(cause, 0.0) + value
    return out


def log_of(proc: ServiceProcess) -> str:
    return proc.log_path.read_text(errors="replace")


@pytest.mark.parametrize(
    ("first", "second", "cause", "said"),
    [
        # The new changelogs are longer than the old ones: an offset check alone would pass them.
        (generate(6, 30, seed=41), generate(6, 60, seed=42), "topic_recreated", "deleted and created again"),
        # Shorter: Faust's own check would stop the worker (ConsistencyError) at every start.
        (generate(6, 60, seed=43), generate(6, 12, seed=44), "topic_recreated", "deleted and created again"),
    ],
    ids=["longer", "shorter"],
)
def test_topics_recreated_under_the_same_names(  # type: ignore[no-untyped-def]
    start_tallies, tally_topics, prefix, first: History, second: History, cause: str, said: str
) -> None:
    counted_and_stopped(start_tallies, "a", first, tally_topics)
    back = back_after_another_counted(start_tallies, tally_topics, prefix, second)
    log = log_of(back)
    assert DISCARDED in log and said in log, log[-3000:]
    assert "ConsistencyError" not in log
    assert discarded(back).get(cause, 0) >= 1, discarded(back)


def test_an_earlier_layout_under_a_recreated_longer_changelog(  # type: ignore[no-untyped-def]
    start_tallies, tally_topics, prefix, service_env
) -> None:
    """No incarnation recorded (a data dir of an earlier version): its rows are compared with the
    new changelog and found to be another's."""
    first, second = generate(6, 30, seed=45), generate(6, 60, seed=46)
    counted_and_stopped(start_tallies, "a", first, tally_topics)
    databases = partition_databases(Path(service_env["STATEFLEET_DATA_DIR"]) / "tallies" / "a")
    assert databases and sum(to_earlier_layout(path) for path in databases) > 0

    back = back_after_another_counted(start_tallies, tally_topics, prefix, second)
    log = log_of(back)
    assert f"engine rows to the {ENGINE_FAMILY!r}" in log  # opened as an earlier layout
    assert "differ from the changelog" in log, log[-3000:]
    assert discarded(back).get("not_in_changelog", 0) >= 1


def test_the_same_data_dir_of_the_same_topics_is_kept(start_tallies, tally_topics) -> None:  # type: ignore[no-untyped-def]
    """The check costs a restart that kept its volume nothing: no state discarded, nothing read again."""
    history = generate(6, 30, seed=47)
    counted_and_stopped(start_tallies, "a", history, tally_topics)
    again = start_tallies("a", **ENV)
    assert_tallies_settle(again, history.expected)
    assert DISCARDED not in log_of(again)
    assert "partitions lag their changelogs" not in log_of(again)
    assert discarded(again) == {}


@pytest.fixture
def second_cluster(tmp_path: Path) -> Iterator[kafka_broker.BrokerLayout]:
    """Another Kafka cluster (its own storage, formatted anew) on ports of its own."""
    port = free_port()
    layout = kafka_broker.BrokerLayout(
        home=tmp_path / "second-cluster", port=port, controller_port=free_port(), libs_dir=kafka_broker.default_layout().libs
    )
    kafka_broker.start(layout, wait_s=120.0)
    try:
        yield layout
    finally:
        kafka_broker.stop(layout)


def test_another_cluster_under_the_same_names(  # type: ignore[no-untyped-def]
    start_tallies, tally_topics, service_env, second_cluster
) -> None:
    first, second = generate(6, 30, seed=48), generate(6, 45, seed=49)
    counted_and_stopped(start_tallies, "a", first, tally_topics)

    there = {"STATEFLEET_KAFKA_BOOTSTRAP_SERVERS": second_cluster.bootstrap, **ENV}
    connection = {"bootstrap_servers": second_cluster.bootstrap}

    async def topics_there() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=second_cluster.bootstrap)
        await admin.start()
        try:
            await create(admin, topics_of(tally_topics))
        finally:
            await admin.close()

    asyncio.run(topics_there())
    other = start_tallies("b", **there)
    count(second, tally_topics, connection)
    # Waited for over HTTP: the suite's helpers that read consumer groups ask the main broker.
    wait_for(lambda: all_tallies(other) == second.expected, timeout=120, message="tallies counted on the second cluster")
    other.stop()

    back = start_tallies("a", **there)
    wait_for(lambda: all_tallies(back) == second.expected, timeout=120, message="exact tallies of the second cluster")
    log = log_of(back)
    assert DISCARDED in log and "the Kafka cluster changed" in log, log[-3000:]
    assert discarded(back).get("cluster_changed", 0) >= 1


def test_inputs_recreated_under_a_kept_changelog(start_tallies, tally_topics) -> None:  # type: ignore[no-untyped-def]
    """Only the inputs deleted and created again (the changelogs kept): the next offsets the
    tables hold counted the old inputs, and the new ones are read from their start."""
    history = generate(6, 40, seed=50)
    half = len(history.events) // 2
    proc = start_tallies("a", **ENV)
    produce(tally_topics["events"], history.events[:half])
    wait_all_input_consumed(proc)
    proc.stop()

    inputs = {tally_topics["events"]: False, tally_topics["logins"]: False}

    async def recreate_inputs() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=BOOTSTRAP)
        await admin.start()
        try:
            await admin.delete_topics(list(inputs))

            async def gone() -> bool:
                return not set(inputs) & set(await admin.list_topics())

            await wait_for_async(gone, 60, message="the inputs deleted")
            await create(admin, inputs)
        finally:
            await admin.close()

    asyncio.run(recreate_inputs())
    produce(tally_topics["events"], history.events[half:])
    produce(tally_topics["logins"], history.logins)
    back = start_tallies("a", **ENV)
    assert_tallies_settle(back, history.expected)
    assert "count an input deleted and created again since" in log_of(back)
    assert discarded(back).get("input_recreated", 0) >= 1
