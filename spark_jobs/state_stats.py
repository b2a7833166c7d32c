"""Counting a streaming query's state rows with Spark's state data source reader.

``format("state-metadata")`` lists the stateful operators of a checkpoint; for each,
``format("statestore")`` reads the rows it holds at a batch (a stream-stream join per
side, with ``joinSide``). This is the state as stored in the checkpoint, not an estimate
from progress reports.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import SparkSession


@dataclass(frozen=True)
class OperatorState:
    operator_id: int
    operator_name: str
    rows: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.rows.values())


def _is_join(name: str) -> bool:
    return "join" in name.lower()


def state_rows(spark: SparkSession, checkpoint: str, batch_id: int | None = None) -> list[OperatorState]:
    """Rows held by each stateful operator after ``batch_id`` (default: the last committed batch)."""
    meta = spark.read.format("state-metadata").load(checkpoint)
    operators = sorted({(int(r["operatorId"]), str(r["operatorName"])) for r in meta.collect()})
    out = []
    for operator_id, name in operators:
        sides = ["left", "right"] if _is_join(name) else [None]
        rows: dict[str, int] = {}
        for side in sides:
            reader = spark.read.format("statestore").option("operatorId", operator_id)
            if batch_id is not None:
                reader = reader.option("batchId", batch_id)
            if side is not None:
                reader = reader.option("joinSide", side)
            rows[side or "rows"] = reader.load(checkpoint).count()
        out.append(OperatorState(operator_id, name, rows))
    return out


def describe(states: list[OperatorState]) -> str:
    parts = []
    for s in states:
        detail = ", ".join(f"{k} {v}" for k, v in s.rows.items())
        parts.append(f"{s.operator_name}#{s.operator_id}: {detail}")
    return "; ".join(parts) if parts else "no state"
