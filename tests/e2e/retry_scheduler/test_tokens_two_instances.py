"""Named tokens across two scheduler instances: whichever instance a call reaches, the owner of the
message's partition answers for the token the call carried (a 403 names it, the history records it),
and a list gathered from both shows each caller the payloads its token covers and no more."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.engine import partition_for
from tests.integration.retry_scheduler.helpers import TOKEN, letter_headers, scheduler_env, start_scheduler
from tests.support.kafka import create_topics, produce
from tests.support.services import wait_for
from tools import web

pytestmark = pytest.mark.e2e

PARTITIONS = 8
ORDERS_TOKEN = f"orders-{uuid.uuid4().hex}"
TOKENS = f"""
tokens:
  - name: orders-team
    secret: {ORDERS_TOKEN}
    topics: ["orders-*"]
    scopes: [read, act]
"""


def call(method: str, url: str, path: str, token: str | None, **params: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return web.request(method, url + path, headers=headers, params=params, timeout=10)  # type: ignore[arg-type]


def served_by(r: httpx.Response) -> str:
    return r.headers["x-statefleet-served-by"].split(",")[0].strip()


def test_tokens_hold_whichever_instance_is_asked(kafka_bootstrap: str, prefix: str, tmp_path: Path) -> None:
    dead, retry = f"{prefix}dead-letters", f"{prefix}retry-tokens"
    create_topics([dead, retry, f"{prefix}parking-lot"])
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(TOKENS)
    env = scheduler_env(kafka_bootstrap, prefix, tmp_path / "data", tokens_file=tokens, payloads_require_token="true")
    a = start_scheduler(env, tmp_path, instance="a")
    b = start_scheduler(env, tmp_path, instance="b")
    try:

        def both_ready() -> bool:
            try:
                return all(call("GET", p.url, "/retries/stats", None).json().get("instances") == 2 for p in (a, b))
            except (httpx.HTTPError, ValueError):
                return False

        wait_for(both_ready, timeout=60, message="two instances sharing the partitions")
        view = web.get(a.url + "/instance", timeout=10).json()
        on_a = set(view["active"][f"{prefix}statefleet-retry_scheduler-parked-changelog"])
        assert 0 < len(on_a) < PARTITIONS

        def ids_on_both(label: str) -> list[str]:
            """Two ids: the first on a partition of a's, the second on one of b's."""
            found: dict[bool, str] = {}
            while len(found) < 2:
                candidate = f"{label}-{uuid.uuid4().hex[:8]}"
                found.setdefault(partition_for(candidate, PARTITIONS) in on_a, candidate)
            return [found[True], found[False]]

        orders, billing = ids_on_both("orders"), ids_on_both("billing")
        for ids, origin in ((orders, "orders-x"), (billing, "billing")):
            for dlq_id in ids:
                headers = letter_headers(dlq_id, retry, attempt=4, origin=origin)  # out of attempts: parked
                produce(dead, [(b"the-key", b"v")], headers=headers)

        def all_parked() -> bool:
            return all(call("GET", a.url, f"/parked/{i}", TOKEN).status_code == 200 for i in orders + billing)

        wait_for(all_parked, timeout=30, message="all parked")

        for dlq_id, owner, asked in ((billing[0], a, b), (billing[1], b, a)):  # each asked through the other instance
            refused = call("POST", asked.url, f"/parked/{dlq_id}/replay", ORDERS_TOKEN)
            assert refused.status_code == 403 and served_by(refused) == owner.url, refused.text
            assert (refused.json()["token"], refused.json()["topic"], refused.json()["scope"]) == (
                "orders-team",
                "billing",
                "act",
            )
            read = call("GET", asked.url, f"/parked/{dlq_id}", ORDERS_TOKEN)
            assert read.status_code == 403 and read.json()["scope"] == "read"
            assert call("GET", asked.url, f"/parked/{dlq_id}", None).status_code == 401

        for dlq_id, owner, asked in ((orders[0], a, b), (orders[1], b, a)):
            read = call("GET", asked.url, f"/parked/{dlq_id}", ORDERS_TOKEN)
            assert read.status_code == 200 and served_by(read) == owner.url and read.json()["key"] == "the-key"

        for asked in (a, b):  # the list is gathered from both: each part hides what the token does not cover
            items = {i["id"]: i for i in call("GET", asked.url, "/parked", ORDERS_TOKEN, limit=100).json()["items"]}
            assert {i: items[i]["payload_hidden"] for i in orders + billing} == {
                orders[0]: False,
                orders[1]: False,
                billing[0]: True,
                billing[1]: True,
            }
            assert items[orders[1]]["key"] == "the-key" and items[billing[0]]["key"] is None
            anonymous = call("GET", asked.url, "/parked", None, limit=100).json()["items"]
            assert {i["id"] for i in anonymous} == set(orders + billing) and all(i["payload_hidden"] for i in anonymous)

        deleted = call("DELETE", b.url, f"/parked/{orders[0]}", ORDERS_TOKEN)  # owned by a, asked of b
        assert deleted.status_code == 200 and deleted.json()["status"] == "deleted", deleted.text
        gone = call("GET", b.url, f"/parked/{orders[0]}", ORDERS_TOKEN)
        assert gone.status_code == 404 and gone.json()["detail"].endswith("by orders-team)"), gone.text
    finally:
        a.kill()
        b.kill()
