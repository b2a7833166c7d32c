"""Faust and aiokafka as the engine uses them: the one module that reaches into their private parts.

Faust does not expose a table partition's RocksDB handle, its consumer's group coordinator
and heartbeat, the construction of its worker consumer and thread, its fetch loop and
per-record bookkeeping (which the batch hand-over replaces for the engine's inputs), or its
recovery's reads of changelog ends (where the bulk restore runs); aiokafka's consumer does
not expose its cluster client (its metadata, a request to one broker). Those 14 private names
are reached here and only here, as plain functions and as ``*Hooks`` base classes that turn
each private step the engine overrides into a public method whose default is Faust's own
step. If an upgrade of Faust or aiokafka moves one of them, this is the only module to change
(``_versions`` checks the supported ranges; ruff's SLF001 is off for this module alone).
Everything else the engine needs of them it reaches by their public API: the worker's aiokafka
consumer is built with aiokafka's constructor, offsets are committed through Faust's
``force_commit`` and the consumer thread's ``commit``, the table manager's recovery service
and its start are public methods overridden.

Nothing is patched for the whole process: the app's consumer class comes through Faust's
public transport registry (:class:`Transport`), and the producers keep their topics' metadata
with aiokafka's public ``add_topic`` (``shared/engine/_producer.py``).

What it offers, by concern:

* tables and stores: a partition's RocksDB database, its rows in key order;
* assignment: owned partitions, the owner of each, the group's members;
* recovery: done or not, and what the consumer holds for a changelog partition;
* group membership: the coordinator (heartbeats, rejoin), a request to one broker;
* the consumer, recovery, table manager, assignor, app and worker hooks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, MutableMapping
from typing import Any, NoReturn, TextIO, cast

import faust
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.client import AIOKafkaClient
from faust.tables.manager import TableManager
from faust.tables.recovery import RebalanceAgain, Recovery
from faust.transport.drivers import TRANSPORTS
from faust.transport.drivers import aiokafka as aiokafka_driver
from faust.types import TP, ConsumerT, TableT
from mode.utils.times import Seconds
from rocksdict import Rdict

from shared.engine._context import AppContext

log = logging.getLogger(__name__)

AnyTable = TableT[Any, Any]

#: Faust keeps each partition's committed offset under this key (in the partition database's
#: engine family, see :mod:`shared.engine._rocksdb`).
FAUST_OFFSET_KEY = b"__faust\x00offset__"


def partition_db(table: AnyTable, partition: int) -> Rdict:
    """The RocksDB database (rocksdict) holding one partition of a table."""
    return store_partition_db(cast(Any, table).data, partition)


def store_partition_db(store: Any, partition: int) -> Rdict:
    """The RocksDB database (rocksdict) of one partition of a table's RocksDB store (opened if need be)."""
    return cast(Rdict, store._db_for_partition(partition))


def partition_items(
    table: AnyTable, partition: int, from_key: bytes | None = None, backwards: bool = False
) -> Iterator[tuple[bytes, bytes]]:
    """A partition's rows (its default column family: the service's rows) in key order (or
    reverse), from ``from_key``."""
    db = partition_db(table, partition)
    items = db.items(from_key=from_key, backwards=backwards) if from_key is not None else db.items(backwards=backwards)
    for key, value in items:
        yield cast(bytes, key), cast(bytes, value)


def recovery_done(app: faust.App) -> bool:
    """True once table recovery after the last rebalance has finished."""
    recovery = cast(Any, app.tables).recovery
    return bool(recovery.completed.is_set()) and not recovery.in_recovery and not app.rebalancing


def consumer_thread(app: faust.App) -> ConsumerThreadHooks:
    """Faust's thread that runs the worker consumer's aiokafka consumer and group coordinator."""
    consumer = app.consumer
    if not isinstance(consumer, ConsumerHooks):
        raise TypeError(f"the app's consumer is Faust's own {type(consumer).__name__}, not the engine's")
    return consumer.thread


def consumer_coordinator(app: faust.App) -> Any | None:
    """The worker consumer's aiokafka group coordinator, which lives on the consumer thread's
    loop (None before the consumer has started)."""
    try:
        return consumer_thread(app).coordinator
    except Exception as exc:  # not started, or stopping
        log.debug("no group coordinator: %r", exc)
        return None


def request_rejoin(app: faust.App) -> bool:
    """Have the worker's consumer rejoin its group now (False if it has not started).

    aiokafka's group coordinator runs on the consumer thread's loop, so the request is
    handed to that loop."""
    coordinator = consumer_coordinator(app)
    if coordinator is None:
        return False
    try:
        consumer_thread(app).thread_loop.call_soon_threadsafe(coordinator.request_rejoin)
    except Exception as exc:  # stopping
        log.debug("no rejoin: %r", exc)
        return False
    return True


def print_thread_loop_tasks(app: faust.App, file: TextIO) -> None:
    """Write the stack of every task on the consumer thread's event loop (aiokafka's group
    coordinator, its fetcher, and the calls Faust hands to that thread) to ``file``."""
    try:
        loop = consumer_thread(app).thread_loop
    except Exception as exc:  # not started
        print(f"no consumer thread loop: {exc!r}", file=file)
        return
    for attempt in range(3):  # the set of tasks may change while it is read from this thread
        try:
            tasks = list(asyncio.all_tasks(loop))
            break
        except RuntimeError:
            if attempt == 2:
                print("the consumer thread's tasks could not be listed", file=file)
                return
    print(f"CONSUMER THREAD LOOP: {len(tasks)} TASKS", file=file)
    for task in tasks:
        print(f"  TASK {task!r}", file=file)
        task.print_stack(file=file)
    file.flush()


# -- aiokafka: clients, brokers, metadata -------------------------------------------------------


def kafka_client(consumer: AIOKafkaConsumer) -> AIOKafkaClient:
    """The cluster client of an aiokafka consumer (metadata, requests to brokers)."""
    return cast(AIOKafkaClient, consumer._client)


def coordinator_client(coordinator: Any) -> AIOKafkaClient:
    """The cluster client of an aiokafka group coordinator."""
    return cast(AIOKafkaClient, coordinator._client)


async def consumer_partition_state(app: faust.App, tp: TP, timeout_s: float = 1.0) -> str:
    """What the worker's consumer holds for ``tp``: its position and pause (aiokafka's, asked on
    the consumer thread) and Faust's read offset, for a log line about a recovery that does not move."""
    thread = consumer_thread(app)
    client = thread.client
    if client is None:
        return "the consumer has not started"
    ktp = KafkaTopicPartition(tp.topic, tp.partition)

    async def ask() -> str:
        if ktp not in client.assignment():
            return "not assigned to the consumer"
        try:
            position: int | str = await asyncio.wait_for(client.position(ktp), timeout_s)
        except TimeoutError:
            position = "not known yet"
        return f"consumer position {position}, paused {ktp in client.paused()}"

    state = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(ask(), thread.thread_loop))
    return f"{state}, read offset {cast(ConsumerHooks, app.consumer).read_offsets.get(tp)}"


# -- hooks: Faust's private steps the engine replaces, under public names ------------------------
#
# Each ``*Hooks`` class overrides the private steps of one Faust class and calls a public method
# in their place, whose default is Faust's own step; the engine's subclasses override the public
# method (and call ``super()`` for Faust's behaviour). The engine's classes define no method
# with a private name of Faust's (a unit test checks it).


class ConsumerThreadHooks(aiokafka_driver.AIOKafkaConsumerThread):
    """Faust's consumer thread (it runs aiokafka's consumer and group coordinator on a loop of
    its own), with the aiokafka consumer it creates and its coordinator reachable."""

    #: The worker's aiokafka consumer, as this thread created it last (None before it starts).
    client: AIOKafkaConsumer | None = None

    def _create_worker_consumer(self, transport: Any) -> AIOKafkaConsumer:
        self.client = self.create_worker_client(transport)
        return self.client

    def create_worker_client(self, transport: Any) -> AIOKafkaConsumer:
        """The worker's aiokafka consumer, not started (Faust's: built from the app's settings)."""
        return cast(AIOKafkaConsumer, super()._create_worker_consumer(transport))

    @property
    def coordinator(self) -> Any | None:
        """aiokafka's group coordinator of the worker's consumer (None before it starts, or
        without a group)."""
        client = self.client
        return None if client is None else client._coordinator

    def wrap_heartbeat(self, wrap: Callable[[Callable[[], Awaitable[bool]]], Callable[[], Awaitable[bool]]]) -> None:
        """Replace the coordinator's heartbeat (True: the coordinator knows this member) with
        ``wrap(heartbeat)``; the coordinator's heartbeat loop and :meth:`heartbeat` then call it."""
        coordinator = self.coordinator
        if coordinator is not None:
            coordinator._do_heartbeat = wrap(coordinator._do_heartbeat)

    def heartbeat(self) -> Coroutine[Any, Any, bool]:
        """One heartbeat (a coroutine for the consumer thread's loop): True when the coordinator
        knows this member and its generation."""
        return cast(Coroutine[Any, Any, bool], self.coordinator._do_heartbeat())  # type: ignore[union-attr]


class ConsumerHooks(aiokafka_driver.Consumer):
    """Faust's aiokafka consumer, with the steps the engine replaces under public names."""

    #: The consumer thread class (Faust's :class:`ConsumerThreadHooks` unless a subclass says so).
    thread_class: type[ConsumerThreadHooks] = ConsumerThreadHooks
    #: The thread that runs this consumer's aiokafka consumer and group coordinator.
    thread: ConsumerThreadHooks

    def _new_consumer_thread(self) -> aiokafka_driver.AIOKafkaConsumerThread:
        self.thread = self.thread_class(self, loop=self.loop, beacon=self.beacon)
        return self.thread

    async def _drain_messages(self, fetcher: Any) -> None:
        await self.drain_fetched(fetcher)

    # -- the steps, Faust's by default ------------------------------------------------------

    async def drain_fetched(self, fetcher: Any) -> None:
        """The fetch loop: take fetched records and hand them on until the consumer stops."""
        await super()._drain_messages(fetcher)

    # -- Faust's per-record state and steps, for a fetch loop of one's own ----------------

    def stopped(self, fetcher: Any) -> Callable[[], bool]:
        """A check of whether this consumer or ``fetcher`` (Faust's fetcher service) has stopped."""
        return lambda: self.should_stop or bool(fetcher.should_stop)

    async def next_records(self, wait_s: float) -> tuple[Mapping[TP, list[Any]] | None, set[TP] | None]:
        """The next fetched records per partition, and the partitions active meanwhile."""
        return await self._wait_next_records(wait_s)

    @property
    def read_offsets(self) -> MutableMapping[TP, int | None]:
        """Per partition, the offset of the last record handed on (Faust's acknowledgement bookkeeping)."""
        return self._read_offset

    @property
    def buffered_partitions(self) -> set[TP]:
        return self._buffered_partitions

    def to_message(self, tp: TP, record: Any) -> Any:
        """Faust's message for a fetched aiokafka record."""
        return self._to_message(tp, record)

    async def add_gap(self, tp: TP, offset_from: int, offset_to: int) -> None:
        """Note offsets that held no record, so the committed offset can move past them."""
        await self._add_gap(tp, offset_from, offset_to)


class RecoveryHooks(Recovery):
    """Faust's table recovery service, with its reads of changelog offsets under public names."""

    async def _build_highwaters(self, consumer: ConsumerT, tps: set[TP], destination: Any, title: str) -> None:
        await self.build_highwaters(consumer, tps, destination, title)

    async def _build_offsets(self, consumer: ConsumerT, tps: set[TP], destination: Any, title: str) -> None:
        await self.build_offsets(consumer, tps, destination, title)

    async def build_highwaters(self, consumer: ConsumerT, tps: set[TP], destination: Any, title: str) -> None:
        """Read the end offsets of changelog partitions ``tps`` into ``destination`` (Faust
        reads the actives' ``title="active"`` first, then the standbys')."""
        await super()._build_highwaters(consumer, tps, destination, title)

    async def build_offsets(self, consumer: ConsumerT, tps: set[TP], destination: Any, title: str) -> None:
        """Read the earliest offsets of changelog partitions ``tps`` into ``destination``."""
        await super()._build_offsets(consumer, tps, destination, title)

    def run_steps_again(self) -> NoReturn:
        """End the running recovery step and have Faust's recovery task run its steps again from
        the first, as it does when a new rebalance comes (with the same assignment and
        generation): its recovery signal is set, and the step raises Faust's "rebalance again",
        which the task answers by starting over once the signal is set."""
        self.signal_recovery_start.set()
        raise RebalanceAgain()


class TableManagerHooks(TableManager):
    """Faust's table manager, with the class of its recovery service to choose."""

    recovery_class: type[Recovery] = Recovery

    async def sleep(self, n: Seconds) -> None:
        # The table manager's one sleep is the second Faust waits at its start, for tables
        # declared after the app starts. A service declares every table before, and the second
        # delayed each start, restart and failover on its way to Ready. A table added later
        # still fails loudly ("Too late to add tables").
        return None

    #: The recovery service, of :attr:`recovery_class` (built on first use, as Faust builds its own).
    recovery_service: Recovery | None = None

    @property
    def recovery(self) -> Recovery:
        if self.recovery_service is None:
            self.recovery_service = self.recovery_class(self.app, self, beacon=self.beacon, loop=self.loop)
        return self.recovery_service

    async def on_stop(self) -> None:
        # Faust stops the recovery service it would have built itself; this one is stopped here,
        # before Faust stops the fetcher and the tables: its last buffered changelog records go
        # into the tables while they are open. Records fetched after that are not applied and
        # not counted as applied (the partition's persisted offset), so the next start reads
        # them again.
        if self.recovery_service is not None:
            await self.recovery_service.stop()
        await super().on_stop()


class AppHooks(faust.App):
    """A Faust app whose consumer is of :attr:`consumer_class`, built with :meth:`consumer_options`
    (its brokers' URLs name :data:`TRANSPORT_SCHEME`, whose transport asks the app for both)."""

    consumer_class: type[ConsumerHooks] = ConsumerHooks
    #: The engine's context of this app (see ``shared/engine/_context.py``).
    engine_context: AppContext | None = None

    def consumer_options(self) -> dict[str, Any]:
        """Keyword arguments for the consumer, besides Faust's own."""
        return {}


class Transport(aiokafka_driver.Transport):
    """Faust's aiokafka transport, whose consumer is the app's :attr:`AppHooks.consumer_class`.

    Faust builds its consumer with the transport's public ``create_consumer``; an app that is
    not an :class:`AppHooks` gets Faust's own."""

    def create_consumer(self, callback: Any, **kwargs: Any) -> ConsumerT:
        app = self.app
        if not isinstance(app, AppHooks):
            return super().create_consumer(callback, **kwargs)
        return app.consumer_class(self, callback=callback, loop=self.loop, **kwargs, **app.consumer_options())


#: The scheme of the brokers' URLs of an engine's app: Faust's aiokafka transport with the app's
#: consumer (Faust's transport registry, as ``kafka://`` names Faust's own).
TRANSPORT_SCHEME = "statefleet-kafka"
TRANSPORTS.aliases[TRANSPORT_SCHEME] = f"{__name__}:Transport"
