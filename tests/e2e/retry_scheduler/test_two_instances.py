"""Two scheduler instances share the partitions: every scheduled or parked message can be
read, listed, replayed and cancelled through either instance, and a group of parked
messages counted and cancelled through either."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared import dead_letters as dl
from shared.engine import partition_for
from tests.integration.retry_scheduler.helpers import TOKEN, letter_headers, scheduler_env, start_scheduler
from tests.support.kafka import create_topics, produce, read_all
from tests.support.services import wait_for
from tools import web

pytestmark = pytest.mark.e2e

PARTITIONS = 8  # the default STATEFLEET_TOPIC_PARTITIONS, which the schedulers here keep


def get(url: str, path: str, **params: Any) -> httpx.Response:
    return web.get(url + path, params=params, timeout=10)


def list_all(url: str, path: str) -> list[str]:
    ids: list[str] = []
    cursor = None
    while True:
        page = get(url, path, limit=9, **({"cursor": cursor} if cursor else {})).json()
        ids.extend(item["id"] for item in page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            return ids


def parked_ids_on_both(url: str, prefix: str) -> list[str]:
    """Six ids of letters to park: the first any, the other five (the group the test counts and
    cancels through either instance) on partitions of both instances, as ``url`` reports its own
    (five random ids all land on one instance's half of the partitions one time in sixteen)."""
    view = web.get(url + "/instance", timeout=10).json()
    mine = set(view["active"][f"{prefix}statefleet-retry_scheduler-parked-changelog"])
    ids: list[str] = [f"bad-0-{uuid.uuid4().hex[:6]}"]
    wanted = {True: 3, False: 2}  # on this instance's partitions, on the other's
    n = 1
    while any(wanted.values()):
        candidate = f"bad-{n}-{uuid.uuid4().hex[:6]}"
        here = partition_for(candidate, PARTITIONS) in mine
        if wanted[here]:
            wanted[here] -= 1
            ids.append(candidate)
            n += 1
    return ids


def test_any_instance_answers_for_every_message(kafka_bootstrap: str, prefix: str, tmp_path: Path) -> None:
    dead, retry = f"{prefix}dead-letters", f"{prefix}retry-two"
    create_topics([dead, retry, f"{prefix}parking-lot"])
    env = scheduler_env(kafka_bootstrap, prefix, tmp_path / "data")
    a = start_scheduler(env, tmp_path, instance="a")
    b = start_scheduler(env, tmp_path, instance="b")
    try:

        def both_ready() -> bool:
            try:
                return all(get(p.url, "/retries/stats").json().get("instances") == 2 for p in (a, b))
            except (httpx.HTTPError, ValueError):
                return False

        wait_for(both_ready, timeout=60, message="two instances sharing the partitions")
        scheduled = [f"two-{i}-{uuid.uuid4().hex[:6]}" for i in range(30)]
        parked = parked_ids_on_both(a.url, prefix)
        for dlq_id in scheduled:
            produce(dead, [(dlq_id.encode(), b"v")], headers=letter_headers(dlq_id, retry, origin="slow"))
        for dlq_id in parked:
            produce(dead, [(dlq_id.encode(), b"v")], headers=letter_headers(dlq_id, retry, error="ValidationError"))

        wait_for(lambda: len(list_all(a.url, "/retries")) == len(scheduled), timeout=30, message="all scheduled")
        assert sorted(list_all(a.url, "/retries")) == sorted(list_all(b.url, "/retries"))
        assert sorted(list_all(a.url, "/retries")) == sorted(scheduled)
        wait_for(lambda: len(list_all(b.url, "/parked")) == len(parked), timeout=30, message="all parked")
        assert list_all(a.url, "/parked") == sorted(parked)

        served_by = set()
        for dlq_id in scheduled:
            ra, rb = get(a.url, f"/retries/{dlq_id}"), get(b.url, f"/retries/{dlq_id}")
            assert ra.status_code == rb.status_code == 200
            assert ra.json() == rb.json()
            served_by.add(ra.headers["x-statefleet-served-by"].split(",")[0].strip())
        assert served_by == {a.url, b.url}  # the ids are spread over both instances

        stats = get(a.url, "/retries/stats").json()
        assert stats["scheduled"] == len(scheduled) and stats["parked"] == len(parked) and stats["instances"] == 2

        auth = {"Authorization": f"Bearer {TOKEN}"}
        for i, dlq_id in enumerate(scheduled[:6]):
            url = (a, b)[i % 2].url  # half of these are forwarded to the other instance
            r = web.post(f"{url}/retries/{dlq_id}/replay", headers=auth, timeout=10)
            assert r.status_code == 200 and r.json()["status"] == "redelivered"
        for i, dlq_id in enumerate(scheduled[6:10]):
            r = web.delete(f"{(a, b)[i % 2].url}/retries/{dlq_id}", headers=auth, timeout=10)
            assert r.status_code == 200 and r.json()["status"] == "cancelled"
        r = web.post(f"{b.url}/parked/{parked[0]}/replay", headers=auth, timeout=10)
        assert r.status_code == 200

        assert sorted(list_all(b.url, "/retries")) == sorted(scheduled[10:])
        redelivered = sorted(dict(r.headers)[dl.ID].decode() for r in read_all(retry))
        assert redelivered == sorted([*scheduled[:6], parked[0]])
        assert get(a.url, f"/retries/{scheduled[0]}").json()["detail"].endswith("(attempt 1 was redelivered)")
        assert get(b.url, f"/retries/{scheduled[6]}").json()["detail"].endswith("(attempt 1 was cancelled)")

        # A group of parked messages, owned by both instances, is counted and cancelled through either.
        rest = parked[1:]
        owners = {get(a.url, f"/parked/{i}").headers["x-statefleet-served-by"].split(",")[0].strip() for i in rest}
        assert owners == {a.url, b.url}
        group = {"origin_topic": "orders", "error_class": "ValidationError"}
        [ga] = get(a.url, "/parked-groups").json()["groups"]
        assert ga == get(b.url, "/parked-groups").json()["groups"][0] and ga["count"] == len(rest)
        dry = web.post(f"{a.url}/parked-groups/cancel", params={**group, "dry_run": "true"}, headers=auth, timeout=30)
        assert dry.status_code == 200 and dry.json()["matched"] == len(rest)
        done = web.post(f"{b.url}/parked-groups/cancel", params=group, headers=auth, timeout=30)
        assert done.status_code == 200, done.text
        assert (done.json()["done"], done.json()["accepted_partitions"]) == (len(rest), [])
        assert list_all(a.url, "/parked") == [] and get(b.url, "/parked-groups").json()["total"] == 0
    finally:
        a.kill()
        b.kill()
