from __future__ import annotations

import pytest
from pyspark.sql import Row

from spark_jobs.checkpoint import CheckpointState
from spark_jobs.progress import BatchProgress

pytestmark = pytest.mark.spark


@pytest.mark.parametrize(("planned", "committed", "pending"), [(None, None, None), (0, None, 0), (3, 3, None), (4, 3, 4)])
def test_pending_batch_is_the_planned_but_uncommitted_one(planned, committed, pending) -> None:  # type: ignore[no-untyped-def]
    assert CheckpointState("q", planned, committed).pending_batch == pending


def test_batch_progress_from_a_progress_report() -> None:
    report = {
        "batchId": 7,
        "numInputRows": 120,
        "durationMs": {"triggerExecution": 1500, "addBatch": 900},
        "eventTime": {"watermark": "2024-01-10T23:00:00.000Z"},
        "stateOperators": [
            {"operatorName": "dedupe", "numRowsTotal": 3, "numRowsDroppedByWatermark": 0},
            {"operatorName": "symmetricHashJoin", "numRowsTotal": 10, "numRowsDroppedByWatermark": 2},
        ],
        "sources": [
            {"description": "KafkaV2[Subscribe[a]]", "numInputRows": 100},
            {"description": "KafkaV2[Subscribe[b]]", "numInputRows": 20},
        ],
    }
    assert BatchProgress.from_json(report) == BatchProgress(
        batch_id=7,
        input_rows=120,
        duration_ms=1500,
        watermark="2024-01-10T23:00:00.000Z",
        state_rows=13,
        state_rows_by_operator={"0:dedupe": 3, "1:symmetricHashJoin": 10},
        rows_dropped_by_watermark=2,
        sources={"KafkaV2[Subscribe[a]]": 100, "KafkaV2[Subscribe[b]]": 20},
    )


def test_batch_progress_counts_the_records_a_job_skipped() -> None:
    report = {
        "batchId": 2,
        "numInputRows": 9,
        "observedMetrics": {
            "a": {"skipped": 2, "skipped_example": "'occurred_at' must be an integer"},
            "b": Row(skipped=1, skipped_example="'account_id' is longer than 256 characters"),
            "other": {"count": 5},
        },
    }
    batch = BatchProgress.from_json(report)
    assert batch.skipped_rows == 3
    assert batch.skipped_example == "'account_id' is longer than 256 characters"
    assert BatchProgress.from_json({"batchId": 3}).skipped_rows == 0
