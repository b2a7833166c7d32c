"""Crash points for the crash tests: SIGKILL this worker at a chosen step of a batch's commit.

``STATEFLEET_CRASH_AT=<point>:<n>`` kills the process (SIGKILL, no clean-up of any kind)
the n-th time a batch reaches ``<point>``:

- ``handled``: the handler has staged its sends and rows, nothing is sent yet;
- ``sent``: the batch's records are acknowledged, its changelog rows not yet sent;
- ``logged``: the changelog rows are acknowledged, the local tables not yet written.

With ``STATEFLEET_PROCESSING_GUARANTEE=exactly_once`` a batch is one transaction and the
points are: ``handled`` (nothing sent), ``sent`` (the transaction's records, outputs and
changelog rows, are acknowledged; the transaction is neither committed nor aborted) and
``logged`` (the transaction is committed, the local tables not yet written).

Unset (always, outside those tests) it costs one comparison per batch.
"""

from __future__ import annotations

import logging
import os
import signal

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


CRASH = CrashPoint(os.environ.get("STATEFLEET_CRASH_AT"))
