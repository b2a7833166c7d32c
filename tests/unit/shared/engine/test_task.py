"""The engine's tasks and their batches: checked states and statuses, the commit's fences, and
the rebalance and commit cases a worker meets, run on the task the worker runs (through the
topology driver's in-memory clients), in milliseconds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from shared.engine import Engine, InputBatch, Table
from shared.engine._batch import BatchStateError, BatchStatus, batch_steps, commit
from shared.engine._consumer import NotAMember
from shared.engine._engine import faust_app
from shared.engine._faults import FaultPoints
from shared.engine._producer import Outgoing, Retry
from shared.engine._task import StepFailed, Task, TaskClients, TaskState, TaskStateError
from shared.engine.testing import MemoryProducer, TopologyDriver
from shared.metrics import REGISTRY
from shared.settings import Settings

Hook = Callable[[InputBatch, BatchStatus], None]


class RecordedFaults(FaultPoints):
    """The fault points a worker's crash tests set, recorded instead of acted on."""

    def __init__(self) -> None:
        super().__init__()
        self.points: list[tuple[str, str, bool]] = []

    def reached(self, point: str, handler: str, writes_rows: bool) -> None:
        self.points.append((point, handler, writes_rows))


def counting_engine(tmp_path: Path, faults: FaultPoints | None = None) -> tuple[Engine, Table]:
    """A handler counting its records per key in ``counts`` and sending each on to ``out``."""
    engine = Engine("probe", Settings(data_dir=tmp_path, topic_partitions=2), 18995, faults=faults)
    counts = engine.table("counts")

    @engine.handler("in", name="count", offsets=counts)
    async def count(batch: InputBatch) -> None:
        for record in batch.records:
            assert record.key is not None
            seen = int(batch.read(counts, record.key) or b"0")
            batch.write(counts, record.key, str(seen + 1).encode())
            batch.send("out", record.key, record.value)

    @engine.handler("log", name="forward", offsets=None)
    async def forward(batch: InputBatch) -> None:
        for record in batch.records:
            batch.send("out", record.key, record.value)

    return engine, counts


# -- states and statuses ----------------------------------------------------------------------


def test_a_task_goes_only_where_its_state_leads(tmp_path: Path) -> None:
    engine, _ = counting_engine(tmp_path)
    task = engine.task("in", 0)
    assert engine.tasks_in(TaskState.CREATED) == [task]
    with pytest.raises(TaskStateError, match="created: it cannot become running"):
        task.transition(TaskState.RUNNING)
    task.restore()
    task.restored()
    assert engine.tasks_in(TaskState.RUNNING) == [task]
    task.suspend()
    assert engine.tasks_in(TaskState.SUSPENDED) == [task]
    task.restore()  # assigned again: restored before it runs
    assert engine.tasks_in(TaskState.RESTORING) == [task]
    task.close()
    with pytest.raises(TaskStateError, match="closed: it cannot become restoring"):
        task.transition(TaskState.RESTORING)


def test_a_partition_assigned_again_without_a_revocation_is_restored_before_it_runs(tmp_path: Path) -> None:
    engine, _ = counting_engine(tmp_path)
    task = engine.task("in", 1)
    task.restore()
    task.restored()
    task.restore()  # a restore into an owned partition
    assert engine.tasks_in(TaskState.RESTORING) == [task]


def test_a_batch_takes_no_write_once_its_commit_began_and_is_committed_once(tmp_path: Path) -> None:
    engine, counts = counting_engine(tmp_path)
    with TopologyDriver(engine) as driver:
        record = driver.send("in", b"k", b"v")
        [batch] = driver.process()
        assert batch.status is BatchStatus.APPLIED
        with pytest.raises(BatchStateError, match="applied: no write once its commit began"):
            batch.write(counts, b"k", b"late")
        with pytest.raises(BatchStateError, match="applied: no send"):
            batch.send("out", b"k", b"late")
        with pytest.raises(BatchStateError, match="applied: it cannot become committing"):
            driver.run(commit(engine.producer, None, None, batch, "probe.count"))
        assert driver.table("counts").get(b"k", partition=record.partition) == b"1"


def test_the_statuses_follow_the_commit_and_the_crash_points_are_hooks_on_them(tmp_path: Path) -> None:
    faults = RecordedFaults()
    engine, _ = counting_engine(tmp_path, faults)
    statuses: list[tuple[str, BatchStatus]] = []
    with TopologyDriver(engine) as driver:
        for topic in ("in", "log"):
            task = driver.task(topic, 0)
            batch_records = [driver.send(topic, b"k", b"v", partition=0)]

            original = task._reached

            def seen(batch: InputBatch, status: BatchStatus, *, topic: str = topic, hooks: Hook = original) -> None:
                statuses.append((topic, status))
                hooks(batch, status)  # the task's own hooks too

            task._reached = seen  # type: ignore[method-assign]
            driver.run(task.process(batch_records, TaskClients(producer=engine.producer)))
    assert statuses == [
        ("in", BatchStatus.COMMITTING),
        ("in", BatchStatus.SENT),
        ("in", BatchStatus.LOGGED),
        ("in", BatchStatus.APPLIED),
        # a handler without tables has nothing to log (at-least-once)
        ("log", BatchStatus.COMMITTING),
        ("log", BatchStatus.SENT),
        ("log", BatchStatus.APPLIED),
    ]
    assert faults.points == [
        ("handled", "probe.count", True),
        ("sent", "probe.count", True),
        ("logged", "probe.count", True),
        ("handled", "probe.forward", False),
        ("sent", "probe.forward", False),
    ]


# -- rebalance and commit cases ------------------------------------------------------------------


class PausingProducer(MemoryProducer):
    """Acknowledges every send, and runs ``during`` once, while the batch's records are in flight."""

    def __init__(self, inner: MemoryProducer) -> None:
        super().__init__(inner.settings, inner.topics)
        self.during: list[object] = []

    async def send(self, records: Sequence[Outgoing], what: str, before_retry: Retry | None = None) -> dict[tuple[str, int], int]:
        last = await super().send(records, what, before_retry)
        while self.during:
            action = self.during.pop()
            assert callable(action)
            action()
        return last


def test_a_revocation_during_a_commit_writes_nothing_more_of_the_batch(tmp_path: Path) -> None:
    engine, _ = counting_engine(tmp_path)
    with TopologyDriver(engine) as driver:
        producer = PausingProducer(engine.producer)  # type: ignore[arg-type]
        record = driver.send("in", b"k", b"v", partition=0)
        task = driver.task("in", 0)
        producer.during.append(task.suspend)  # revoked while its outputs are acknowledged
        with pytest.raises(NotAMember, match="suspended"):
            driver.run(task.process([record], TaskClients(producer=producer)))
        assert driver.changelog("counts") == []
        assert driver.table("counts").get(b"k", partition=0) is None
        assert driver.table("counts").next_offset("in", 0) is None

        task.restore()  # assigned back: the batch is read again and counted once
        task.restored()
        driver.run(task.process([record], TaskClients(producer=engine.producer)))
        assert driver.table("counts").get(b"k", partition=0) == b"1"


def test_a_member_frozen_mid_commit_and_removed_writes_no_rows_and_its_batch_counts_once(tmp_path: Path) -> None:
    engine, _ = counting_engine(tmp_path)
    removed = False

    async def member() -> None:
        if removed:
            raise NotAMember("the group removed this member")

    def freeze_and_remove() -> None:
        nonlocal removed
        removed = True

    with TopologyDriver(engine) as driver:
        producer = PausingProducer(engine.producer)  # type: ignore[arg-type]
        records = [driver.send("in", b"k", b"1", partition=0), driver.send("in", b"k", b"2", partition=0)]
        task = driver.task("in", 0)
        producer.during.append(freeze_and_remove)
        with pytest.raises(NotAMember, match="removed"):
            driver.run(task.process(records, TaskClients(producer=producer, member=member)))
        assert [r.value for r in driver.outputs("out")] == [b"1", b"2"]  # sent: at-least-once
        assert driver.changelog("counts") == []  # no rows after the next owner's
        # this member rejoins and gets the partition back: both records counted once
        removed = False
        driver.run(task.process(records, TaskClients(producer=engine.producer, member=member)))
        driver.run(task.process(records, TaskClients(producer=engine.producer, member=member)))  # a replay
        assert driver.table("counts").get(b"k", partition=0) == b"2"


def test_a_failed_send_leaves_the_batch_failed_and_its_step_named(tmp_path: Path) -> None:
    engine, _ = counting_engine(tmp_path)

    class Refusing(MemoryProducer):
        async def send(
            self, records: Sequence[Outgoing], what: str, before_retry: Retry | None = None
        ) -> dict[tuple[str, int], int]:
            raise ConnectionError("broker away")

    with TopologyDriver(engine) as driver:
        record = driver.send("in", b"k", b"v", partition=0)
        task = driver.task("in", 0)
        with pytest.raises(StepFailed) as failed:
            driver.run(task.process([record], TaskClients(producer=Refusing(engine.settings, driver.topics))))
        assert failed.value.step == "commit" and isinstance(failed.value.__cause__, ConnectionError)
        assert failed.value.batch is not None and failed.value.batch.status is BatchStatus.FAILED
        assert driver.table("counts").get(b"k", partition=0) is None


def test_a_suspended_or_closed_task_processes_nothing(tmp_path: Path) -> None:
    engine, _ = counting_engine(tmp_path)
    with TopologyDriver(engine) as driver:
        record = driver.send("in", b"k", b"v", partition=0)
        task: Task = driver.task("in", 0)
        task.suspend()
        with pytest.raises(NotAMember, match="suspended"):
            driver.run(task.process([record], TaskClients(producer=engine.producer)))
        task.close()
        with pytest.raises(NotAMember, match="closed"):
            driver.run(task.process([record], TaskClients(producer=engine.producer)))
        assert driver.outputs("out") == []


# -- the driver's clock ---------------------------------------------------------------------------


def test_timers_run_on_the_drivers_clock_and_tickers_read_it(tmp_path: Path) -> None:
    engine = Engine("probe", Settings(data_dir=tmp_path, topic_partitions=1), 18994)
    table = engine.table("ticks")
    ticker = engine.ticker("tick", b"t", interval_s=1.0, name="tick of probe")
    runs: list[float] = []
    taken: list[int] = []

    async def send_ticks() -> None:
        runs.append(driver.clock)
        await ticker.send_to([0])

    engine.timer(1.0, name="tick")(send_ticks)

    @engine.handler("tick", name="ticked", offsets=table)
    async def ticked(batch: InputBatch) -> None:
        taken.extend(record.offset for record in batch.records)
        if not hold:
            batch.after_commit(lambda: ticker.taken(batch.partition))

    with TopologyDriver(engine) as driver:
        hold = False
        driver.advance(0.5)
        assert runs == [] and taken == []
        driver.advance(2.0)  # the timer is due at 1.0 and 2.0
        assert runs == [1.0, 2.0] and taken == [0, 1]
        hold = True  # a tick not taken stays in flight for ten intervals of the clock
        driver.advance(1.0)
        driver.advance(5.0)
        assert taken == [0, 1, 2]
        driver.advance(5.0)
        assert taken == [0, 1, 2, 3]
        assert driver.clock == 13.5


def test_the_end_of_a_rebalance_runs_the_restored_tasks_with_or_without_tables(tmp_path: Path) -> None:
    # Faust ends a rebalance's recovery with on_rebalance_end() on both of its paths (an app of
    # stateless handlers skips the table recovery): a partition that gets no record is ready too.
    engine, _ = counting_engine(tmp_path)
    restoring = [engine.task("in", 0), engine.task("log", 1)]
    for task in restoring:
        task.restore()
    faust_app(engine).on_rebalance_end()
    assert engine.tasks_in(TaskState.RUNNING) == restoring


def test_a_batch_s_steps_are_timed_in_order_and_a_step_not_reached_is_left_out() -> None:
    batch = InputBatch("in", 0, [])
    batch.staged_at = 10.0
    batch.reached_at = {BatchStatus.COMMITTING: 10.5, BatchStatus.SENT: 12.0, BatchStatus.APPLIED: 12.25}
    # no LOGGED: the handler wrote no table, so the apply follows the send
    assert batch_steps(batch, started=9.0) == {"read": 1.0, "handle": 0.5, "send": 1.5, "apply": 0.25}


def step_counts() -> dict[str, float]:
    """The batches of the probe's ``count`` handler observed per step so far."""
    return {
        sample.labels["step"]: sample.value
        for metric in REGISTRY.collect()
        if metric.name == "statefleet_batch_step_seconds"
        for sample in metric.samples
        if sample.name.endswith("_count") and sample.labels["service"] == "probe" and sample.labels["stream"] == "count"
    }


def test_every_step_of_a_processed_batch_is_observed(tmp_path: Path) -> None:
    engine, _ = counting_engine(tmp_path, RecordedFaults())
    before = step_counts()
    with TopologyDriver(engine) as driver:
        driver.send("in", b"k", b"v", partition=0)
        driver.process()
    after = step_counts()
    assert {step: after[step] - before.get(step, 0) for step in after} == dict.fromkeys(
        ("read", "handle", "send", "log", "apply"), 1
    )
