"""The backfill of another projection than the accounts': the orders example's rows per customer,
rebuilt from a history of order events on the real broker with ``--projection``, equal the
contract's rows and what the live tallies service running that projection answers."""

from __future__ import annotations

import json
import random
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from spark_jobs import backfill_tallies
from tests.support.kafka import create_topics, produce, read_all
from tests.support.orders import expected_rows, history
from tests.support.services import ServiceProcess, wait_for
from tools import web

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.e2e]

PROJECTION = "examples.orders.projection:PROJECTION"


def test_backfill_of_the_orders_projection_equals_the_contract_and_the_live_service(
    spark, job_env, prefix, service_env, tmp_path: Path, capsys
) -> None:  # type: ignore[no-untyped-def]
    events = history(seed=8, orders=30, customers=4)
    expected = expected_rows(events)
    topic = f"{prefix}order-events"
    create_topics([topic], partitions=2)
    rng = random.Random(2)
    produce(topic, [(e["aggregate_id"], orjson.dumps(e)) for e in events])
    produce(topic, [(e["aggregate_id"], orjson.dumps(e)) for e in rng.sample(events, 10)])  # delivered twice
    # Every order's history again, newest version first: older versions arrive late.
    produce(topic, [(e["aggregate_id"], orjson.dumps(e)) for e in sorted(events, key=lambda e: -e["version"])])
    produce(topic, [("bad", b'{"type": "OrderPlaced", "aggregate_id": "o-bad"}')])  # no version, no data

    env = {**service_env, "STATEFLEET_TALLIES_PROJECTION": PROJECTION, "STATEFLEET_TOPIC_PARTITIONS": "2"}
    service = ServiceProcess(module="tallies", env=env, log_path=tmp_path / "tallies.log").start()
    try:
        service.wait_ready()

        def live() -> dict[str, object]:
            items = web.get(f"{service.url}/tallies", params={"limit": 1000}, timeout=5).json()["items"]
            return {row["key"]: row for row in items}

        wait_for(lambda: live() == expected, timeout=90, message="the tallies service to read every order event")
        output = tmp_path / "backfill"
        backfill_tallies.main(
            [
                *("--projection", PROJECTION, "--output", str(output)),
                *("--publish-topic", "order-tallies-backfill", "--verify-against", service.url),
            ]
        )
    finally:
        service.stop()
    assert f"backfill equals {service.url}: {len(expected)} keys" in capsys.readouterr().out

    # Parquet: one column per field of the projection's row model.
    table = pq.read_table(output)
    assert table.column_names == ["key", "open", "shipped", "cancelled", "revenue_cents"]
    assert table.to_pylist() == [expected[c] for c in sorted(expected)]
    manifest = json.loads((output / "_manifest.json").read_text())
    assert manifest["projection"] == "orders"
    assert manifest["input_records"] == 2 * len(events) + 10 + 1
    assert manifest["invalid_records"] == 1
    assert manifest["programs"] == len(expected)
    published = {(r.key or b"").decode(): json.loads(r.value or b"null") for r in read_all(f"{prefix}order-tallies-backfill")}
    assert published == expected
