"""CPython's garbage collector, kept off the objects a worker holds for its whole life.

A batch handler allocates several short-lived container objects per input record
(decoded JSON, tuples, the fetched records), so the young generation fills every few
hundred records, and every 100th young collection becomes a full one that walks every
object of the process: the modules, Faust's services, the tables' machinery, none of
which will ever be garbage. Once the worker has started, :func:`freeze_startup_objects`
moves all of those out of the collector's sight (``gc.freeze``); later full collections
walk only what processing allocated since. On the tally workload that took the worker's
CPU time for 500,000 records from 6.0-7.3 s to 4.2-4.5 s (docs/benchmarks-log.md, "Worker
tuning"). Raising the collection thresholds as well made no measurable difference once
the start-up objects were frozen, and cost memory, so Python's own are kept.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)


def freeze_startup_objects() -> None:
    """Collect what start-up left behind, then keep every object alive now out of later collections."""
    gc.collect()
    gc.freeze()
    log.debug("garbage collector: %d start-up objects frozen", gc.get_freeze_count())
