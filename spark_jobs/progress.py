"""One readable log line per micro-batch of a streaming query, and a record of the
progress reports for figures (input rows, rates, watermark, state rows, records skipped).

A job reports the input records it skips as malformed through :func:`observe_skipped`
(Spark's ``DataFrame.observe``): each batch's progress report then carries how many it
skipped and one reason, logged as a warning and kept in :attr:`BatchProgress.skipped_rows`."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.listener import StreamingQueryListener

log = logging.getLogger(__name__)

#: The columns of an observation made by :func:`observe_skipped`.
SKIPPED = "skipped"
SKIPPED_EXAMPLE = "skipped_example"


def observe_skipped(rows: DataFrame, name: str, error: Column) -> DataFrame:
    """``rows`` observed as ``name``: per batch, how many have a non-null ``error`` (records the
    job skips) and one of those errors."""
    return rows.observe(name, F.count(error).alias(SKIPPED), F.max(error).alias(SKIPPED_EXAMPLE))


@dataclass(frozen=True)
class BatchProgress:
    batch_id: int
    input_rows: int
    duration_ms: int
    watermark: str | None
    state_rows: int
    state_rows_by_operator: dict[str, int]
    rows_dropped_by_watermark: int
    sources: dict[str, int]
    #: Input records skipped as malformed (summed over the query's :func:`observe_skipped`
    #: observations), and one reason.
    skipped_rows: int = 0
    skipped_example: str | None = None

    @classmethod
    def from_json(cls, progress: dict[str, Any]) -> BatchProgress:
        operators = progress.get("stateOperators") or []
        by_operator = {f"{i}:{op.get('operatorName', '?')}": int(op.get("numRowsTotal", 0)) for i, op in enumerate(operators)}
        sources = {str(s.get("description", "?")): int(s.get("numInputRows", 0)) for s in progress.get("sources") or []}
        # Rows when ``progress`` is a StreamingQueryProgress (a dict), objects when it is parsed JSON.
        metrics = [m.asDict() if hasattr(m, "asDict") else m for m in (progress.get("observedMetrics") or {}).values()]
        observed = [m for m in metrics if isinstance(m, dict) and SKIPPED in m]
        examples = [str(m[SKIPPED_EXAMPLE]) for m in observed if m.get(SKIPPED_EXAMPLE) is not None]
        return cls(
            batch_id=int(progress.get("batchId", -1)),
            input_rows=int(progress.get("numInputRows", 0)),
            duration_ms=int((progress.get("durationMs") or {}).get("triggerExecution", 0)),
            watermark=(progress.get("eventTime") or {}).get("watermark"),
            state_rows=sum(by_operator.values()),
            state_rows_by_operator=by_operator,
            rows_dropped_by_watermark=sum(int(op.get("numRowsDroppedByWatermark", 0)) for op in operators),
            sources=sources,
            skipped_rows=sum(int(m[SKIPPED] or 0) for m in observed),
            skipped_example=min(examples) if examples else None,
        )


class ProgressLog(StreamingQueryListener):
    """Logs each batch of the queries named ``name`` and keeps their progress."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.batches: list[BatchProgress] = []

    def onQueryStarted(self, event: Any) -> None:
        if event.name == self.name:
            log.info("%s started (query id %s, run %s)", self.name, event.id, event.runId)

    def onQueryProgress(self, event: Any) -> None:
        progress = json.loads(event.progress.json)
        if progress.get("name") != self.name:
            return
        batch = BatchProgress.from_json(progress)
        self.batches.append(batch)
        rate = batch.input_rows / (batch.duration_ms / 1000) if batch.duration_ms else 0.0
        log.info(
            "%s batch %d: %d input rows in %.1fs (%.0f rows/s), watermark %s, %d state rows%s",
            self.name,
            batch.batch_id,
            batch.input_rows,
            batch.duration_ms / 1000,
            rate,
            batch.watermark or "-",
            batch.state_rows,
            f", {batch.rows_dropped_by_watermark} late rows dropped" if batch.rows_dropped_by_watermark else "",
        )
        if batch.skipped_rows:
            log.warning(
                "%s batch %d: %d malformed input records skipped, e.g. %s",
                self.name,
                batch.batch_id,
                batch.skipped_rows,
                batch.skipped_example,
            )

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        if event.exception:
            log.error("streaming query %s failed: %s", event.id, event.exception)


def batches_of(query: Any) -> list[BatchProgress]:
    """The progress of a query's recent batches (complete once the query has stopped)."""
    return [BatchProgress.from_json(p if isinstance(p, dict) else json.loads(p.json)) for p in query.recentProgress]


def attach(spark: SparkSession, name: str) -> ProgressLog:
    listener = ProgressLog(name)
    spark.streams.addListener(listener)
    return listener


def detach(spark: SparkSession, listener: ProgressLog) -> None:
    spark.streams.removeListener(listener)
