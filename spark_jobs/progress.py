"""One readable log line per micro-batch of a streaming query, and a record of the
progress reports for figures (input rows, rates, watermark, state rows)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming.listener import StreamingQueryListener

log = logging.getLogger(__name__)


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

    @classmethod
    def from_json(cls, progress: dict[str, Any]) -> BatchProgress:
        operators = progress.get("stateOperators") or []
        by_operator = {f"{i}:{op.get('operatorName', '?')}": int(op.get("numRowsTotal", 0))
                       for i, op in enumerate(operators)}
        sources = {str(s.get("description", "?")): int(s.get("numInputRows", 0)) for s in progress.get("sources") or []}
        return cls(
            batch_id=int(progress.get("batchId", -1)),
            input_rows=int(progress.get("numInputRows", 0)),
            duration_ms=int((progress.get("durationMs") or {}).get("triggerExecution", 0)),
            watermark=(progress.get("eventTime") or {}).get("watermark"),
            state_rows=sum(by_operator.values()),
            state_rows_by_operator=by_operator,
            rows_dropped_by_watermark=sum(int(op.get("numRowsDroppedByWatermark", 0)) for op in operators),
            sources=sources,
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
            self.name, batch.batch_id, batch.input_rows, batch.duration_ms / 1000, rate,
            batch.watermark or "-", batch.state_rows,
            f", {batch.rows_dropped_by_watermark} late rows dropped" if batch.rows_dropped_by_watermark else "",
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
