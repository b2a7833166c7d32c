"""Tick records: how a timer gets work done in a handler.

A table changes only inside a batch of its partition (Faust's rule, and the engine's commit
path), so work a timer wants done on a partition's state (publish what changed, redeliver
what is due) goes as a tick record to that partition of the handler's own topic: the handler
does the work in the batch the tick arrives in, and commits it with the rest.

A :class:`Ticker` sends them: every interval one tick to each partition that wants one, with
at most one in flight per partition, so that a handler behind its input does not find a pile
of ticks when it catches up. A tick is in flight from its send until the handler takes it
(:meth:`Ticker.taken`), or for ten intervals (at least 5 s) at most: one lost with a rebalance
is sent again then. A tick that cannot be sent (the broker away) is sent with the next
interval; the timer never raises for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable

log = logging.getLogger(__name__)

#: Sends one record (``Engine.send``).
Send = Callable[..., Awaitable[None]]


class Ticker:
    """Ticks of ``value`` to the partitions of ``topic`` (see the module docs); ``name`` says what
    they are in logs ("publish tick of by-program")."""

    def __init__(
        self,
        send: Callable[[], Send],
        topic: str,
        value: bytes,
        *,
        interval_s: float,
        name: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._send = send
        self._clock = clock
        self.topic = topic
        self.value = value
        self.interval_s = interval_s
        self.name = name
        #: Per partition, when its tick in flight was sent (monotonic seconds).
        self._sent: dict[int, float] = {}

    async def send_to(self, partitions: Iterable[int]) -> None:
        """One tick to each of ``partitions`` that has none in flight."""
        patience = max(10 * self.interval_s, 5.0)
        now = self._clock()
        for partition in sorted(partitions):
            sent = self._sent.get(partition)
            if sent is not None and now - sent < patience:
                continue  # the last tick is still queued: do not pile up more
            await self.send(partition)

    async def send(self, partition: int) -> None:
        """One tick to ``partition`` now (never raises: one not sent goes with the next interval)."""
        self._sent[partition] = self._clock()
        try:
            await self._send()(self.topic, None, self.value, partition=partition)
        except Exception as exc:  # the broker away, say; an exception out of a timer stops the worker
            self._sent.pop(partition, None)
            log.warning(
                "could not send the %s partition %d (sent again in %.1fs): %s: %s",
                self.name,
                partition,
                self.interval_s,
                type(exc).__name__,
                exc,
            )

    def staged(self, partition: int) -> None:
        """A handler staged a tick to ``partition`` on its batch (to go on with a backlog at once)."""
        self._sent[partition] = self._clock()

    def taken(self, partition: int) -> None:
        """The handler of ``partition`` took a tick: the next one may be sent."""
        self._sent.pop(partition, None)

    def forget(self) -> None:
        """After a rebalance: a tick in flight may have been lost with its partition."""
        self._sent.clear()

    def in_flight(self) -> set[int]:
        """The partitions with a tick sent and not taken yet."""
        return set(self._sent)

    def __repr__(self) -> str:
        return f"Ticker({self.topic!r}, in flight: {sorted(self._sent)})"
