"""The current table of docs/benchmarks.md, made from the results file:
``python -m tools.bench.report`` rewrites it in place, ``--check`` only says whether it is
current (exit 1 when not).

Each row is the latest entry of one figure in docs/bench-results.jsonl beside the figure's
target. The figures and their targets are declared once, in :data:`FIGURES` (the targets
are the issues' own, as docs/benchmarks-log.md quotes them); a figure with no entry yet
links to its last entry in the log, and a figure the file holds but :data:`FIGURES` does
not declare is listed after them without a target.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.bench.results import REPO, RESULTS, latest, load

PAGE = REPO / "docs" / "benchmarks.md"
LOG = "benchmarks-log.md"
BEGIN = "<!-- bench-table: begin (made by python -m tools.bench.report from bench-results.jsonl; do not edit) -->"
END = "<!-- bench-table: end -->"

OPERATORS: dict[str, Callable[[float, float], bool]] = {"≥": operator.ge, ">": operator.gt, "≤": operator.le, "<": operator.lt}


@dataclass(frozen=True)
class Target:
    """``<op> <value>`` of the figure's value, or of its ratio to the baseline (``of_ratio``)."""

    op: str
    value: float
    of_ratio: bool = False
    #: Where the target comes from, when the log names it.
    source: str = ""

    def met(self, entry: dict[str, Any]) -> bool | None:
        measured = entry.get("ratio") if self.of_ratio else entry["value"]
        return None if measured is None else OPERATORS[self.op](measured, self.value)

    def text(self, unit: str) -> str:
        what = f"{self.value:g}{TIMES} the baseline" if self.of_ratio else f"{_number(self.value)} {unit}"
        return f"{self.op} {what}" + (f" ({self.source})" if self.source else "")


@dataclass(frozen=True)
class Figure:
    id: str
    title: str
    unit: str
    #: The log's section with this figure's last hand-written measurement.
    log_anchor: str
    target: Target | None = None


PEERS = "peers-kafka-streams-and-quix-streams-on-the-same-tallies"
VALIDATOR = "validator-benchmark"
RETRY = "retry-scheduler-measured-figures"
SCALEOUT = "scale-out-tallies"
SPARK = "spark-job-figures"

FIGURES: tuple[Figure, ...] = (
    Figure(
        "peers.statefleet_vs_kafka_streams",
        "the tally workload: statefleet, baseline Kafka Streams",
        "records/s",
        PEERS,
        Target("≥", 1.0, of_ratio=True),
    ),
    Figure("peers.statefleet", "the tally workload: statefleet, baseline the bare consumer", "records/s", PEERS),
    Figure("peers.kafka-streams", "the tally workload: Kafka Streams", "records/s", PEERS),
    Figure("peers.quix-streams", "the tally workload: Quix Streams", "records/s", PEERS),
    Figure("peers.statefleet.peak_rss", "the tally workload: statefleet's peak RSS", "MiB", PEERS),
    Figure(
        "ceiling.engine",
        "an engine handler that only counts",
        "events/s",
        "the-per-record-ceiling-faust-agent-and-engine-handler",
        Target("≥", 0.3, of_ratio=True),
    ),
    Figure(
        "ceiling.faust", "a Faust agent that only counts", "events/s", "the-per-record-ceiling-faust-agent-and-engine-handler"
    ),
    Figure("tallies.one_worker", "tallies: one worker", "events/s", "tallies", Target("≥", 50_000)),
    Figure(
        "validator.backlog",
        "validator: one worker decides a backlog",
        "commands/s",
        VALIDATOR,
        Target("≥", 35_000, source="the engine issue"),
    ),
    Figure(
        "validator.latency_p99@1000",
        "validator: latency p99 at 1,000/s",
        "ms",
        VALIDATOR,
        Target("≤", 20, source="the engine issue"),
    ),
    Figure(
        "validator.latency_p99@5000",
        "validator: latency p99 at 5,000/s",
        "ms",
        VALIDATOR,
        Target("<", 50, source="the engine issue"),
    ),
    Figure(
        "validator.caught_up",
        "validator: outcomes and projection caught up after the last decision",
        "s",
        VALIDATOR,
        Target("<", 1, source="the engine issue"),
    ),
    Figure(
        "retry_scheduler.burst_scheduled@1000000",
        "retry scheduler, 1,000,000 stored: burst read and scheduled",
        "dead letters/s",
        RETRY,
        Target("≥", 30_000, source="the dead-letter issue"),
    ),
    Figure(
        "retry_scheduler.burst_redelivered@1000000",
        "retry scheduler, 1,000,000 stored: burst redelivered",
        "records/s",
        RETRY,
        Target("≥", 30_000, source="the dead-letter issue"),
    ),
    Figure(
        "retry_scheduler.burst_lateness_p99@1000000",
        "retry scheduler, 1,000,000 stored: burst lateness p99",
        "s",
        RETRY,
        Target("<", 1, source="the dead-letter issue"),
    ),
    Figure(
        "retry_scheduler.service_tick@1000000",
        "retry scheduler: the service's tick, 1,000,000 stored, baseline 1,000 stored",
        "ms",
        RETRY,
        Target("≤", 1.5, of_ratio=True, source="issue #25"),
    ),
    Figure(
        "retry_scheduler.peak_rss@1000000",
        "retry scheduler, 1,000,000 stored: worker peak RSS",
        "MiB",
        "at-1000000-stored-memory-ticks-and-ingest-2026-11-25",
        Target("≤", 400, source="the dead-letter issue"),
    ),
    Figure(
        "failover.first_record",
        "failover: SIGKILL to the first record processed on the victim's partitions",
        "s",
        "failover-of-a-dead-instance",
        Target("≤", 3),
    ),
    Figure(
        "failover.programs_answered",
        "failover: SIGKILL to every program of the victim answered",
        "s",
        "failover-of-a-dead-instance",
    ),
    Figure(
        "rebalance_pause.warmups_on",
        "longest processing pause while an instance joins",
        "s",
        "processing-pauses-while-an-instance-joins",
    ),
    Figure("availability.sigkill.failed", "reads failed while one of 3 is SIGKILLed", "reads", "reads-under-failure-tallies"),
    Figure("scaleout.query_forwarded_p99", "a point query forwarded to the owner, p99", "ms", SCALEOUT),
    Figure("scaleout.cold_restart_bulk", "cold restart (data dir deleted), bulk restore", "s", SCALEOUT),
    Figure(
        "retry_scheduler.restore@1000000",
        "retry scheduler, 1,000,000 stored: cold restore from the changelogs",
        "records/s",
        RETRY,
        Target("≥", 200_000, source="the state-identity issue"),
    ),
    Figure("spark.join", "Spark: the activation join", "events/s", SPARK),
    Figure("spark.backfill", "Spark: the tallies backfill", "rows/s", SPARK),
)

DASH, TIMES = "\N{EN DASH}", "\N{MULTIPLICATION SIGN}"


def _number(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) >= 1 else f"{value:.2g}"


def _measured(entry: dict[str, Any]) -> str:
    load = entry.get("load_start") or [None]
    end = entry.get("load_end") or [None]
    dirty = "+" if entry.get("dirty") else ""
    sha = (entry.get("commit") or "?")[:9]
    return f"{entry['date'][:16].replace('T', ' ')} UTC, `{sha}{dirty}`, load {load[0]}→{end[0]}"


def _row(figure: Figure | None, figure_id: str, entry: dict[str, Any] | None) -> str:
    title = figure.title if figure else figure_id
    target = figure.target if figure else None
    unit = figure.unit if figure else (entry or {}).get("unit", "")
    target_text = target.text(unit) if target else DASH
    if entry is None:
        anchor = figure.log_anchor if figure else ""
        return (
            f"| {title} | not measured since the results file ([last log entry]({LOG}#{anchor})) "
            f"| {DASH} | {DASH} | {target_text} | {DASH} |"
        )
    value = f"**{_number(entry['value'])} {entry['unit']}**"
    if entry.get("note"):
        value += f" ({entry['note']})"
    baseline = f"{_number(entry['baseline'])} {entry['unit']}" if entry.get("baseline") is not None else DASH
    ratio = f"{entry['ratio']:.2f}{TIMES}" if entry.get("ratio") is not None else DASH
    if target:
        met = target.met(entry)
        target_text += {True: ": **met**", False: ": **not met**", None: ""}[met]
    return f"| {title} | {value} | {baseline} | {ratio} | {target_text} | {_measured(entry)} |"


def table(entries: Sequence[dict[str, Any]]) -> str:
    """The table: the declared figures in order, then any other figure the entries hold."""
    last = latest(entries)
    declared = {f.id for f in FIGURES}
    rows = [_row(f, f.id, last.get(f.id)) for f in FIGURES]
    rows += [_row(None, fid, last[fid]) for fid in sorted(last) if fid not in declared]
    head = [
        "| figure | latest | baseline, same run | ratio | target | measured (UTC, commit, load average start→end) |",
        "|---|---|---|---|---|---|",
    ]
    return "\n".join(head + rows)


def rewrite(page: str, entries: Sequence[dict[str, Any]]) -> str:
    """``page`` with the text between the markers replaced by :func:`table`."""
    start, end = page.index(BEGIN) + len(BEGIN), page.index(END)
    return page[:start] + "\n" + table(entries) + "\n" + page[end:]


def main(argv: list[str], page_path: Path = PAGE, results_path: Path = RESULTS) -> int:
    page = page_path.read_text()
    made = rewrite(page, load(results_path))
    if "--check" in argv:
        if made != page:
            print(f"{page_path} is not the table of {results_path}: run python -m tools.bench.report", file=sys.stderr)
            return 1
        return 0
    if made != page:
        page_path.write_text(made)
        print(f"[bench] table of {page_path} rewritten from {results_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
