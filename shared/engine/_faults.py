"""Crash points for the crash tests: SIGKILL this worker at a chosen step of a batch's commit;
and a stall for the failover tests: block the worker's event loop during one batch.

``STATEFLEET_CRASH_AT=<point>:<n>`` kills the process (SIGKILL, no clean-up of any kind)
the n-th time a batch reaches ``<point>``:

- ``handled``: the handler has staged its sends and rows, nothing is sent yet;
- ``sent``: the batch's records are acknowledged, its changelog rows not yet sent;
- ``logged``: the changelog rows are acknowledged, the local tables not yet written.

With ``STATEFLEET_PROCESSING_GUARANTEE=exactly_once`` a batch is one transaction and the
points are: ``handled`` (nothing sent), ``sent`` (the transaction's records, outputs and
changelog rows, are acknowledged; the transaction is neither committed nor aborted) and
``logged`` (the transaction is committed, the local tables not yet written).

``STATEFLEET_BLOCK_AT=<n>:<seconds>`` keeps the worker's event loop busy (on the CPU,
holding the GIL as Python code does, not sleeping) for that long the n-th time a batch
has been handled, as a batch that takes that long would.

``STATEFLEET_STOP_AT=<handler>:<point>:<n>`` stops the process (SIGSTOP, as a frozen VM or a
paused container would be) the n-th time a batch of ``<handler>`` (``<service>.<name>``) that writes table rows reaches
``<point>``: the stall tests then remove its member and let it go on (SIGCONT), to check that
a batch cut off this way writes nothing after its partition's next owner took over.

Unset (always, outside those tests) each costs one comparison per batch. The engine reads
them once, when it is built (:meth:`FaultPoints.from_environment`), and runs them as hooks on
its batches' status transitions (``shared/engine/_task.py``): ``handled`` as a commit begins,
``sent`` and ``logged`` as the batch reaches those statuses.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

POINTS = ("handled", "sent", "logged")


class CrashPoint:
    def __init__(self, spec: str | None) -> None:
        self.point: str | None = None
        self.remaining = 0
        if spec:
            point, _, n = spec.partition(":")
            if point not in POINTS or not n.isdigit() or int(n) < 1:
                raise ValueError(f"STATEFLEET_CRASH_AT must be one of {', '.join(POINTS)} followed by ':<n>', got {spec!r}")
            self.point, self.remaining = point, int(n)

    def reached(self, point: str) -> None:
        if point != self.point:
            return
        self.remaining -= 1
        if self.remaining == 0:
            log.warning("STATEFLEET_CRASH_AT=%s: killing this worker now", point)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)


class BlockPoint:
    def __init__(self, spec: str | None) -> None:
        self.remaining = 0
        self.seconds = 0.0
        if spec:
            n, _, seconds = spec.partition(":")
            try:
                self.remaining, self.seconds = int(n), float(seconds)
            except ValueError:
                raise ValueError(f"STATEFLEET_BLOCK_AT must be '<n>:<seconds>', got {spec!r}") from None

    def reached(self) -> None:
        if self.remaining <= 0:
            return
        self.remaining -= 1
        if self.remaining == 0:
            log.warning("STATEFLEET_BLOCK_AT: blocking this worker's event loop for %.1fs", self.seconds)
            end = time.monotonic() + self.seconds
            while time.monotonic() < end:
                pass
            log.warning("STATEFLEET_BLOCK_AT: unblocked")


class StopPoint:
    def __init__(self, spec: str | None) -> None:
        self.handler: str | None = None
        self.point: str | None = None
        self.remaining = 0
        if spec:
            parts = spec.split(":")
            handler, point, n = parts if len(parts) == 3 else ("", "", "")
            if not handler or point not in POINTS or not n.isdigit() or int(n) < 1:
                raise ValueError(
                    f"STATEFLEET_STOP_AT must be '<handler>:<point>:<n>' with a point among {', '.join(POINTS)}, got {spec!r}"
                )
            self.handler, self.point, self.remaining = handler, point, int(n)

    def reached(self, point: str, handler: str, writes_rows: bool) -> None:
        if point != self.point or handler != self.handler or not writes_rows:
            return
        self.remaining -= 1
        if self.remaining == 0:
            log.warning("STATEFLEET_STOP_AT=%s:%s: stopping this worker (SIGSTOP) until it is sent SIGCONT", handler, point)
            os.kill(os.getpid(), signal.SIGSTOP)


@dataclass
class FaultPoints:
    """The crash, block and stop points of one engine (none set: each is one comparison)."""

    crash: CrashPoint = field(default_factory=lambda: CrashPoint(None))
    block: BlockPoint = field(default_factory=lambda: BlockPoint(None))
    stop: StopPoint = field(default_factory=lambda: StopPoint(None))

    @classmethod
    def from_environment(cls, env: Mapping[str, str] = os.environ) -> FaultPoints:
        return cls(
            CrashPoint(env.get("STATEFLEET_CRASH_AT")),
            BlockPoint(env.get("STATEFLEET_BLOCK_AT")),
            StopPoint(env.get("STATEFLEET_STOP_AT")),
        )

    def reached(self, point: str, handler: str, writes_rows: bool) -> None:
        """A batch of ``handler`` reached ``point`` (one of :data:`POINTS`)."""
        self.crash.reached(point)
        if point == "handled":
            self.block.reached()
        self.stop.reached(point, handler, writes_rows)
