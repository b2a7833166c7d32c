"""The engine a service is built on: its inputs, tables and batch handlers, run on Faust.

A service declares raw-bytes tables (:meth:`Engine.table`) and registers batch handlers
for its input topics (:meth:`Engine.handler`). The engine does the rest, once for every
service: whole per-partition batches straight from the consumer's fetch
(:class:`~shared.engine._consumer.BatchConsumer`), exactly the next records of each
input partition (replays dropped, skipped offsets read back: :class:`OrderedInput`),
the commit of what a handler staged (:func:`~shared.engine._batch.commit`), metrics,
records skipped at a partition's end (:class:`TrailingHoleWatch`), and the worker's
life cycle with the HTTP API on its loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import faust
from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from fastapi import FastAPI
from faust.exceptions import ProducerSendError
from faust.types import TP

from shared import metrics
from shared.engine._access import explain_denial
from shared.engine._admin import TopicSpec
from shared.engine._app import app_id, create_app, faust_topic_specs, run_worker, serve_api
from shared.engine._batch import DeadLetterRoute, InputBatch
from shared.engine._clients import exactly_once
from shared.engine._consumer import BatchConsumer, Delivery, NotAMember
from shared.engine._copies import incarnation_of, start_tracking, stop_tracking, track_copies
from shared.engine._durable import Backfill, DurableTable, InRecord, OrderedInput
from shared.engine._faults import FaultPoints
from shared.engine._faust import AppHooks
from shared.engine._gc import freeze_startup_objects
from shared.engine._instance import Instance
from shared.engine._membership import PeerWatch
from shared.engine._producer import BatchProducer, Outgoing, PartitionTransactions, WriteRefused
from shared.engine._restore import ChangelogReader
from shared.engine._retry import (
    RETRY_STEP_TIMEOUT_S,
    TRANSACTION_COMMIT_TIMEOUT_S,
    TablePartition,
    broker_failure,
    retry_delay_s,
    retry_reason,
)
from shared.engine._task import Handler, Registration, StepFailed, Task, TaskClients, TaskState
from shared.engine._ticks import Ticker
from shared.engine._topology import HandlerNode, Topology
from shared.engine._trailing_holes import TrailingHoleWatch
from shared.engine._versions import check_versions
from shared.engine._warmup import WarmupWatch
from shared.metrics import BATCH_RETRIES
from shared.settings import Settings

log = logging.getLogger(__name__)

#: How often :meth:`Engine.wait_applied` looks at the stored next offset.
APPLIED_POLL_S = 0.005

#: With exactly_once, :meth:`Engine.wait_applied` reads back what is left between the handler
#: and the end when it is this many offsets or fewer (a few transactions' markers), to tell
#: markers from records not processed yet.
MARKERS_CHECKED = 16

#: What a failed send raises (the broker refused it, or it was not acknowledged).
SendFailed = (KafkaError, ProducerSendError)


@dataclass(frozen=True, eq=False)
class Timer:
    """A coroutine the worker runs every ``interval_s`` (see :meth:`Engine.timer`)."""

    name: str
    interval_s: float
    run: Callable[[], Awaitable[None]]


class _EngineApp(AppHooks):
    """A Faust app whose consumer is the engine's :class:`BatchConsumer`, given :attr:`delivery`."""

    consumer_class: type[BatchConsumer] = BatchConsumer
    #: Set by the engine before the worker starts.
    delivery: Delivery | None = None
    #: Called once the recovery of the current assignment completed (the engine's tasks then run).
    on_restored: Callable[[], None] | None = None

    def consumer_options(self) -> dict[str, Any]:
        return {"delivery": self.delivery}

    def on_rebalance_end(self) -> None:
        # Faust calls it last in both of its ways to finish a rebalance's recovery (with tables,
        # and without: an app of stateless handlers), for the current generation only.
        super().on_rebalance_end()
        if self.on_restored is not None:
            self.on_restored()

    @property
    def input_topics(self) -> frozenset[str]:
        """The topics the engine's handlers read (see :func:`shared.engine._coverage.ready`)."""
        return self.delivery.batch_topics if self.delivery is not None else frozenset()


class Engine:
    def __init__(self, service: str, settings: Settings, default_port: int, *, faults: FaultPoints | None = None) -> None:
        check_versions()
        metrics.initialise(service, exactly_once=exactly_once(settings))
        self.service = service
        self.settings = settings
        self.default_port = default_port
        self._faust_app: faust.App = create_app(service, settings, default_port, app_class=_EngineApp)
        #: The running worker as the HTTP API sees it.
        self.instance = Instance(self._faust_app, settings.url_for(default_port), restoring=self._tasks_restoring)
        track_copies(self._faust_app, settings)
        self.backfill = Backfill(settings)
        self._by_topic: dict[str, Registration] = {}
        self._handlers: list[Registration] = []
        #: The crash tests' points, run as hooks on the batches' status transitions.
        self.faults = faults if faults is not None else FaultPoints.from_environment()
        #: Per assigned input partition of a handler, its task (see ``shared/engine/_task.py``).
        self.tasks: dict[tuple[str, int], Task] = {}
        #: The timers registered with :meth:`timer` (the topology driver runs them on its clock).
        self.timers: list[Timer] = []
        #: Monotonic seconds, as tickers read them.
        self.clock: Callable[[], float] = time.monotonic
        #: Topic -> partitions, for the topics handlers read as the service's own.
        self._internal_topics: dict[str, int] = {}
        #: How the worker's consumer hands fetched batches over (topics and lanes added as
        #: handlers register).
        self.delivery = Delivery(
            deliver=self._deliver,
            fetch_max_wait_ms=settings.consumer_fetch_max_wait_ms,
            exactly_once=exactly_once(settings),
            on_assigned=self._assigned,
            on_revoked=self._revoked,
            service=service,
        )
        app = cast(_EngineApp, self._faust_app)
        app.delivery = self.delivery
        app.on_restored = self._restored
        self._trailing_holes: TrailingHoleWatch | None = None
        self.producer = BatchProducer(settings, client_id=f"{service}-{settings.instance_id}")
        #: At-least-once batch commits send through their own producer, each of whose requests
        #: leaves only while the consumer is still the member that fetched the batches.
        self.batch_producer = BatchProducer(
            settings,
            client_id=f"{service}-{settings.instance_id}-batches",
            gate=lambda: cast(BatchConsumer, self._faust_app.consumer).may_write(),
            connections=settings.batch_producer_connections,
        )
        self.transactions: PartitionTransactions | None = None
        #: exactly_once: input partitions whose last commit failed with its outcome unknown, and the
        #: table partitions it wrote (see :meth:`_settle`).
        self._unsettled: dict[tuple[str, int], set[TablePartition]] = {}
        #: Reads changelogs into local tables when a failed commit is settled.
        self.changelogs = ChangelogReader(settings)
        #: The reader is one consumer that assigns itself the partitions of each restore: restores
        #: of several partitions' failed commits take turns.
        self._restoring = asyncio.Lock()
        if exactly_once(settings):
            self._exactly_once()
        self._faust_app.on_before_shutdown.connect(self._on_shutdown)  # type: ignore[arg-type]
        # Peers watched, and a dead one's group member removed, so its partitions move at once.
        self.peer_watch: PeerWatch | None = None
        if settings.peer_watch:
            self.peer_watch = PeerWatch(
                self._faust_app, service, app_id(service, settings), settings.url_for(default_port), settings
            )
            self._faust_app.task(self.peer_watch.run)
        # Copies measured for the next join, and warm-ups taken over once caught up.
        self.warmup_watch: WarmupWatch | None = None
        if settings.warmups:
            self.warmup_watch = WarmupWatch(self._faust_app, settings, settings.url_for(default_port))
            self._faust_app.task(self.warmup_watch.run)
        # The engine's own clients connect as the worker starts: each one's first metadata
        # fetch covers every topic of the cluster, which is better paid before the first batch.
        self._faust_app.task(self._start_clients)

    async def _start_clients(self) -> None:
        freeze_startup_objects()
        await self.producer.start()
        if self.transactions is None:
            await self.batch_producer.start()
        await start_tracking(self._faust_app)
        if any(reg.order is not None for reg in self._handlers):
            await self.backfill.start()

    async def _on_shutdown(self, app: Any, **_: Any) -> None:
        # Faust runs this once the consumer stopped, after the running batch and its commit.
        for task in self.tasks.values():
            task.close()
        if self.peer_watch is not None:
            await self.peer_watch.close()
        if self.warmup_watch is not None:
            self.warmup_watch.close()
        if self.transactions is not None:
            await self.transactions.stop()
        await self.producer.stop()
        await self.batch_producer.stop()
        await self.backfill.stop()
        await self.changelogs.stop()
        await stop_tracking(self._faust_app)

    def _exactly_once(self) -> None:
        """Batches commit as transactions of one producer per input partition (see
        :class:`PartitionTransactions`), initialised as partitions are assigned, before their
        tables are restored, and closed as they are revoked; the consumer reads committed
        records only and leaves the input offsets to the transactions."""
        self.transactions = PartitionTransactions(
            self.settings,
            app_id(self.service, self.settings),
            f"{self.service}-{self.settings.instance_id}",
            self.producer,
            service=self.service,
        )

    # -- tasks ---------------------------------------------------------------------------

    def task(self, topic: str, partition: int) -> Task:
        """The task of ``topic``'s ``partition`` (created when first asked for)."""
        key = (topic, partition)
        task = self.tasks.get(key)
        if task is None:
            task = self.tasks[key] = Task(self._by_topic[topic], topic, partition, self.faults)
        return task

    def _task_for(self, tp: TP) -> Task:
        """The task a fetched batch of ``tp`` goes to. Its partition's assignment created it; one
        fetched without (not seen so far) is taken for restored: Faust fetches a partition only
        once its tables are."""
        task = self.tasks.get((tp.topic, tp.partition))
        if task is None:
            log.warning("%s[%d]: a batch fetched before its assignment reached the engine", tp.topic, tp.partition)
            task = self.task(tp.topic, tp.partition)
            task.restore()
        return task

    async def _assigned(self, tps: set[TP]) -> None:
        """Before Faust recovers the tables: tasks of partitions no longer assigned are closed,
        those assigned are restoring; with exactly_once, each partition's producer is initialised."""
        mine = {(tp.topic, tp.partition) for tp in tps if tp.topic in self._by_topic}
        for key in [key for key in self.tasks if key not in mine]:
            self.tasks.pop(key).close()
        for topic, partition in sorted(mine):
            self.task(topic, partition).restore()
        if self.transactions is not None:
            await self.transactions.assign(sorted(mine))

    async def _revoked(self, tps: set[TP]) -> None:
        """Once the running batch is over: the revoked partitions' tasks are suspended."""
        for tp in tps:
            task = self.tasks.get((tp.topic, tp.partition))
            if task is not None:
                task.suspend()
        if self.transactions is not None:
            for tp in tps:  # the next owner's recovery restores what a failed commit left
                self._unsettled.pop((tp.topic, tp.partition), None)
            await self.transactions.revoke([(tp.topic, tp.partition) for tp in tps])

    def _restored(self) -> None:
        """The table recovery of the current assignment completed: its tasks run."""
        for task in self.tasks.values():
            task.restored()

    def tasks_in(self, *states: TaskState) -> list[Task]:
        return [task for task in self.tasks.values() if task.state in states]

    def _tasks_restoring(self) -> bool:
        return any(task.state in (TaskState.CREATED, TaskState.RESTORING) for task in self.tasks.values())

    def _task_clients(self) -> TaskClients:
        transactional = self.transactions is not None
        return TaskClients(
            producer=self.batch_producer,
            transactions=self.transactions,
            member=None if transactional else cast(BatchConsumer, self._faust_app.consumer).ensure_member,
            commit_timeout_s=TRANSACTION_COMMIT_TIMEOUT_S if transactional else None,
        )

    # -- running -------------------------------------------------------------------------

    def serve(self, api: FastAPI) -> None:
        """Serve ``api`` with uvicorn on the worker's event loop, once the worker runs."""
        serve_api(self._faust_app, api, self.settings, self.default_port)

    def run(self) -> None:
        """Run the worker in this process until SIGTERM/SIGINT."""
        run_worker(self._faust_app, self.service, self.settings)

    # -- declaring a service -------------------------------------------------------------

    def table(self, name: str, partitions: int | None = None, *, added_later: bool = False) -> DurableTable:
        """A raw-bytes table with a compacted changelog, written only through batches.

        ``added_later``: the table joins the ``offsets`` of a handler that deployments already
        run, and its rows of a batch can be rebuilt by the handler when lost (a cache of what
        was last sent, say): until its first batch, a partition resumes from the handler's other
        tables rather than from the log start (see :meth:`OrderedInput.next_offset`)."""
        table = self._faust_app.Table(
            name, partitions=partitions or self.settings.topic_partitions, key_type=bytes, value_type=bytes
        )
        return DurableTable(self._faust_app, table, added_later=added_later)

    def handler(
        self,
        *topics: str,
        name: str,
        offsets: DurableTable | Sequence[DurableTable] | None,
        dead_letters: DeadLetterRoute | None = None,
        internal_partitions: int | None = None,
        sends: Sequence[str] | None = None,
    ) -> Callable[[Handler], Handler]:
        """Register a batch handler for ``topics``.

        ``offsets`` are the tables that keep the input's next offset per partition: the tables
        the handler writes (each keeps a copy, the smallest wins), or one table of the same
        partition count for a handler that writes none. ``None`` for a stateless handler of a
        topic with any partition count: its records are delivered at least once (a replay is
        handed over again), and it writes no rows. ``internal_partitions`` declares the
        topics as the service's own (created with that partition count). ``sends`` names the
        topics the handler sends to, for :meth:`describe` (a topic named at run time by what
        names it, in angle brackets: ``"<dlq.retry.topic>"``); its dead-letter route's topic is
        added. The topology driver checks that a handler that declared them sends nowhere else.
        """

        def register(fn: Handler) -> Handler:
            for topic in topics:
                if topic in self._by_topic:
                    raise ValueError(f"topic {topic!r} already has the handler {self._by_topic[topic].name!r}")
            channel = self._faust_app.topic(
                *topics,
                key_type=bytes,
                value_type=bytes,
                partitions=internal_partitions,
                internal=internal_partitions is not None,
            )
            self._faust_app.topics.add(channel)
            reg = Registration(
                name=f"{self.service}.{name}",
                stream=name,
                service=self.service,
                topics=tuple(topics),
                handle=fn,
                order=(
                    OrderedInput(
                        self._faust_app,
                        offsets,
                        self.backfill,
                        read_committed=True,
                        service=self.service,
                        input_ids=self._input_id,
                    )
                    if offsets is not None
                    else None
                ),
                dead_letters=dead_letters,
                sends=(
                    tuple(dict.fromkeys([*sends, *([dead_letters.topic] if dead_letters is not None else [])]))
                    if sends is not None
                    else None
                ),
                internal_partitions=internal_partitions,
            )
            self._handlers.append(reg)
            for topic in topics:
                self._by_topic[topic] = reg
                if internal_partitions is not None:
                    self._internal_topics[topic] = internal_partitions
            self.delivery.batch_topics = frozenset(self._by_topic)
            self.delivery.lanes = self._lanes()
            return fn

        return register

    def describe(self) -> Topology:
        """The service's topology as its registrations declare it (see ``shared/engine/_topology.py``)."""
        lanes = self._lanes()
        tables = {
            str(table.name): table.partitions or self.settings.topic_partitions for table in self._faust_app.tables.values()
        }
        return Topology(
            service=self.service,
            tables=tuple(sorted(tables.items())),
            handlers=tuple(
                HandlerNode(
                    name=reg.name,
                    lane=lanes[reg.topics[0]],
                    sources=reg.topics,
                    tables=tuple(str(getattr(store, "name", store)) for store in reg.order.stores)
                    if reg.order is not None
                    else (),
                    sinks=reg.sends,
                    internal_partitions=reg.internal_partitions,
                )
                for reg in self._handlers
            ),
        )

    def _input_id(self, topic: str) -> str | None:
        """``topic``'s topic id as the brokers last reported it to this worker (None: not known)."""
        incarnation = incarnation_of(self._faust_app, topic)
        return incarnation.topic_id if incarnation is not None else None

    def internal_topic_specs(self) -> list[TopicSpec]:
        """The topics the service owns: those its handlers were registered for as internal, and
        its tables' changelogs (see :func:`faust_topic_specs`), to create before the worker starts."""
        return [
            *(TopicSpec(topic, partitions) for topic, partitions in self._internal_topics.items()),
            *faust_topic_specs(self._faust_app, self.settings),
        ]

    @property
    def registrations(self) -> tuple[Registration, ...]:
        """The handlers registered so far, in order (for the topology driver)."""
        return tuple(self._handlers)

    def registration_for(self, topic: str) -> Registration | None:
        """The handler that reads ``topic``, if one does."""
        return self._by_topic.get(topic)

    def _lanes(self) -> dict[str, int]:
        """Topic → lane: handlers that write a common table share a lane; every other pair of
        handlers may run at once on the same partition number (see :class:`BatchConsumer`)."""
        lane_of: dict[int, int] = {}  # handler index → lane (the smallest index of its group)
        for i, reg in enumerate(self._handlers):
            lane_of[i] = i
            tables = set(reg.order.stores) if reg.order is not None else set()
            for j in range(i):
                other = self._handlers[j].order
                if other is not None and tables & set(other.stores):
                    merged, into = lane_of[i], lane_of[j]
                    lane_of = {k: into if lane == merged else lane for k, lane in lane_of.items()}
        return {topic: lane_of[i] for i, reg in enumerate(self._handlers) for topic in reg.topics}

    async def wait_applied(self, topic: str, partition: int, timeout_s: float) -> bool:
        """Wait until every record ``topic``'s ``partition`` holds now is in this instance's tables
        (True), or ``timeout_s`` has passed (False). For reads that must see what a record already
        visible elsewhere implies: the handler's rows land a moment after the records sent with them."""
        reg = self._by_topic.get(topic)
        if reg is None or reg.order is None:
            raise ValueError(f"{topic!r} has no handler that keeps its next offsets")
        order = reg.order
        end = await self.backfill.log_end(topic, partition)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        checked: int | None = None
        while (settled := order.settled_offset(topic, partition) or 0) < end:
            if loop.time() >= deadline:
                return False
            if order.read_committed and settled != checked and end - settled <= MARKERS_CHECKED:
                # Reading committed records only, the end is one past the last transaction's
                # marker, an offset no record of which is ever processed: what is left may be
                # only markers (or aborted records), which one read-back tells.
                checked = settled
                if await order.confirm_empty(topic, partition, settled, end):
                    return True
                continue
            await asyncio.sleep(APPLIED_POLL_S)
        return True

    def watch_trailing_holes(self) -> None:
        """Look for input records skipped at a partition's end (see :mod:`shared.engine._trailing_holes`)."""
        self._trailing_holes = TrailingHoleWatch(
            self._faust_app,
            self.service,
            {topic: reg.order for topic, reg in self._by_topic.items() if reg.order is not None},
            self.settings.trailing_hole_check_s,
        )

    def timer(self, interval_s: float, name: str) -> Callable[[Callable[[], Awaitable[None]]], Any]:
        """Run a coroutine every ``interval_s`` on the worker's loop (not for table writes).

        An exception out of one run is logged and the next run comes as usual: Faust would
        crash the whole worker over it, and what a timer does (publish, send ticks) is done
        again by its next run, while a crash stops every partition (the broker away for a
        moment was enough)."""
        timer: Callable[[Callable[[], Awaitable[None]]], Any] = self._faust_app.timer(interval_s, name=f"{self.service}.{name}")

        def register(fn: Callable[[], Awaitable[None]]) -> Any:
            self.timers.append(Timer(name, interval_s, fn))

            async def run() -> None:
                try:
                    await fn()
                except Exception as exc:
                    log.warning(
                        "%s timer %r failed (runs again in %.1fs): %s: %s",
                        self.service,
                        name,
                        interval_s,
                        type(exc).__name__,
                        exc,
                    )

            run.__name__ = run.__qualname__ = f"{self.service}_{name}_timer"
            return timer(run)

        return register

    def ticker(self, topic: str, value: bytes, *, interval_s: float, name: str) -> Ticker:
        """Tick records of ``value`` for the handler of ``topic``, at most one in flight per
        partition (see ``shared/engine/_ticks.py``); a timer sends them with
        :meth:`Ticker.send_to`, the handler says :meth:`Ticker.taken` when one arrives."""
        return Ticker(lambda: self.send, topic, value, interval_s=interval_s, name=name, clock=lambda: self.clock())

    def on_recovered(self, table: DurableTable, callback: Callable[[], Awaitable[None]]) -> None:
        """Call ``callback`` each time ``table``'s partitions are restored after a rebalance."""
        table.table.on_recover(callback)

    # -- sending -------------------------------------------------------------------------

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        *,
        headers: Sequence[tuple[str, bytes]] | None = None,
        partition: int | None = None,
    ) -> None:
        """Send one record and wait for its acknowledgement (outside batches: timers, HTTP)."""
        await self.send_all([Outgoing(topic, key, value, headers, partition)])

    async def send_all(self, records: Sequence[Outgoing]) -> None:
        """Send records and wait until every one is acknowledged (the first failure raises)."""
        await self.producer.send(records, f"{self.service}: {len(records)} records")

    async def deliver_each(self, records: Sequence[Outgoing], timeout_s: float) -> list[str | None]:
        """Send the records and wait (bounded) for the acknowledgements: per record, ``None``
        when acknowledged or the error (unknown topic, too large, no answer in time), each
        record's own (see :meth:`BatchProducer.deliver_each`). For sends whose failure is an
        outcome to record, not a reason to stop."""
        return await self.producer.deliver_each(records, timeout_s)

    @property
    def transactional(self) -> bool:
        """Whether each batch commits as one Kafka transaction (records staged with
        :meth:`InputBatch.send` go out in it; :meth:`send` and :meth:`deliver_each` do not)."""
        return self.transactions is not None

    async def unsendable(self, records: Sequence[Outgoing], timeout_s: float) -> list[str | None]:
        """Per record, why it cannot be staged on a batch (unknown topic, too large), or ``None``:
        for handlers that give such a record another fate rather than abort their batch."""
        return await self.producer.unsendable(records, timeout_s)

    # -- the hand-over -------------------------------------------------------------------

    async def _deliver(self, tp: TP, fetched: Sequence[Any], continues_from: int | None = None) -> None:
        """Process and commit one fetched batch of ``tp``; a commit that fails on the brokers'
        side is retried, with backoff, while the partition is still this consumer's (see
        :mod:`shared.engine._retry`). Raises :class:`NotAMember` when it no longer is."""
        reg = self._by_topic[tp.topic]
        failures = 0
        while True:
            try:
                if (tp.topic, tp.partition) in self._unsettled:
                    await self._settle(tp)
            except (NotAMember, WriteRefused):
                raise
            except Exception as exc:
                if not broker_failure(exc, transactional=self.transactions is not None):
                    raise  # the worker stops as for any other failure
                cause: BaseException = exc  # the fresh producer or the restore failed: try again
            else:
                try:
                    await self._deliver_once(reg, tp, fetched, continues_from)
                    return
                except _CommitFailed as failed:
                    cause = failed.__cause__ or failed
            failures += 1
            delay = retry_delay_s(failures)
            BATCH_RETRIES.labels(self.service, retry_reason(cause)).inc()
            log.warning(
                "%s: %s[%d] offsets %d..%d not committed (%s: %s); delivering them again in %.1fs (try %d)",
                reg.name,
                tp.topic,
                tp.partition,
                fetched[0].offset,
                fetched[-1].offset,
                type(cause).__name__,
                cause,
                delay,
                failures + 1,
            )
            await asyncio.sleep(delay)  # a broker's restart or a leader's election takes seconds
            # Only while the partition is still ours: otherwise NotAMember sends the consumer back
            # to the batch's first offset and nothing is initialised again, so a consumer that lost
            # the partition never fences its new owner.
            await self._ensure_owner(tp)

    async def _ensure_owner(self, tp: TP) -> None:
        await cast(BatchConsumer, self._faust_app.consumer).ensure_owner(tp)

    async def _deliver_once(self, reg: Registration, tp: TP, fetched: Sequence[Any], continues_from: int | None) -> None:
        """One delivery of a fetched batch through its task (:meth:`Task.process`). A broker
        failure of the read-back or the commit raises :class:`_CommitFailed`; any other failure
        stops the worker."""
        # aiokafka's records are handed over as they are: they have every field a handler reads.
        records = cast(Sequence[InRecord], fetched)
        transactional = self.transactions is not None
        try:
            await self._task_for(tp).process(records, self._task_clients(), continues_from)
        except NotAMember:
            raise  # nothing more of the batch is written; the consumer fetches it again
        except StepFailed as failed:
            exc = cast(BaseException, failed.__cause__)
            if failed.step == "read" and broker_failure(exc, transactional=transactional):
                raise _CommitFailed("reading skipped input records back failed") from exc
            if failed.step != "commit":
                await self._stop_worker(reg, tp, fetched, exc)  # the handler's own failure
                raise exc from None
            if isinstance(exc, WriteRefused):
                raise NotAMember(str(exc)) from exc
            denial = explain_denial(exc, self.settings.kafka_sasl_username, app_id(self.service, self.settings), reading=False)
            if denial is not None or not broker_failure(exc, transactional=transactional):
                await self._stop_worker(reg, tp, fetched, exc, denial)
                raise exc from None
            assert failed.batch is not None
            await self._leave_unsettled(reg, tp, failed.batch)
            raise _CommitFailed(f"{reg.name}: the commit failed") from exc

    async def _leave_unsettled(self, reg: Registration, tp: TP, batch: InputBatch) -> None:
        """exactly_once: the batch's transaction may or may not have committed. Its producer is
        closed, and the partition is marked for :meth:`_settle` before its next delivery; the
        table partitions the transaction wrote are the ones to restore."""
        if self.transactions is None:
            return
        touched = self._unsettled.setdefault((tp.topic, tp.partition), set())
        stores = reg.order.stores if reg.order is not None else ()
        touched.update(TablePartition(store, tp.partition) for store in stores if isinstance(store, DurableTable))
        touched.update(TablePartition(table, partition) for table, rows in batch.rows.items() for partition, _ in rows)
        await self.transactions.discard(tp.topic, tp.partition, RETRY_STEP_TIMEOUT_S)

    async def _settle(self, tp: TP) -> None:
        """exactly_once, before a partition whose last commit failed is delivered again: a fresh
        transactional producer (the old transaction completed or aborted), then the local table
        partitions that transaction wrote brought up to their changelogs' committed end, so that
        :class:`OrderedInput` drops the records it applied if it did commit."""
        assert self.transactions is not None
        key = (tp.topic, tp.partition)
        await self.transactions.renew(tp.topic, tp.partition, RETRY_STEP_TIMEOUT_S)
        touched = self._unsettled[key]
        targets = {TopicPartition(target.table.changelog, target.partition): target for target in touched}
        applied = 0
        if targets:  # a handler that writes no table has nothing to restore
            async with asyncio.timeout(RETRY_STEP_TIMEOUT_S), self._restoring:
                applied = (await self.changelogs.restore(targets, min_lag=1)).records
        del self._unsettled[key]
        if applied:
            # The transaction did commit: what its after-commit callbacks would have derived in
            # memory is rebuilt from the rows, as after a rebalance's recovery.
            log.info(
                "%s[%d]: the failed commit had landed; %d changelog records applied locally", tp.topic, tp.partition, applied
            )
            for table in {target.table for target in touched}:
                await table.table.call_recover_callbacks()

    async def _stop_worker(
        self, reg: Registration, tp: TP, fetched: Sequence[Any], exc: BaseException, denial: str | None = None
    ) -> None:
        """Nothing of the batch is committed: stop the worker, so that it (or the instance taking
        its partitions) reads the batch again, rather than go on past it."""
        log.error(
            "%s failed on %s[%d] offsets %d..%d; stopping the worker",
            reg.name,
            tp.topic,
            tp.partition,
            fetched[0].offset,
            fetched[-1].offset,
            exc_info=exc,
        )
        if denial is None:
            denial = explain_denial(exc, self.settings.kafka_sasl_username, app_id(self.service, self.settings), reading=False)
        if denial is not None:
            log.error("%s cannot go on: %s", self.service, denial)
        await self._faust_app.crash(exc)


def _table_names(order: OrderedInput | None) -> tuple[str, ...]:
    return tuple(str(getattr(store, "name", store)) for store in order.stores) if order is not None else ()


class _CommitFailed(Exception):
    """A batch's commit (or the read-back before its handler) failed on the brokers' side; its
    cause is the client's error. The batch is delivered again (see :meth:`Engine._deliver`)."""


def faust_app(engine: Engine) -> faust.App:
    """The Faust app an engine runs (for the topology driver, which runs its handlers without it)."""
    return engine._faust_app  # noqa: SLF001 (this module's own class)
