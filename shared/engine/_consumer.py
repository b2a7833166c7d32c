"""The consumer that hands whole per-partition batches to handlers.

Faust's own consumer turns every fetched record into a message, awaits a callback for
it (several tasks and an ``asyncio.wait`` each), puts an event on a channel queue and
lets a stream take it off again: about 90 µs a record before any handler
code runs. :class:`BatchConsumer` keeps everything else of Faust's consumer (group
membership, the fetcher thread, pausing during recovery, periodic commits) and replaces
only that hand-over, for the topics the engine registered: each fetched
``TopicPartition``'s record list goes to one awaited call of the engine's deliver
function. Records of other topics (changelogs read during recovery) keep Faust's path
unchanged.

What it owns, since Faust's bookkeeping never sees these records:

* **Offsets.** After a batch is delivered, the partition's next offset to commit is
  its last offset + 1; :meth:`force_commit` commits it after Faust's own (periodic,
  at revocation, at stop) under at_least_once.
* **No batch for a partition that is not ours.** Before each delivery it re-checks that
  flow is active, the consumer generation has not changed and the partition is still
  assigned and not paused; otherwise the consumer is sent back to the batch's first
  offset, so nothing fetched is dropped (Faust itself drops such records and seeks to
  the committed offset, which a partition never committed does not have).
* **Lag.** Every :data:`LAG_EVERY_S` it sets ``statefleet_consumer_lag_records`` per input
  topic from what the consumer already knows (each assigned partition's high watermark as
  last fetched, minus the last offset handed on): no request, nothing per record.
* **Revocation.** Faust waits for ``wait_empty()`` before giving partitions up; that
  wait includes the running batch. The revoked partitions' delivered offsets are then
  committed, so a rebalance does not make the next owner re-read work already done.
* **No batch from a member the group may have dropped.** A process that was stopped or
  frozen (SIGSTOP, a paused VM, a network partition) comes back with records it fetched
  before, and its event loop can hand them over before the consumer thread's next
  heartbeat learns that the group removed this member meanwhile and gave its partitions to
  another. Such a batch would write rows computed from a stale copy to a changelog
  partition that the new owner writes too, and the acknowledged changelog offset, which is
  past the new owner's records, into the local database: the local copy then claims to be
  up to date with rows it never read, and the next recovery of that partition here skips
  them (stale rows served and processed on). So a batch is handed over only while the
  coordinator has recognised this member recently (:data:`MEMBER_CONFIRMED_WITHIN_S`, kept
  fresh by the heartbeats of the consumer thread, which a busy event loop does not hold
  up); after a longer silence one heartbeat is sent first, and when the member is no longer
  known (or no answer comes) the batch is left unfetched, for whoever owns it after the
  rebalance that follows.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from aiokafka import AIOKafkaConsumer
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.protocol.group import JoinGroupRequest
from faust.exceptions import ImproperlyConfigured
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth, server_list
from faust.types import TP
from mode import Service

from shared.engine._access import explain_denial
from shared.engine._clients import ISOLATION_LEVEL
from shared.engine._faust import ConsumerHooks, ConsumerThreadHooks
from shared.metrics import CONSUMER_LAG

log = logging.getLogger(__name__)

#: Called with one partition, its fetched records (aiokafka ``ConsumerRecord``s) in offset order,
#: and the offset right after the record this consumer handed over last for that partition when
#: these records continue from it (None when that is not known: see :meth:`BatchConsumer.drain_fetched`).
Deliver = Callable[[TP, Sequence[Any], int | None], Awaitable[None]]

#: Longest wait for the commit of revoked partitions' offsets (a failed commit only costs a re-read).
REVOKE_COMMIT_TIMEOUT_S = 5.0

#: A batch is handed over without asking the coordinator first when it recognised this member
#: this recently. Heartbeats (every 0.5 s at most) keep it fresh while the process runs; only a
#: process that was not running at all (stopped, frozen) or cut off from the broker goes past it.
#: A removal by the peer watch or by the session timeout takes longer than that to happen.
MEMBER_CONFIRMED_WITHIN_S = 6.0

#: Longest wait for the heartbeat that confirms this member before a batch.
MEMBER_CONFIRM_TIMEOUT_S = 5.0

#: A produce request of a batch's commit leaves without asking the coordinator first when it
#: recognised this member this recently (see :meth:`BatchConsumer.may_write`). Shorter than
#: :data:`MEMBER_CONFIRMED_WITHIN_S`: it is checked at the last moment a write can be held
#: back, so it is what stands between a process that froze and a changelog partition that
#: another member took over meanwhile (a removal, a rebalance and a restore take longer).
WRITE_CONFIRMED_WITHIN_S = 1.5

#: How often the consumer lag gauge is set (a scrape reads what it was set to last).
LAG_EVERY_S = 5.0

#: The consumer generation the batch being delivered (in this task) was fetched in.
_BATCH_GENERATION: contextvars.ContextVar[int] = contextvars.ContextVar("batch_generation")


def lag_by_topic(
    topics: Iterable[str], assigned: Iterable[TP], highwater: Callable[[TP], int | None], last_read: Callable[[TP], int | None]
) -> dict[str, int]:
    """Per topic of ``topics``, the records of its ``assigned`` partitions after the last one
    read: ``highwater`` (one past the partition's last offset) minus ``last_read`` + 1, summed.
    A partition with either unknown (not fetched yet) counts 0; so does every topic none of
    whose partitions are assigned. Read committed, a transaction's marker at a partition's end
    counts as one record (the consumer never reads it)."""
    lags = dict.fromkeys(topics, 0)
    for tp in assigned:
        if tp.topic not in lags:
            continue
        end, last = highwater(tp), last_read(tp)
        if end is not None and last is not None:
            lags[tp.topic] += max(0, int(end) - int(last) - 1)
    return lags


class NotAMember(Exception):
    """The group may no longer count this consumer as the member that fetched the batch being
    committed: nothing more of it is written (see the module docs), and it is fetched again."""


@dataclass
class Delivery:
    """What the engine gives its worker's consumer (:class:`BatchConsumer`): where fetched batches
    go and how. One per engine, passed to the consumer as Faust builds it."""

    #: Takes each fetched batch of :attr:`batch_topics` (set before the worker starts).
    deliver: Deliver | None = None
    #: The topics whose records go to :attr:`deliver`, a partition's fetch at a time.
    batch_topics: frozenset[str] = frozenset()
    #: Topic → lane: batches of one partition number run side by side when their lanes differ
    #: (their handlers write no common table), in turn when they are the same.
    lanes: dict[str, int] = field(default_factory=dict)
    #: aiokafka's ``fetch_max_wait_ms`` for the worker's consumer (see :class:`_ConsumerThread`).
    fetch_max_wait_ms: int = 1500
    #: With exactly_once: read committed records only, and leave the offsets of ``batch_topics``
    #: to the batches' transactions (Faust's periodic commits and the revocation commit skip
    #: them: an offset committed outside the transaction could run ahead of the state).
    exactly_once: bool = False
    #: Awaited with the newly assigned partitions before Faust acts on them (table recovery
    #: included), and with the revoked ones once their running batch is over.
    on_assigned: Callable[[set[TP]], Awaitable[None]] | None = None
    on_revoked: Callable[[set[TP]], Awaitable[None]] | None = None
    #: The ``service`` label of the consumer lag gauge (not set: no gauge).
    service: str = ""


class _ConsumerThread(ConsumerThreadHooks):
    """Faust's consumer thread with the worker's fetch wait from the settings.

    aiokafka keeps one fetch request per broker in flight. Faust asks the broker to hold a
    fetch up to 1.5 s when the partitions in it have no new records, and a partition whose
    records were handed over meanwhile is fetched again only after that: a batch that
    finished while the rest of the partitions were idle waited up to 1.5 s for its next
    records (seen as pauses of 1.5 s in the tally workload's progress)."""

    consumer: BatchConsumer

    #: When the group coordinator last recognised this member (a heartbeat answered for its
    #: generation), on the monotonic clock; 0.0 before the first one.
    member_confirmed_at: float = 0.0

    async def on_start(self) -> None:
        await super().on_start()
        # Runs on the consumer thread's loop, as the coordinator's heartbeats do.
        self.wrap_heartbeat(self._recorded)

    def _recorded(self, heartbeat: Callable[[], Awaitable[bool]]) -> Callable[[], Awaitable[bool]]:
        async def recorded_heartbeat() -> bool:
            sent = time.monotonic()
            # True: the coordinator knows this member and its generation (REBALANCE_IN_PROGRESS
            # included, which the broker answers only to a current member).
            recognised = bool(await heartbeat())
            if recognised:
                self.member_confirmed_at = max(self.member_confirmed_at, sent)
            return recognised

        return recorded_heartbeat

    async def on_partitions_assigned(self, assigned: set[TP], generation_id: int = 0) -> None:
        # Called on the consumer thread right after the coordinator answered this member's SyncGroup.
        self.member_confirmed_at = max(self.member_confirmed_at, time.monotonic())
        await super().on_partitions_assigned(assigned, generation_id)

    def member_current(self, generation: int) -> bool:
        """Whether this consumer is, as far as it knows, still the member of ``generation``."""
        coordinator = self.coordinator
        return bool(
            coordinator is not None
            and coordinator.generation == generation
            and coordinator.member_id != JoinGroupRequest.UNKNOWN_MEMBER_ID
        )

    async def confirm_member(self, generation: int, timeout_s: float) -> bool:
        """Send one heartbeat now (on the consumer thread) and tell whether the coordinator still
        knows this member of ``generation``. One it no longer knows makes aiokafka rejoin."""
        if not self.member_current(generation):
            return False
        future = asyncio.run_coroutine_threadsafe(self.heartbeat(), self.thread_loop)
        try:
            recognised = await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # no answer in time, or the consumer stopping: not confirmed
            log.info("no answer from the group coordinator to confirm this member (%r)", exc)
            return False
        return bool(recognised) and self.member_current(generation)

    def create_worker_client(self, transport: Any) -> AIOKafkaConsumer:
        # Built here from the app's settings as Faust builds it, with two differences. The fetch
        # wait is the engine's (see the class docs). And it reads committed records in either
        # guarantee (see ``_clients.ISOLATION_LEVEL``): Faust picks read_committed only with its
        # own processing_guarantee="exactly_once", which would also switch on its own
        # transactions (one producer per partition run by Faust, committing on its timer, not
        # with the batch); the engine runs transactions itself.
        conf = self.app.conf
        if conf.broker_session_timeout > conf.broker_request_timeout:
            raise ImproperlyConfigured(
                f"broker_session_timeout={conf.broker_session_timeout} cannot be greater than "
                f"broker_request_timeout={conf.broker_request_timeout}"
            )
        # Table recovery needs Faust's assignor (its map of active and standby changelog
        # partitions) whenever the app has tables; without, aiokafka's round robin does.
        assignor = (
            self.app.assignor
            if conf.table_standby_replicas > 0 or self.app.tables.changelog_topics
            else RoundRobinPartitionAssignor
        )
        return AIOKafkaConsumer(
            client_id=conf.broker_client_id,
            group_id=conf.id,
            group_instance_id=conf.consumer_group_instance_id,
            bootstrap_servers=server_list(transport.url, transport.default_port),
            partition_assignment_strategy=[assignor],
            enable_auto_commit=False,
            auto_offset_reset=conf.consumer_auto_offset_reset,
            max_poll_records=conf.broker_max_poll_records,
            max_poll_interval_ms=int((conf.broker_max_poll_interval or 0) * 1000.0),
            max_partition_fetch_bytes=conf.consumer_max_fetch_size,
            fetch_max_wait_ms=self.consumer.delivery.fetch_max_wait_ms,
            request_timeout_ms=int(conf.broker_request_timeout * 1000.0),
            check_crcs=conf.broker_check_crcs,
            session_timeout_ms=int(conf.broker_session_timeout * 1000.0),
            rebalance_timeout_ms=int(conf.broker_rebalance_timeout * 1000.0),
            heartbeat_interval_ms=int(conf.broker_heartbeat_interval * 1000.0),
            isolation_level=ISOLATION_LEVEL,
            metadata_max_age_ms=conf.consumer_metadata_max_age_ms,
            connections_max_idle_ms=conf.consumer_connections_max_idle_ms,
            **credentials_to_aiokafka_auth(conf.broker_credentials, conf.ssl_context),
        )


class BatchConsumer(ConsumerHooks):
    """Faust's aiokafka consumer with the per-record hand-over replaced for the engine's
    ``batch_topics`` (see :class:`Delivery`, which Faust's app passes in as it builds it)."""

    thread_class = _ConsumerThread

    def __init__(self, *args: Any, delivery: Delivery | None = None, **kwargs: Any) -> None:
        #: Before Faust's own set-up, which builds the consumer thread that reads it.
        self.delivery = delivery if delivery is not None else Delivery()
        super().__init__(*args, **kwargs)
        #: Per partition delivered to the engine since it was assigned, the offset after its last
        #: processed batch (committed with it under exactly_once, by :meth:`force_commit` otherwise).
        self._processed: dict[TP, int] = {}
        #: Per assigned partition, the group's committed offset as this consumer last sought to it
        #: or committed it (absent: none known; under exactly_once the batches' transactions
        #: commit without telling it).
        self._committed: dict[TP, int] = {}
        #: Bumped by every seek and rebalance: fetches in one epoch continue one another.
        self._seek_epoch = 0
        #: Per partition, the epoch its last handed-over records were fetched in, and their last offset.
        self._handed: dict[TP, tuple[int, int]] = {}
        self._running = 0  # batches being delivered now
        self._idle = asyncio.Event()
        self._idle.set()
        self._confirming = asyncio.Lock()
        self._dropped_generation: int | None = None  # the last generation found dropped (logged once)
        #: Per consumer generation, the lanes delivering batches fetched in it now.
        self._delivering: Counter[int] = Counter()

    @property
    def _member_thread(self) -> _ConsumerThread:
        return cast(_ConsumerThread, self.thread)

    # -- the hand-over ------------------------------------------------------------------

    async def drain_fetched(self, fetcher: Any) -> None:
        stopped = self.stopped(fetcher)
        batch_topics = self.delivery.batch_topics
        lanes = self.delivery.lanes
        try:
            while not stopped():
                before = self._seek_epoch
                records, active = await self.next_records(1.0)
                # Fetched with no seek meanwhile: these records continue the ones fetched before
                # in the same epoch (aiokafka's fetcher returns each partition's records from its
                # position on; only a seek or a rebalance moves that). A seek during the wait
                # leaves the epoch unknown (-1): the records could be from either side of it.
                epoch = before if self._seek_epoch == before else -1
                await asyncio.sleep(0)  # the fetch may return at once, again and again
                if not records or self.should_stop:
                    continue
                generation = self.app.consumer_generation_id
                stock: dict[TP, Sequence[Any]] = {}
                by_lane: dict[tuple[int, int], list[tuple[TP, Sequence[Any]]]] = {}
                for tp, batch in records.items():
                    if not batch:
                        continue
                    if tp.topic not in batch_topics:
                        stock[tp] = batch
                    else:
                        by_lane.setdefault((tp.partition, lanes.get(tp.topic, -1)), []).append((tp, batch))
                if by_lane:
                    # Batches share no table partition unless their partition numbers and lanes
                    # are equal (tables are co-partitioned with their inputs; a lane is a set of
                    # handlers writing common tables), so the others run side by side and one's
                    # wait for acknowledgements overlaps another's work; batches of one lane and
                    # partition number run in turn.
                    await asyncio.gather(
                        *(self._deliver_in_turn(batches, active, generation, epoch) for batches in by_lane.values())
                    )
                if stock:
                    await self._drain_stock(stock, active, generation)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                return
            raise
        except Exception as exc:
            log.exception("the consumer's fetch loop failed: %r", exc)
            user = getattr(self.app.conf.broker_credentials, "username", None)
            if (denial := explain_denial(exc, user, self.app.conf.id, reading=True)) is not None:
                log.error("%s cannot go on: %s", self.app.conf.id, denial)
            raise

    def _may_deliver(self, tp: TP, active: set[TP] | None, generation: int) -> bool:
        return (
            self.flow_active
            and not self.should_stop
            and self.app.consumer_generation_id == generation
            and (active is None or tp in active)
            and tp in self.assignment()
        )

    async def _deliver_in_turn(
        self, batches: list[tuple[TP, Sequence[Any]]], active: set[TP] | None, generation: int, epoch: int = -1
    ) -> None:
        _BATCH_GENERATION.set(generation)
        self._delivering[generation] += 1
        try:
            for tp, batch in batches:
                if self._may_deliver(tp, active, generation) and await self._still_member(generation):
                    try:
                        await self._deliver(tp, batch, epoch)
                    except NotAMember as exc:
                        log.warning(
                            "%s[%d] offsets %d..%d not committed: %s",
                            tp.topic,
                            tp.partition,
                            batch[0].offset,
                            batch[-1].offset,
                            exc,
                        )
                        await self._seek_back(tp, batch[0].offset)
                else:
                    await self._seek_back(tp, batch[0].offset)
        finally:
            self._delivering[generation] -= 1
            if not self._delivering[generation]:
                del self._delivering[generation]

    async def may_write(self) -> bool:
        """Whether a produce request of a batch's commit (at-least-once) may leave now: the
        coordinator still counts this consumer as the member of every generation whose batches
        are being delivered, as a heartbeat within :data:`WRITE_CONFIRMED_WITHIN_S` showed or one
        sent now shows.

        The engine's batch producer asks this right before each request goes out (see
        :class:`shared.engine._producer.BatchProducer`). :meth:`ensure_member` runs before a
        commit sends anything, but records queued after it can still leave after a freeze
        (SIGSTOP, a paused VM) during which the group removed this member and another took the
        partition over and wrote to its changelog: rows computed from the stale copy would land
        after the new owner's, and every later restore would take them as the latest. Only a
        transaction fences for sure (exactly_once); this narrows the gap to the moment between
        this answer and the request's write to the socket."""
        generations = list(self._delivering) or [self.app.consumer_generation_id]
        for generation in generations:
            if not await self._still_member(generation, WRITE_CONFIRMED_WITHIN_S):
                return False
        return True

    async def ensure_member(self) -> None:
        """Raise :class:`NotAMember` unless the group still counts this consumer as the member that
        fetched the batch being delivered: called by a batch's commit before it writes anything,
        and again before its rows go into the local tables, since the process may have been
        stopped anywhere in between."""
        generation = _BATCH_GENERATION.get(None)
        if generation is not None and not await self._still_member(generation):
            raise NotAMember(f"the group coordinator did not confirm this member of generation {generation}")

    async def ensure_owner(self, tp: TP) -> None:
        """Raise :class:`NotAMember` unless the batch of ``tp`` being delivered may still be
        delivered again and committed here: the worker is not stopping, no rebalance has begun
        (flow active, the same generation), ``tp`` is still assigned, and the coordinator still
        knows this member (:meth:`ensure_member`). Checked before a failed batch is retried, so
        that only the partition's owner initialises its transactional producer again (which
        fences every other) and a consumer that lost the partition leaves it to the new owner."""
        generation = _BATCH_GENERATION.get(None)
        try:
            assigned = tp in self.assignment()
        except Exception:  # the consumer thread is stopping or restarting
            assigned = False
        if (
            self.should_stop
            or not self.flow_active
            or not assigned
            or (generation is not None and self.app.consumer_generation_id != generation)
        ):
            raise NotAMember(f"{tp.topic}[{tp.partition}] is no longer assigned to this consumer (a rebalance or a stop)")
        await self.ensure_member()

    async def _still_member(self, generation: int, within_s: float = MEMBER_CONFIRMED_WITHIN_S) -> bool:
        """Whether the group still counts this consumer as the member of ``generation``: known
        from a heartbeat within ``within_s``, or asked now after a silence (see the module docs)."""
        thread = self._member_thread
        if not thread.member_current(generation):
            if self._dropped_generation != generation:
                self._dropped_generation = generation
                log.warning(
                    "the group coordinator no longer knows this member of generation %d: fetched "
                    "batches are left for the partitions' owner after the rebalance",
                    generation,
                )
            return False
        if time.monotonic() - thread.member_confirmed_at <= within_s:
            return True
        async with self._confirming:  # batches of several lanes wait for one answer
            if time.monotonic() - thread.member_confirmed_at <= within_s:
                return thread.member_current(generation)
            silent_s = time.monotonic() - thread.member_confirmed_at
            confirmed = await thread.confirm_member(generation, MEMBER_CONFIRM_TIMEOUT_S)
        if not confirmed:
            log.warning(
                "the group coordinator did not confirm this member of generation %d after %.1fs "
                "without a heartbeat: its fetched batches are left for the partitions' owner "
                "after the rebalance",
                generation,
                silent_s,
            )
        return confirmed

    def _continues_from(self, tp: TP, epoch: int) -> int | None:
        """The offset after the records of ``tp`` handed over last, when a fetch of ``epoch``
        continues them: every offset between those and this fetch's first record was read by
        the fetcher and held no record it returns (with read_committed: transaction markers
        and aborted records)."""
        handed = self._handed.get(tp)
        if epoch < 0 or handed is None or handed[0] != epoch:
            return None
        return handed[1] + 1

    async def _deliver(self, tp: TP, batch: Sequence[Any], epoch: int = -1) -> None:
        deliver = self.delivery.deliver
        if deliver is None:
            raise RuntimeError("the consumer has no delivery: the engine sets one before the worker starts")
        continues_from = self._continues_from(tp, epoch)
        self._handed.pop(tp, None)
        self._running += 1
        self._idle.clear()
        try:
            await deliver(tp, batch, continues_from)
        finally:
            self._running -= 1
            if not self._running:
                self._idle.set()
        last = int(batch[-1].offset)
        if epoch >= 0 and epoch == self._seek_epoch:
            self._handed[tp] = (epoch, last)
        self._processed[tp] = last + 1
        self.read_offsets[tp] = last

    async def _seek_back(self, tp: TP, offset: int) -> None:
        """Fetch ``tp`` again from ``offset`` when it is ours again (a later owner starts from its commit)."""
        try:
            await self.seek(tp, offset)
        except Exception as exc:  # revoked meanwhile: nothing to do, the new owner reads it
            log.debug("not seeking %s back to %d: %r", tp, offset, exc)

    async def _drain_stock(self, records: dict[TP, Sequence[Any]], active: set[TP] | None, generation: int) -> None:
        """Faust's own per-record path (``Consumer.getmany`` + its fetch loop) for the other topics."""
        if not self.flow_active:
            try:
                await self.perform_seek()
            except Exception as exc:
                log.warning("seek to committed offsets failed while flow is stopped: %r", exc)
            return
        callback = self.callback
        to_message = self.to_message
        read_offsets = self.read_offsets
        for tp, batch in records.items():
            if not (active is None or tp in active or tp in self.buffered_partitions):
                continue
            self.app.monitor.track_tp_end_offset(tp, self.highwater(tp))
            for n, record in enumerate(batch):
                if not self.flow_active or self.app.consumer_generation_id != generation:
                    return
                if n % 100 == 99:
                    await asyncio.sleep(0)
                read_offset = read_offsets[tp]
                offset = record.offset
                if read_offset is not None and offset < read_offset:
                    continue
                if read_offset and offset - read_offset > 1 and self.app.topics.acks_enabled_for(record.topic):
                    await self.add_gap(tp, read_offset + 1, offset)
                await self.wait_first(callback(to_message(tp, record)), self.suspend_flow.wait())
                read_offsets[tp] = offset

    # -- lag ----------------------------------------------------------------------------

    @Service.timer(LAG_EVERY_S)
    async def _lag_timer(self) -> None:
        self.record_lag()

    def record_lag(self) -> None:
        """Set the consumer lag gauge of each input topic (see :func:`lag_by_topic`)."""
        if not self.delivery.service:
            return
        try:
            assigned = self.assignment()
        except Exception:  # the consumer thread is not running (starting or stopping)
            return
        read_offsets = self.read_offsets
        for topic, lag in lag_by_topic(self.delivery.batch_topics, assigned, self._highwater, read_offsets.get).items():
            CONSUMER_LAG.labels(self.delivery.service, topic).set(lag)

    def input_lag(self, tps: Iterable[TP]) -> dict[TP, int | None]:
        """Records of each partition after its last processed batch: the consumer's last seen high
        watermark minus the offset after that batch, or, before this assignment's first batch,
        minus the group's committed offset (None until the consumer has fetched from the
        partition). Read committed, a transaction's marker at a partition's end counts as one
        record (the consumer never reads it). Asks the broker nothing."""
        out: dict[TP, int | None] = {}
        for tp in tps:
            end = self._highwater(tp)
            start = self._processed.get(tp)
            if start is None:
                start = self._committed.get(tp, 0)
            out[tp] = None if end is None else max(0, end - start)
        return out

    def _highwater(self, tp: TP) -> int | None:
        try:
            end = self.highwater(tp)
        except Exception:  # not fetched from, or revoked meanwhile
            return None
        return None if end is None else int(end)

    # -- offsets ------------------------------------------------------------------------

    async def force_commit(self, topics: Any = None, start_new_transaction: bool = True) -> bool:
        # Faust's commit (periodic, at revocation, at stop) of the offsets it tracks itself, then
        # of the processed batches', which its bookkeeping never sees (under exactly_once each
        # batch's transaction committed its offset).
        did_commit = await super().force_commit(topics, start_new_transaction=start_new_transaction)
        if self.delivery.exactly_once:
            return bool(did_commit)
        offsets = {
            tp: offset
            for tp, offset in self._processed.items()
            if (topics is None or tp in topics or tp.topic in topics) and self._committed.get(tp) != offset
        }
        return await self._commit_processed(offsets) or did_commit

    async def _commit_processed(self, offsets: dict[TP, int]) -> bool:
        """Commit processed batches' offsets of partitions still assigned, as Faust commits its own
        (its producer flushed first; the tables told)."""
        assignment = self.assignment()
        offsets = {tp: offset for tp, offset in offsets.items() if tp in assignment}
        if not offsets:
            return False
        await self.app.producer.flush()
        did_commit = bool(await self.thread.commit(offsets))
        if did_commit:
            self._committed.update(offsets)
            self.app.tables.on_commit(offsets)
        self.app.monitor.on_tp_commit(offsets)
        return did_commit

    async def wait_empty(self) -> None:
        await self._idle.wait()
        await super().wait_empty()

    # -- seeks: each one ends an epoch of fetches that continue one another ---------------

    async def seek_to_committed(self) -> Mapping[TP, int]:
        self._seek_epoch += 1
        committed = await super().seek_to_committed()
        self._committed.update(
            {TP(tp.topic, tp.partition): offset for tp, offset in committed.items() if offset is not None and offset >= 0}
        )
        return committed

    async def seek_wait(self, partitions: Any) -> None:
        self._seek_epoch += 1
        await super().seek_wait(partitions)

    async def seek(self, partition: TP, offset: int) -> None:
        self._seek_epoch += 1
        await super().seek(partition, offset)

    async def on_partitions_assigned(self, assigned: set[TP], generation_id: int = 0) -> None:
        self._seek_epoch += 1
        self._handed.clear()
        for tp in assigned:  # read from the group's committed offset again
            self._processed.pop(tp, None)
            self._committed.pop(tp, None)  # until Faust seeks to it
        if self.delivery.on_assigned is not None:
            await self.delivery.on_assigned(set(assigned))
        await super().on_partitions_assigned(assigned, generation_id)

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        self._seek_epoch += 1
        await super().on_partitions_revoked(revoked)  # stops the flow and waits for the running batch
        self._seek_epoch += 1
        self._handed.clear()
        if self.delivery.on_revoked is not None:
            await self.delivery.on_revoked(set(revoked))
        ours = set() if self.delivery.exactly_once else {tp for tp in revoked if tp in self._processed}
        if ours:
            try:
                await asyncio.wait_for(self.commit(ours), REVOKE_COMMIT_TIMEOUT_S)
            except Exception as exc:  # the next owner re-reads those records and drops them as replays
                log.info("offsets of revoked partitions not committed (%r): the next owner re-reads them", exc)
        for tp in revoked:
            self._processed.pop(tp, None)
            self._committed.pop(tp, None)
