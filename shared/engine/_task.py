"""The engine's tasks: one handler's work on one input partition, with a state of its own.

Kafka Streams' ``StreamTask`` is the model. A :class:`Task` exists per (handler, input
partition) this instance is assigned, and its :class:`TaskState` says what it may do::

    CREATED ─► RESTORING ─► RUNNING ─► SUSPENDED ─► RESTORING
                    │           ▲           │
                    └─► SUSPENDED           └─► RUNNING   (any state ─► CLOSED; CLOSED is final)

- CREATED: the partition was just assigned;
- RESTORING: its tables are being recovered from their changelogs; nothing is processed;
- RUNNING: batches are processed and committed (:meth:`Task.process`);
- SUSPENDED: the partition was revoked; a batch that was being committed writes nothing
  more (:meth:`Task.fence`), and the task is restored again if the partition comes back;
- CLOSED: the partition went to another member, or the worker stopped.

Every transition is checked (:class:`TaskStateError` otherwise). The consumer loop and the
topology driver (``shared/engine/testing.py``) drive the same methods: :meth:`Task.process`
is the one path from fetched records to a committed batch (the records in order, the handler,
the commit with its batch's status, see ``shared/engine/_batch.py``), and the crash and stop
points of the crash tests are hooks on its batches' status transitions.

What a task needs to commit (its clients) is passed in (:class:`TaskClients`): the worker's
producers and transactions, or the driver's in-memory ones.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from shared.engine._batch import BatchStatus, DeadLetterRoute, Fence, InputBatch, commit, observe
from shared.engine._consumer import NotAMember
from shared.engine._durable import InRecord, OrderedInput
from shared.engine._faults import FaultPoints
from shared.engine._producer import BatchProducer, PartitionTransactions

log = logging.getLogger(__name__)

Handler = Callable[[InputBatch], Awaitable[None]]


@dataclass
class Registration:
    """A batch handler as registered with the engine: what it reads and how it keeps its offsets."""

    #: ``<service>.<name>``, as logs and the stop points name it.
    name: str
    #: ``<name>``, the ``stream`` label of its metrics.
    stream: str
    topics: tuple[str, ...]
    handle: Handler
    #: Its input's next offsets in its tables; None for a stateless handler (at-least-once, no rows).
    order: OrderedInput | None
    dead_letters: DeadLetterRoute | None
    #: The topics it declared it sends to (see ``shared/engine/_topology.py``); None: not declared.
    sends: tuple[str, ...] | None = None
    #: Partitions of its topics when they are the service's own.
    internal_partitions: int | None = None
    #: The ``service`` label of its metrics.
    service: str = ""


class TaskState(enum.Enum):
    CREATED = "created"
    RESTORING = "restoring"
    RUNNING = "running"
    SUSPENDED = "suspended"
    CLOSED = "closed"


_NEXT_STATE: dict[TaskState, frozenset[TaskState]] = {
    TaskState.CREATED: frozenset({TaskState.RESTORING, TaskState.CLOSED}),
    TaskState.RESTORING: frozenset({TaskState.RUNNING, TaskState.SUSPENDED, TaskState.CLOSED}),
    TaskState.RUNNING: frozenset({TaskState.SUSPENDED, TaskState.CLOSED}),
    TaskState.SUSPENDED: frozenset({TaskState.RESTORING, TaskState.RUNNING, TaskState.CLOSED}),
    TaskState.CLOSED: frozenset(),
}


class TaskStateError(RuntimeError):
    """A task was moved where its state does not lead: a defect of the engine."""


class StepFailed(Exception):
    """A step of :meth:`Task.process` failed; ``__cause__`` is the error. The engine decides from
    the step whether the batch is delivered again or the worker stops."""

    def __init__(self, step: Literal["read", "handle", "commit"], batch: InputBatch | None, cause: BaseException) -> None:
        super().__init__(f"{step}: {type(cause).__name__}: {cause}")
        self.step = step
        self.batch = batch
        self.__cause__ = cause


@dataclass
class TaskClients:
    """What a task's commit goes through."""

    producer: BatchProducer
    #: exactly_once: one transaction per batch.
    transactions: PartitionTransactions | None = None
    #: at-least-once: raises when this consumer may no longer be the member that fetched the batch.
    member: Fence | None = None
    #: The longest a commit may take (exactly_once: within the transaction timeout).
    commit_timeout_s: float | None = None


@dataclass(eq=False)
class Task:
    """One handler's work on one input partition (see the module docs)."""

    handler: Registration
    topic: str
    partition: int
    faults: FaultPoints = field(default_factory=FaultPoints)
    state: TaskState = TaskState.CREATED

    def __str__(self) -> str:
        return f"{self.handler.name} on {self.topic}[{self.partition}]"

    def transition(self, to: TaskState) -> None:
        """Move to ``to``; raises :class:`TaskStateError` unless the current state leads there."""
        if to not in _NEXT_STATE[self.state]:
            raise TaskStateError(f"task {self} is {self.state.value}: it cannot become {to.value}")
        log.debug("task %s: %s -> %s", self, self.state.value, to.value)
        self.state = to

    def restore(self) -> None:
        """The partition is (again) assigned: its tables are recovered before it runs."""
        if self.state is TaskState.RUNNING:
            self.transition(TaskState.SUSPENDED)  # assigned again without a revocation in between
        if self.state is not TaskState.RESTORING:
            self.transition(TaskState.RESTORING)

    def restored(self) -> None:
        """Its tables are recovered: batches may be processed."""
        if self.state is TaskState.RESTORING:
            self.transition(TaskState.RUNNING)

    def suspend(self) -> None:
        """The partition was revoked."""
        if self.state in (TaskState.CREATED, TaskState.RESTORING, TaskState.RUNNING):
            self.transition(TaskState.SUSPENDED if self.state is not TaskState.CREATED else TaskState.CLOSED)

    def close(self) -> None:
        if self.state is not TaskState.CLOSED:
            self.transition(TaskState.CLOSED)

    async def fence(self, member: Fence | None = None) -> None:
        """Raise :class:`NotAMember` unless the task still runs (and ``member`` passes): awaited by
        the commit before anything is sent and before the local write."""
        if self.state is not TaskState.RUNNING:
            raise NotAMember(f"task {self} is {self.state.value}")
        if member is not None:
            await member()

    async def process(
        self, records: Sequence[InRecord], clients: TaskClients, continues_from: int | None = None
    ) -> InputBatch | None:
        """Hand ``records`` (fetched in offset order) to the handler, exactly the next ones of the
        partition (replays dropped, skipped offsets read back), and commit what it staged.

        Returns the committed batch, or None when every record was a replay. Raises
        :class:`NotAMember` when the task no longer runs or the group may have moved the
        partition (nothing more of the batch is written), and :class:`StepFailed` when reading
        back, the handler or the commit failed."""
        started = time.perf_counter()
        if self.state is TaskState.RESTORING:
            # Faust resumes fetching a partition only once its tables are recovered: its first
            # batch may come before the recovery's completion reaches the task.
            self.transition(TaskState.RUNNING)
        await self.fence()
        reg = self.handler
        try:
            ordered = await reg.order.batch_records(records, continues_from) if reg.order is not None else None
        except Exception as exc:
            raise StepFailed("read", None, exc) from exc
        if ordered is not None and not ordered.records:
            return None  # every record a replay
        batch = InputBatch(
            self.topic,
            self.partition,
            ordered.records if ordered is not None else list(records),
            dead_letter_route=reg.dead_letters,
            on_status=self._reached,
        )
        try:
            await reg.handle(batch)
        except Exception as exc:
            raise StepFailed("handle", batch, exc) from exc
        member = clients.member

        async def fence() -> None:
            await self.fence(member)

        try:
            async with asyncio.timeout(clients.commit_timeout_s):
                await commit(
                    clients.producer,
                    reg.order,
                    ordered,
                    batch,
                    reg.name,
                    clients.transactions,
                    int(records[-1].offset) + 1,
                    member=fence,
                )
        except NotAMember:
            raise
        except Exception as exc:
            raise StepFailed("commit", batch, exc) from exc
        observe(reg.service, reg.stream, batch, started)
        return batch

    def _reached(self, batch: InputBatch, status: BatchStatus) -> None:
        point = _FAULT_POINTS.get(status)
        if point is not None:
            self.faults.reached(point, self.handler.name, bool(batch.rows))


#: The crash tests' points (``shared/engine/_faults.py``) at the batch statuses they name.
_FAULT_POINTS = {BatchStatus.COMMITTING: "handled", BatchStatus.SENT: "sent", BatchStatus.LOGGED: "logged"}
