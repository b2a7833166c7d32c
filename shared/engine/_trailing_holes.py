"""Input records the stream skipped with no record after them.

:class:`~shared.engine._durable.OrderedInput` finds a hole in an input partition when the record
after the hole arrives. Records skipped at the very end of a partition have no record
after them: without more input they would wait for the next restart, and a command
among them would stay pending. (Faust skips records when it drops a fetched batch
around a rebalance, or starts from a committed offset past records the handler never
processed, e.g. after the group's offsets were moved.)

:class:`TrailingHoleWatch` compares, every few seconds and per assigned input partition,
the next offset the handler expects (its next-offset row) with the Faust consumer's
position. When the consumer has moved past records the handler never processed, none of
them is waiting in the stream (no unacknowledged message of that partition), and nothing
changed since the previous check, it seeks the consumer back to the expected offset so
the stream delivers those records again. A record delivered twice this way is a replay
to ``OrderedInput`` (dropped) and to Faust's acknowledgements (counted once by offset),
so a seek that was not needed costs a re-read and nothing else.

With exactly_once the consumer reads committed records only, and its position moves past
each transaction's marker: after every transaction the position is one past the handler's
next offset with nothing to deliver. Such a range is read back once; when it holds no
committed record it is remembered as empty (:meth:`OrderedInput.confirm_empty`) instead of
being fetched again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Protocol

import faust
from aiokafka.errors import IllegalStateError
from faust.types import TP

from shared.engine._faust import recovery_done
from shared.metrics import TRAILING_HOLES_REREAD

log = logging.getLogger(__name__)

#: Longest wait for the consumer's position of one partition.
POSITION_TIMEOUT_S = 5.0


class NextOffsets(Protocol):
    """Where the handler's next expected offset per input partition is read (an ``OrderedInput``)."""

    def settled_offset(self, topic: str, partition: int) -> int | None: ...

    async def confirm_empty(self, topic: str, partition: int, start: int, end: int) -> bool: ...


class TrailingHoleWatch:
    """Sends the consumer back to input records a handler never got; see the module docs.

    ``inputs`` maps each input topic to the ``OrderedInput`` of the handler that reads it;
    :meth:`check` runs on a timer of the app every ``interval_s``.
    """

    def __init__(self, app: faust.App, service: str, inputs: Mapping[str, NextOffsets], interval_s: float) -> None:
        self.app = app
        self.service = service
        self.inputs = dict(inputs)
        #: Per partition, what the last check saw: (expected offset, consumer position).
        self._suspects: dict[TP, tuple[int, int]] = {}
        self.rereads = 0
        app.timer(interval_s, name=f"{service}.trailing_holes")(self.check)

    async def check(self) -> None:
        if not recovery_done(self.app):
            self._suspects.clear()
            return
        seen: dict[TP, tuple[int, int]] = {}
        in_streams = {message.tp for message in list(self.app.consumer.unacked)}  # handed to a stream, not yet acknowledged
        for tp in sorted(self.app.consumer.assignment()):
            reader = self.inputs.get(tp.topic)
            if reader is None:
                continue
            expected = reader.settled_offset(tp.topic, tp.partition)
            if expected is None:  # nothing processed yet: the first record read decides
                continue
            try:
                position = await asyncio.wait_for(self.app.consumer.position(tp), POSITION_TIMEOUT_S)
            except TimeoutError:  # a partition still resetting its position: the next check sees it
                continue
            except IllegalStateError:  # revoked since the assignment was read: a rebalance began
                self._suspects.clear()
                return
            if position is None or position <= expected or tp in in_streams:
                continue
            if self._suspects.get(tp) != (expected, position):
                seen[tp] = (expected, position)  # first sighting: the stream may still be on its way
                continue
            if await reader.confirm_empty(tp.topic, tp.partition, expected, position):
                # Reading committed records only (exactly_once), the consumer moves past the
                # marker of the last transaction (and past aborted records), where no record
                # is to be processed: remembered, not a hole.
                continue
            log.warning(
                "the stream skipped %s[%d] offsets %d..%d with nothing after them; reading them again",
                tp.topic,
                tp.partition,
                expected,
                position - 1,
            )
            try:
                await self.app.consumer.seek_wait({tp: expected})
            except IllegalStateError:  # revoked meanwhile: its next owner starts from the committed offset
                self._suspects.clear()
                return
            TRAILING_HOLES_REREAD.labels(self.service).inc()
            self.rereads += 1
        self._suspects = seen
