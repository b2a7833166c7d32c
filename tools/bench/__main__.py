"""Run the benchmarks: ``python -m tools.bench [area ...] [-- area args]``.

Areas: faust_ceiling, tallies, scaleout, availability, failover, rebalance_pause, validator, retry_scheduler, spark,
peers. With no area named, all of them run in that order with their default sizes. Every
figure measured is appended to docs/bench-results.jsonl (tools/bench/results.py).
"""

from __future__ import annotations

import importlib
import signal
import sys

from tools.bench import results

AREAS = (
    "faust_ceiling",
    "tallies",
    "scaleout",
    "availability",
    "failover",
    "rebalance_pause",
    "validator",
    "retry_scheduler",
    "spark",
    "peers",
)


def main(argv: list[str]) -> int:
    # SIGTERM (a timeout, a stopped job) unwinds like Ctrl-C: the areas stop their workers and
    # delete their topics, and the figures measured by then reach the results file.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    names: list[str] = []
    while argv and not argv[0].startswith("-"):
        names.append(argv.pop(0))
    names = names or list(AREAS)
    extra = argv
    for name in names:
        if name not in AREAS:
            print(f"unknown benchmark area {name!r}; choose from {', '.join(AREAS)}", file=sys.stderr)
            return 2
        try:
            module = importlib.import_module(f"tools.bench.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"tools.bench.{name}":
                print(f"[bench] {name}: not available, skipped")
                continue
            raise
        print(f"\n[bench] ===== {name} =====", flush=True)
        with results.session(name):
            module.main(extra)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
