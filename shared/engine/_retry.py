"""A batch whose commit failed on the broker's side is delivered again; the worker goes on.

A broker that dies or hands a partition's leadership (or the group's or a transaction's
coordinator) to another node fails the commits in flight: sends not acknowledged in time,
``NotLeaderForPartition``, ``NotEnoughReplicas``, a transaction the coordinator aborted
(``ProducerFenced``: "... or transaction timeout occurred"), a transactional producer that
aiokafka has put in its fatal state or whose transaction ended under it. None of that is the batch's fault, and stopping the
worker over it stopped every partition of the service for good (nothing restarts a worker
process that crashed by itself outside Kubernetes, and within it each restart pays a full
rejoin and restore). So the engine does what Kafka Streams does when it closes a task dirty
(see ``Engine._deliver``):

- at_least_once: nothing of the batch reached the local tables (they are written only after
  every changelog record is acknowledged), so the same fetched records are delivered again;
  what the failed commit may have sent is sent again (at-least-once allows that; the rows it
  may have logged are logged again with the same values).
- exactly_once: the failed transaction's outcome is unknown (a commit whose answer was lost
  may have landed). The partition's transactional producer is closed, and, while this consumer
  is still the member that owns the partition, a fresh one initialised
  (:meth:`PartitionTransactions.renew`): ``InitProducerId`` completes or aborts the old
  transaction on the coordinator before it answers. The local partitions of the tables the
  batch wrote are then brought up to their changelogs' committed end
  (:meth:`ChangelogReader.restore`), and the same fetched records delivered again:
  :class:`OrderedInput` drops those the changelog shows applied.

Only failures of the Kafka clients count (:func:`broker_failure`); a handler's own exception
still stops the worker, as does a refusal for want of an ACL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiokafka.errors import IllegalOperation, KafkaError
from faust.exceptions import ProducerSendError

from shared.engine._durable import DurableTable
from shared.engine._producer import NoTransactionalProducer
from shared.engine._rocksdb import persisted_offset, set_persisted_offset

#: Wait before the first delivery again, and the longest wait between two.
RETRY_FIRST_S = 0.2
RETRY_MAX_S = 5.0

#: Longest wait for each step of a retry (a producer closed, a fresh one initialised, the
#: tables restored): a step that takes longer fails the try, and the next try begins.
RETRY_STEP_TIMEOUT_S = 30.0

#: Longest wait for one transactional commit (its records, offsets and EndTxn). aiokafka retries
#: a coordinator it cannot reach without end; past this the outcome is taken as unknown.
TRANSACTION_COMMIT_TIMEOUT_S = 60.0


def broker_failure(exc: BaseException, *, transactional: bool) -> bool:
    """Whether ``exc``, out of a batch's commit, is a failure of the brokers or of the Kafka
    client rather than of the batch: any ``KafkaError`` (a timeout, a leader or coordinator
    that moved, a fenced or timed-out transaction, a lost connection), Faust's wrapper of a
    failed send, a step that ran out of time, and, with transactions, what aiokafka raises
    for a producer whose transaction the coordinator ended meanwhile (``IllegalOperation``: a
    send "while not in transaction"), that is in its fatal state (an assertion) or that is not
    there (a revocation raced the batch: :class:`NoTransactionalProducer`)."""
    if isinstance(exc, KafkaError | ProducerSendError | TimeoutError):
        return True
    return transactional and isinstance(exc, AssertionError | IllegalOperation | NoTransactionalProducer)


def retry_reason(exc: BaseException) -> str:
    """The ``reason`` label of ``statefleet_batch_retries_total``: the error's class."""
    return type(exc).__name__


def retry_delay_s(failures: int) -> float:
    """The wait before the next delivery after ``failures`` failed ones (doubling, bounded)."""
    return float(min(RETRY_FIRST_S * 2 ** max(failures - 1, 0), RETRY_MAX_S))


@dataclass(frozen=True, slots=True)
class TablePartition:
    """One local partition of a table, as :meth:`ChangelogReader.restore` writes it."""

    table: DurableTable
    partition: int

    def db(self) -> Any:
        return self.table.db(self.partition)

    def persisted_offset(self) -> int | None:
        return persisted_offset(self.db())

    def set_persisted_offset(self, offset: int) -> None:
        set_persisted_offset(self.db(), offset)
