"""Parked messages by group on the real broker: grouped with counts and the newest error,
counted by a dry run, replayed or cancelled as a group (whole, or parked within a time
range) through each partition's handler, and the replays kept in each message's history
across its next attempt."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from shared import dead_letters as dl
from tests.integration.retry_scheduler.helpers import TOKEN, Scheduler, letter_headers, new_id, records_for, send_letter
from tests.support.services import wait_for
from tools import web

pytestmark = pytest.mark.integration

#: The scheduler's policy allows 4 attempts: a dead letter at attempt 4 is parked at once.
LAST = 4


def park(s: Scheduler, origin: str, error: str, retry_topic: str, n: int, *, message: str = "it broke") -> list[str]:
    ids = [new_id(f"{error}-{i}") for i in range(n)]
    for dlq_id in ids:
        headers = [
            (k, message.encode() if k == dl.ERROR_MESSAGE else v)
            for k, v in letter_headers(dlq_id, retry_topic, attempt=LAST, origin=origin, error=error)
        ]
        send_letter(s, b"k-" + dlq_id.encode(), b"v", headers)
    wait_for(lambda: all(s.get(f"/parked/{i}").status_code == 200 for i in ids), timeout=20, message="parked")
    return ids


def newest_parked_at_once_past(s: Scheduler, ids: list[str]) -> int:
    """The newest ``parked_at`` of ``ids``, once the clock (the scheduler's, on this machine) is
    past it: what is parked from then on is parked at a later millisecond."""
    newest = max(int(s.get(f"/parked/{i}").json()["parked_at"]) for i in ids)
    wait_for(lambda: time.time() * 1000 > newest, timeout=5, interval=0.001, message=f"the clock past {newest} ms")
    return newest


def groups(s: Scheduler, **params: Any) -> dict[tuple[str, str], dict[str, Any]]:
    r = s.get("/parked-groups", **params)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["complete"] is True
    return {(g["origin_topic"], g["error_class"]): g for g in body["groups"]}


def group_action(s: Scheduler, action: str, token: str | None = TOKEN, **params: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return web.post(f"{s.url}/parked-groups/{action}", params=params, headers=headers, timeout=30)


def test_parked_messages_are_grouped_with_counts_and_the_newest_error(scheduler: Scheduler) -> None:
    origin = new_id("grouped")
    topic = scheduler.retry_topic("grouped")
    newest_parked_at_once_past(scheduler, park(scheduler, origin, "TimeoutError", topic, 3, message="older timeout"))
    park(scheduler, origin, "TimeoutError", topic, 1, message="the newest timeout")
    park(scheduler, origin, "KeyError", topic, 2)

    found = groups(scheduler, origin_topic=origin)
    assert set(found) == {(origin, "TimeoutError"), (origin, "KeyError")}
    timeouts = found[(origin, "TimeoutError")]
    assert timeouts["count"] == 4
    assert timeouts["newest_error_message"] == "the newest timeout"
    assert timeouts["oldest_parked_at"] <= timeouts["newest_parked_at"]
    assert found[(origin, "KeyError")]["count"] == 2
    assert list(found) == [(origin, "TimeoutError"), (origin, "KeyError")]  # largest first
    assert set(groups(scheduler, origin_topic=origin, error_class="KeyError")) == {(origin, "KeyError")}
    assert groups(scheduler, origin_topic=origin, parked_to=1) == {}


def test_a_dry_run_counts_and_changes_nothing(scheduler: Scheduler) -> None:
    origin = new_id("dry")
    ids = park(scheduler, origin, "TimeoutError", scheduler.retry_topic("dry"), 3)
    r = group_action(scheduler, "replay", origin_topic=origin, error_class="TimeoutError", dry_run="true")
    assert r.status_code == 200, r.text
    assert r.json()["matched"] == 3 and r.json()["dry_run"] is True and r.json()["done"] == 0
    assert group_action(scheduler, "cancel", origin_topic=origin, error_class="Other", dry_run="true").json()["matched"] == 0
    assert all(scheduler.get(f"/parked/{i}").status_code == 200 for i in ids)
    assert group_action(scheduler, "replay", token=None, origin_topic=origin, error_class="TimeoutError").status_code == 401
    assert (
        group_action(
            scheduler, "replay", token="wrong", origin_topic=origin, error_class="TimeoutError", dry_run="true"
        ).status_code
        == 401
    )


@pytest.mark.parametrize(
    ("action", "params", "status"),
    [
        ("replay", {"error_class": "E"}, 422),  # no origin topic
        ("replay", {"origin_topic": "o"}, 422),  # no error class
        ("replay", {"origin_topic": "o", "error_class": "E", "parked_from": 5, "parked_to": 4}, 422),
        ("replay", {"origin_topic": "o", "error_class": "E", "parked_from": -1}, 422),
        ("delete", {"origin_topic": "o", "error_class": "E"}, 422),
    ],
)
def test_bad_group_actions_get_a_4xx_json_error(scheduler: Scheduler, action: str, params: dict[str, Any], status: int) -> None:
    r = group_action(scheduler, action, **params)
    assert r.status_code == status and "error" in r.json(), r.text


def test_a_group_within_a_time_range_is_cancelled_and_the_rest_stays(scheduler: Scheduler) -> None:
    origin = new_id("ranged")
    topic = scheduler.retry_topic("ranged")
    early = park(scheduler, origin, "TimeoutError", topic, 2)
    split = newest_parked_at_once_past(scheduler, early)
    late = park(scheduler, origin, "TimeoutError", topic, 2)
    assert min(scheduler.get(f"/parked/{i}").json()["parked_at"] for i in late) > split

    dry = group_action(scheduler, "cancel", origin_topic=origin, error_class="TimeoutError", parked_to=split, dry_run="true")
    assert dry.json()["matched"] == 2
    r = group_action(scheduler, "cancel", origin_topic=origin, error_class="TimeoutError", parked_to=split)
    assert r.status_code == 200, r.text
    assert r.json()["done"] == 2 and r.json()["accepted_partitions"] == [] and r.json()["continuing"] is False
    assert [scheduler.get(f"/parked/{i}").status_code for i in early] == [404, 404]
    assert [scheduler.get(f"/parked/{i}").status_code for i in late] == [200, 200]
    assert groups(scheduler, origin_topic=origin)[(origin, "TimeoutError")]["count"] == 2
    assert all(records_for(topic, i) == [] for i in early)  # cancelled: never redelivered
    # A copy of a cancelled dead letter read again is not parked again.
    send_letter(scheduler, b"k", b"v", letter_headers(early[0], topic, attempt=LAST, origin=origin, error="TimeoutError"))
    park(scheduler, origin, "Marker", topic, 1)  # read after the copy, in the same order of work
    assert scheduler.get(f"/parked/{early[0]}").status_code == 404


def test_a_group_is_replayed_and_its_history_follows_the_next_attempt(scheduler: Scheduler) -> None:
    origin = new_id("replayed")
    topic = scheduler.retry_topic("replayed")
    ids = park(scheduler, origin, "TimeoutError", topic, 3)
    other = park(scheduler, origin, "KeyError", topic, 1)
    before = int(time.time() * 1000)
    r = group_action(scheduler, "replay", origin_topic=origin, error_class="TimeoutError")
    assert r.status_code == 200, r.text
    assert (r.json()["matched"], r.json()["done"], r.json()["failed"]) == (3, 3, 0)
    for dlq_id in ids:
        [record] = records_for(topic, dlq_id)
        assert dict(record.headers)[dl.ATTEMPT] == str(LAST).encode()
        assert scheduler.get(f"/parked/{dlq_id}").status_code == 404
    assert scheduler.get(f"/parked/{other[0]}").status_code == 200
    assert (origin, "TimeoutError") not in groups(scheduler, origin_topic=origin)

    # Its consumer fails again: the next dead letter is parked with the replay in its history.
    again = ids[0]
    send_letter(scheduler, b"k", b"v", letter_headers(again, topic, attempt=LAST + 1, origin=origin, error="TimeoutError"))
    wait_for(lambda: scheduler.get(f"/parked/{again}").status_code == 200, timeout=20, message="parked again")
    body = scheduler.get(f"/parked/{again}").json()
    assert body["attempt"] == LAST + 1
    [event] = body["history"]
    assert event["action"] == "group replay" and event["attempt"] == LAST and event["at"] >= before

    # Replayed alone this time: the history grows.
    assert scheduler.admin("POST", f"/parked/{again}/replay").json()["status"] == "redelivered"
    send_letter(scheduler, b"k", b"v", letter_headers(again, topic, attempt=LAST + 2, origin=origin, error="TimeoutError"))
    wait_for(lambda: scheduler.get(f"/parked/{again}").status_code == 200, timeout=20, message="parked a third time")
    history = scheduler.get(f"/parked/{again}").json()["history"]
    assert [(h["action"], h["attempt"]) for h in history] == [("group replay", LAST), ("unpark", LAST + 1)]
