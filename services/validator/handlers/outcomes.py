"""The outcomes sub-topology (GET /commands/{command_id}).

``record_outcomes`` (internal ``…-outcomes``, keyed by command_id) keeps the ``outcomes``
table. A "pending" record (written by POST /commands) never replaces an answer. Each batch
also deletes the rows older than ``command_outcome_retention_s`` (found through their
expiry rows, oldest first), so the table holds about one retention period of commands.
"""

from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client import Counter

from services.validator.handlers.topics import ValidatorTopics
from services.validator.outcome_records import PENDING
from services.validator.state import EXPIRY_PREFIX, expired, expiry_key, outcome_status
from shared import codecs
from shared.engine import Engine, InputBatch, partition_for
from shared.metrics import REGISTRY
from shared.settings import Settings

log = logging.getLogger(__name__)

OUTCOMES_EXPIRED = Counter(
    "statefleet_validator_outcomes_expired_total",
    "Command outcomes deleted after STATEFLEET_COMMAND_OUTCOME_RETENTION_S",
    registry=REGISTRY,
)

#: Most outcome rows one batch of record_outcomes deletes per partition.
EXPIRE_PER_BATCH = 1000


def now_ms() -> int:
    return int(time.time() * 1000)


class OutcomesBehind(RuntimeError):
    """The outcomes table has not yet recorded every outcome already written for it."""


class Outcomes:
    def __init__(self, engine: Engine, settings: Settings, topics: ValidatorTopics) -> None:
        self.engine = engine
        self.settings = settings
        self.topic = topics.outcomes
        self.partitions = settings.topic_partitions
        self.store = engine.table("outcomes")
        self.waiters: dict[str, list[asyncio.Future[None]]] = {}
        #: Per outcomes partition, the last expiry row deleted: later scans seek past the
        #: tombstones below it instead of stepping over them.
        self._expiry_from: dict[int, bytes] = {}
        engine.handler(self.topic, name="outcomes", offsets=self.store, internal_partitions=self.partitions, sends=())(
            self.record_outcomes
        )
        engine.on_recovered(self.store, self._on_recovered)

    async def record_outcomes(self, input_batch: InputBatch) -> None:
        retention_ms = round(self.settings.command_outcome_retention_s * 1000)
        now = now_ms()
        answered: list[str] = []
        for record in input_batch.records:
            if record.key is None or record.value is None:
                continue
            try:
                status = outcome_status(record.value)
            except codecs.DecodeError:
                log.warning(
                    "skipping an outcome record that is not JSON at %s[%s]@%s", record.topic, record.partition, record.offset
                )
                continue
            known = input_batch.read(self.store, record.key) is not None
            if status == PENDING and known:
                continue  # a command is pending only until it has an answer
            if not known:
                input_batch.write(self.store, expiry_key(now + retention_ms, record.key), b"")
            input_batch.write(self.store, record.key, record.value)
            answered.append(record.key.decode("utf-8", errors="replace"))
        for key in self.expired_outcomes(input_batch.partition, now):
            input_batch.write(self.store, key, None)

        def wake() -> None:
            for command_id in answered:
                self._wake(command_id)

        input_batch.after_commit(wake)

    def expired_outcomes(self, partition: int, now: int) -> list[bytes]:
        """Keys of the outcome rows (and their expiry rows) of ``partition`` past retention:
        bounded per batch, oldest first. Each batch expires its own partition only, so no
        two batches write one changelog partition at once."""
        start = self._expiry_from.get(partition, EXPIRY_PREFIX)
        keys = (key for key, _ in self.store.items(partition, from_key=start))
        due = expired(keys, now, EXPIRE_PER_BATCH)
        deletes: list[bytes] = []
        for expiry_row, command_id in due:
            deletes += [command_id, expiry_row]
        if due:
            self._expiry_from[partition] = due[-1][0]
            OUTCOMES_EXPIRED.inc(len(due))
        return deletes

    async def _on_recovered(self) -> None:
        # Another instance may have owned a partition meanwhile: scan it from the start.
        self._expiry_from.clear()

    def _wake(self, command_id: str) -> None:
        for fut in self.waiters.pop(command_id, ()):
            if not fut.done():
                fut.set_result(None)

    # -- reads (GET /commands/{command_id}) ---------------------------------------------------

    def outcome(self, command_id: str) -> bytes | None:
        if not command_id or "\x00" in command_id:
            return None  # no command has such an id; the table's own rows start with NUL
        key = command_id.encode()
        return self.store.get(partition_for(key, self.partitions), key)

    async def outcome_once_applied(self, command_id: str) -> bytes | None:
        """The outcome of a command not found at first, read again once every outcome record
        already written is in the table: the validator sends a command's event and its
        outcome record together, so whoever saw the event can read the outcome.

        Raises :class:`OutcomesBehind` when they are not recorded within
        ``command_outcome_catch_up_s``: the command may have been decided, so "no such
        command" would be wrong."""
        if not command_id or "\x00" in command_id:
            return None
        partition = partition_for(command_id.encode(), self.partitions)
        if not await self.engine.wait_applied(self.topic, partition, self.settings.command_outcome_catch_up_s):
            raise OutcomesBehind(f"outcomes of partition {partition} are still being recorded")
        return self.outcome(command_id)

    async def wait_outcome(self, command_id: str, seconds: float, *, final: bool) -> bytes | None:
        """The outcome record once it is final (or, with ``final=False``, once there is one),
        or whatever is there when ``seconds`` have passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while True:
            raw = self.outcome(command_id)
            if raw is not None and (not final or outcome_status(raw) != PENDING):
                return raw
            remaining = deadline - loop.time()
            if remaining <= 0:
                return raw
            fut: asyncio.Future[None] = loop.create_future()
            self.waiters.setdefault(command_id, []).append(fut)
            try:
                await asyncio.wait_for(fut, remaining)
            except TimeoutError:
                pass
            finally:
                waiting = self.waiters.get(command_id)
                if waiting is not None and fut in waiting:
                    waiting.remove(fut)
                    if not waiting:
                        del self.waiters[command_id]
