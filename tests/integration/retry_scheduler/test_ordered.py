"""Ordered retries on the real broker: a user's consumer on the client module
(shared.retry_client) fails twice on one record of a key; the scheduler holds that key's later
records behind it and releases them one at a time on the consumer's acknowledgements, so the
key's records are processed in their order while another key goes on; then the key is free."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from shared import dead_letters as dl
from shared.engine import partition_for
from shared.ordered_retries import HELD_BEHIND, lane_key
from shared.retry_client import ConsumedRecord, OrderedRetryConsumer
from shared.settings import Settings
from tests.integration.retry_scheduler.helpers import (
    PARTITIONS,
    Scheduler,
    letter_headers,
    new_id,
    records_for,
    scheduler_env,
    send_letter,
    start_scheduler,
)
from tests.support.kafka import create_topics, produce, read_all, unconsumed
from tests.support.services import wait_for

pytestmark = pytest.mark.integration

#: The scheduler's HTTP port (this test's range).
PORT = 19531


@pytest.fixture(scope="module")
def ordered_scheduler(kafka_bootstrap: str, module_prefix: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scheduler]:
    prefix = module_prefix
    tmp_path = tmp_path_factory.mktemp("ordered")
    names = ["dead-letters", "retry", "parking-lot", "retry-acks", "orders", "slow", "retry-orders"]
    create_topics([prefix + n for n in names])
    create_topics([f"{prefix}retry-blocked-keys"], compacted=[f"{prefix}retry-blocked-keys"])
    # "slow" waits ten minutes between attempts (the helpers' policy override): a head that stays scheduled.
    env = scheduler_env(kafka_bootstrap, prefix, tmp_path / "data", retry_ordered_topics="orders,slow")
    proc = start_scheduler(env, tmp_path, port=PORT)
    yield Scheduler(proc, prefix)
    proc.kill()


class RunningConsumer:
    """An :class:`OrderedRetryConsumer` on a thread of its own, with a handler that fails on
    the values given (as many times as given) and records what it processed."""

    def __init__(self, settings: Settings, failing: dict[bytes, int]) -> None:
        prefix = settings.topic_prefix
        self.failing = failing
        self.processed: list[bytes] = []
        self.consumer = OrderedRetryConsumer(
            settings, topic=f"{prefix}orders", retry_topic=f"{prefix}retry-orders", group_id=f"{prefix}users", handler=self.handle
        )
        self.running = threading.Event()
        self.thread = threading.Thread(target=asyncio.run, args=(self._run(),), daemon=True)

    async def handle(self, record: ConsumedRecord) -> None:
        value = record.value or b""
        if self.failing.get(value, 0):
            self.failing[value] -= 1
            raise ConnectionError("downstream unavailable")
        self.processed.append(value)

    async def _run(self) -> None:
        self.stop, self.loop = asyncio.Event(), asyncio.get_running_loop()
        self.running.set()
        await self.consumer.run(self.stop)

    def __enter__(self) -> RunningConsumer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.running.wait(timeout=10):
            self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(timeout=30)


def test_a_keys_records_are_processed_in_order_through_failures(ordered_scheduler: Scheduler, kafka_bootstrap: str) -> None:
    s = ordered_scheduler
    settings = Settings(kafka_bootstrap_servers=kafka_bootstrap, topic_prefix=s.prefix)
    records = [(b"k", b"k-1"), (b"k", b"k-2"), (b"j", b"j-1"), (b"k", b"k-3"), (b"k", b"k-4"), (b"j", b"j-2")]
    with RunningConsumer(settings, failing={b"k-2": 2}) as consumer:
        for key, value in records:
            produce(f"{s.prefix}orders", [(key, value)])
        wait_for(lambda: len(consumer.processed) == len(records), timeout=60, message="every record processed")
        lane = lane_key(f"{s.prefix}orders", b"k")
        wait_for(
            lambda: s.get("/ordered-keys", origin_topic=f"{s.prefix}orders", key="k").status_code == 404,
            timeout=30,
            message="the key free again",
        )
        # Committed past every record once the scheduler took their letters in (and not before).
        wait_for(
            lambda: unconsumed(f"{s.prefix}users", [f"{s.prefix}orders", f"{s.prefix}retry-orders"]) == 0,
            timeout=30,
            message="every record committed",
        )
    assert [v for v in consumer.processed if v.startswith(b"k")] == [b"k-1", b"k-2", b"k-3", b"k-4"]
    assert [v for v in consumer.processed if v.startswith(b"j")] == [b"j-1", b"j-2"]
    assert consumer.processed.index(b"j-2") < consumer.processed.index(b"k-2")  # the other key did not wait
    blocked = [r for r in read_all(f"{s.prefix}retry-blocked-keys") if r.key == lane]
    assert blocked and blocked[-1].value is None


def test_an_operator_sees_a_parked_head_and_skips_it_to_release_the_next(ordered_scheduler: Scheduler) -> None:
    s = ordered_scheduler
    origin, retry_topic = f"{s.prefix}orders", f"{s.prefix}retry-orders"
    head, held = new_id("head"), new_id("held")
    # Out of attempts (4): parked at once, and the key's head.
    send_letter(s, b"p", b"p-1", letter_headers(head, retry_topic, attempt=4, origin=origin))
    deferred = [*letter_headers(held, retry_topic, attempt=0, origin=origin), (HELD_BEHIND, head.encode())]
    send_letter(s, b"p", b"p-2", deferred)

    def lane() -> dict[str, object]:
        response = s.get("/ordered-keys", origin_topic=origin, key="p")
        return response.json() if response.status_code == 200 else {}

    wait_for(lambda: lane().get("held") == 1, timeout=30, message="the second record held")
    assert lane() == {"head": head, "head_status": "parked", "held": 1, "held_ids": [held]}
    listed = s.get("/ordered-keys/blocked", origin_topic=origin).json()
    assert listed == {
        "items": [{"origin_topic": origin, "key": "p", "key_base64": "cA==", "head": head, "head_status": "parked", "held": 1}],
        "next_cursor": None,
    }
    stats = s.get("/retries/stats").json()
    assert (stats["blocked_keys"], stats["held"], stats["parked"]) == (1, 1, 1)
    query = f"?origin_topic={origin}&key=p"
    assert s.admin("POST", f"/ordered-keys/skip-head{query}", token=None).status_code == 401
    skipped = s.admin("POST", f"/ordered-keys/skip-head{query}")
    assert skipped.status_code == 200
    assert skipped.json() == {"status": "skipped", "head": held, "skipped": head, "parked": None, "continuing": None}
    wait_for(lambda: len(records_for(retry_topic, held)) == 1, timeout=30, message="the held record redelivered")
    [released] = records_for(retry_topic, held)
    assert released.value == b"p-2" and dict(released.headers)[dl.ATTEMPT] == b"0"
    assert s.get("/retries/stats").json()["parked"] == 0  # skipped: dropped from the parked, never redelivered
    assert s.admin("POST", f"/ordered-keys/replay-head{query}").status_code == 409  # the new head is out, not parked
    produce(f"{s.prefix}retry-acks", [(lane_key(origin, b"p"), held.encode())])
    wait_for(lambda: s.get("/ordered-keys", origin_topic=origin, key="p").status_code == 404, timeout=30, message="key free")
    assert records_for(retry_topic, head) == []


def id_away_from(lane: bytes, label: str) -> str:
    """A new id whose own partition is not its lane's: found only where the lane is."""
    while partition_for((dlq_id := new_id(label)).encode(), PARTITIONS) == partition_for(lane, PARTITIONS):
        pass
    return dlq_id


def test_calls_by_id_find_a_letter_of_an_ordered_topic_in_its_keys_partition(ordered_scheduler: Scheduler) -> None:
    s = ordered_scheduler
    retry_topic = f"{s.prefix}retry-orders"
    slow, orders = f"{s.prefix}slow", f"{s.prefix}orders"

    # A scheduled head (ten minutes away) with a record held behind it.
    head, held = id_away_from(lane_key(slow, b"c"), "head"), new_id("held")
    send_letter(s, b"c", b"c-1", letter_headers(head, retry_topic, attempt=1, origin=slow))
    send_letter(s, b"c", b"c-2", [*letter_headers(held, retry_topic, attempt=0, origin=slow), (HELD_BEHIND, head.encode())])
    wait_for(
        lambda: s.get(f"/retries/{held}").status_code == 404 and head in s.get(f"/retries/{held}").text,
        timeout=30,
        message="the second record held behind the head",
    )
    assert "waits behind" in s.get(f"/retries/{held}").json()["detail"]
    got = s.get(f"/retries/{head}")
    assert got.status_code == 200 and got.json()["id"] == head and got.json()["attempt"] == 1
    cancelled = s.admin("DELETE", f"/retries/{head}")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    wait_for(lambda: len(records_for(retry_topic, held)) == 1, timeout=30, message="the held record released")
    assert records_for(retry_topic, head) == [] and "cancelled" in s.get(f"/retries/{head}").json()["detail"]

    # A parked head, replayed by its id.
    parked = id_away_from(lane_key(orders, b"d"), "parked")
    send_letter(s, b"d", b"d-1", letter_headers(parked, retry_topic, attempt=4, origin=orders))
    wait_for(lambda: s.get(f"/parked/{parked}").status_code == 200, timeout=30, message="the head parked, found by its id")
    assert s.get(f"/parked/{parked}").json()["attempt"] == 4
    replayed = s.admin("POST", f"/parked/{parked}/replay")
    assert replayed.status_code == 200 and replayed.json()["status"] == "redelivered"
    wait_for(lambda: len(records_for(retry_topic, parked)) == 1, timeout=30, message="the parked head redelivered")
    assert s.get("/ordered-keys", origin_topic=orders, key="d").json()["head_status"] == "away"
    assert s.get(f"/parked/{new_id('nowhere')}").status_code == 404
