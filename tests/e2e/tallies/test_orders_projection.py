"""The orders example projection (``examples/orders/projection.py``) on the tallies service and a
real broker: order events produced straight to ``order-events`` (under the test's topic prefix)
give exact rows per customer over ``GET /tallies/{customer_id}``, the listing and the compacted
``order-tallies`` topic, whatever is duplicated, replayed or re-ordered, and after a SIGKILL
mid-stream, under both processing guarantees."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from shared import dead_letters as dl
from tests.e2e.tallies.test_tallies_crash import applied
from tests.e2e.tallies.test_tallies_e2e import all_tallies, latest_published, repeated_tallies
from tests.support.kafka import create_topics, produce, read_all, unconsumed
from tests.support.orders import expected_rows, history
from tests.support.services import ServiceProcess, free_port, wait_for
from tools import web

pytestmark = pytest.mark.e2e

PROJECTION = "examples.orders.projection:PROJECTION"


@pytest.fixture
def order_topics(prefix: str) -> dict[str, str]:
    names = {"events": f"{prefix}order-events", "tallies": f"{prefix}order-tallies", "dead_letters": f"{prefix}dead-letters"}
    create_topics(names.values(), compacted=[names["tallies"]])
    return names


def start(env: dict[str, str], log: Path, port: int) -> ServiceProcess:
    return ServiceProcess("tallies", env, log, port=port).start().wait_ready()


def records(events: list[dict[str, Any]]) -> list[tuple[str, bytes]]:
    return [(e["aggregate_id"], orjson.dumps(e)) for e in events]


def all_rows(proc: ServiceProcess) -> dict[str, dict[str, Any]]:
    return all_tallies(proc, limit=5, key="key")


def rows_settle(proc: ServiceProcess, expected: dict[str, dict[str, Any]], timeout: float = 90) -> None:
    def right() -> bool:
        try:
            return all_rows(proc) == expected
        except Exception:  # refused while partitions move (503)
            return False

    wait_for(right, timeout=timeout, message="every customer's row to match")
    prefix = proc.env["STATEFLEET_TOPIC_PREFIX"]
    inputs = [f"{prefix}order-events", f"{prefix}retry-tallies-orders", f"{prefix}statefleet-tallies-orders-by-program"]
    group = f"{prefix}statefleet-tallies-orders"
    wait_for(lambda: unconsumed(group, inputs) == 0, timeout=60, message="every input record consumed")
    assert all_rows(proc) == expected  # nothing still to come changed them


def test_rows_per_customer_over_http_and_the_topic_with_duplicates_and_replays(
    service_env: dict[str, str], order_topics: dict[str, str], tmp_path: Path
) -> None:
    events = history(seed=21, orders=120, customers=9)
    expected = expected_rows(events)
    env = {**service_env, "STATEFLEET_TALLIES_PROJECTION": PROJECTION, "STATEFLEET_INSTANCE_ID": "a"}
    proc = start(env, tmp_path / "tallies.log", free_port())
    rng = random.Random(4)
    produce(order_topics["events"], records(events))
    produce(order_topics["events"], records(rng.sample(events, 40)))  # duplicates
    produce(order_topics["events"], [("bad", b'{"type": "OrderPlaced", "aggregate_id": "o-bad"}')])
    rows_settle(proc, expected)
    for customer in list(expected)[:4]:
        got = web.get(f"{proc.url}/tallies/{customer}", timeout=5)
        assert got.status_code == 200 and got.json() == expected[customer]
        assert set(got.json()) == {"key", "open", "shipped", "cancelled", "revenue_cents"}
    missing = web.get(f"{proc.url}/tallies/no-such-customer", timeout=5)
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    assert "/tallies/{key}" in web.get(f"{proc.url}/openapi.json", timeout=5).json()["paths"]

    # The whole history replayed, each order's events in reverse (older versions arrive late).
    produce(order_topics["events"], records(sorted(events, key=lambda e: -e["version"])))
    rows_settle(proc, expected)
    wait_for(lambda: latest_published(order_topics["tallies"]) == expected, timeout=30, message="order-tallies to hold the rows")
    letters = wait_for(lambda: read_all(order_topics["dead_letters"]), timeout=30, message="the dead letter")
    assert [r.key for r in letters] == [b"bad"]
    headers = dict(letters[0].headers)
    assert headers[dl.ERROR_CLASS] == b"InvalidInput"
    assert headers[dl.ORIGINAL_TOPIC] == order_topics["events"].encode()
    proc.stop()


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_sigkill_mid_stream_keeps_exact_rows(
    service_env: dict[str, str], order_topics: dict[str, str], tmp_path: Path, guarantee: str
) -> None:
    events = history(seed=5, orders=3000, customers=40)
    expected = expected_rows(events)
    env = {
        **service_env,
        "STATEFLEET_TALLIES_PROJECTION": PROJECTION,
        "STATEFLEET_INSTANCE_ID": "a",
        "STATEFLEET_PROCESSING_GUARANTEE": guarantee,
    }
    port = free_port()
    proc = start(env, tmp_path / "tallies-0.log", port)
    half = len(events) // 2
    produce(order_topics["events"], records(events[:half]))
    wait_for(lambda: applied(proc, "tallies-orders") > 0, timeout=30, message="the first records applied")
    proc.kill()  # mid-stream: some of the first half applied, likely not all
    proc = start(env, tmp_path / "tallies-1.log", port)
    produce(order_topics["events"], records(events[half:] + events[: half // 2]))  # the rest, and a replay
    wait_for(lambda: applied(proc, "tallies-orders") > 0, timeout=30, message="the restarted worker applying records")
    proc.kill()  # mid-stream again: the restarted worker has applied some of its backlog
    proc = start(env, tmp_path / "tallies-2.log", port)
    rows_settle(proc, expected, timeout=120)
    if guarantee == "exactly_once":
        wait_for(
            lambda: latest_published(order_topics["tallies"], isolation_level="read_committed") == expected,
            timeout=30,
            message="order-tallies (read committed) to hold the rows",
        )
        assert repeated_tallies(order_topics["tallies"]) == []
    else:
        wait_for(lambda: latest_published(order_topics["tallies"]) == expected, timeout=30, message="order-tallies rows")
    proc.kill()
