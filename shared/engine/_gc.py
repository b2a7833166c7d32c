"""CPython's garbage collector, set for a worker that allocates per record.

A batch handler allocates several short-lived objects per input record (decoded JSON,
tuples, the fetched records themselves). With CPython's default thresholds (700, 10,
10) the young generation is collected every few hundred allocations, and every 100th
collection walks every object of the process again: the modules, Faust's services,
the tables, none of which will ever be garbage. On the tally workload that work took
about a fifth of the worker's time (docs/benchmarks.md, "Garbage collection").

So the worker collects its young generation less often (``STATEFLEET_GC_THRESHOLDS``),
and, once it has started, moves everything allocated during start-up out of the
collector's sight (``gc.freeze``), so that the rare full collections walk only what
processing allocated since. Reference counting still frees acyclic garbage at once;
the thresholds only space out the search for cycles.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)


def set_thresholds(thresholds: tuple[int, int, int]) -> None:
    gc.set_threshold(*thresholds)


def freeze_startup_objects() -> None:
    """Collect what start-up left behind, then keep every object alive now out of later collections."""
    gc.collect()
    gc.freeze()
    log.debug("garbage collector: %d start-up objects frozen; thresholds %s", gc.get_freeze_count(), gc.get_threshold())
