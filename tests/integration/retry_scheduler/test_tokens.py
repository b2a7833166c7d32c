"""Named tokens with scopes on the real broker: a team's token acts on its own origin topics only,
a read-only token reads but cannot act, payloads need a token when STATEFLEET_PAYLOADS_REQUIRE_TOKEN
is on, and the history names the token that acted."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.integration.retry_scheduler.helpers import (
    TOKEN,
    Scheduler,
    letter_headers,
    new_id,
    records_for,
    scheduler_env,
    send_letter,
    start_scheduler,
)
from tests.support.kafka import create_topics
from tests.support.services import wait_for
from tools import web

pytestmark = pytest.mark.integration

ORDERS_TOKEN = f"orders-{uuid.uuid4().hex}"
AUDITOR_TOKEN = f"auditor-{uuid.uuid4().hex}"
TOKENS = """
tokens:
  - name: orders-team
    secret_env: STATEFLEET_TEST_ORDERS_TOKEN
    topics: ["orders-*"]
    scopes: [read, act]
  - name: auditor
    secret: {auditor}
    topics: ["*"]
    scopes: [read]
"""


@dataclass
class Scoped:
    s: Scheduler
    retry: str

    def call(self, method: str, path: str, token: str | None, **params: object) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        return web.request(method, self.s.url + path, headers=headers, params=params, timeout=10)  # type: ignore[arg-type]

    def parked(self, label: str, origin: str) -> str:
        dlq_id = new_id(label)
        send_letter(self.s, b"the-key", b"the-value", letter_headers(dlq_id, self.retry, attempt=4, origin=origin))
        wait_for(lambda: self.call("GET", f"/parked/{dlq_id}", TOKEN).status_code == 200, timeout=20, message=f"{dlq_id} parked")
        return dlq_id


@pytest.fixture(scope="module")
def scoped(kafka_bootstrap: str, module_prefix: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scoped]:
    prefix = module_prefix
    tmp = tmp_path_factory.mktemp("retry-tokens")
    retry = f"{prefix}retry-tokens"
    create_topics([f"{prefix}dead-letters", f"{prefix}retry", f"{prefix}parking-lot", retry])
    tokens = tmp / "tokens.yaml"
    tokens.write_text(TOKENS.format(auditor=AUDITOR_TOKEN))
    env = {
        **scheduler_env(kafka_bootstrap, prefix, tmp / "data", tokens_file=tokens, payloads_require_token="true"),
        "STATEFLEET_TEST_ORDERS_TOKEN": ORDERS_TOKEN,
    }
    proc = start_scheduler(env, tmp)
    yield Scoped(Scheduler(proc, prefix), retry)
    proc.kill()
    log = proc.log_path.read_text()
    for secret in (ORDERS_TOKEN, AUDITOR_TOKEN, TOKEN):
        assert secret not in log  # never logged


def test_a_token_scoped_to_orders_replays_an_orders_letter_and_is_refused_a_billing_one(scoped: Scoped) -> None:
    orders_id, billing_id = scoped.parked("orders", origin="orders-x"), scoped.parked("billing", origin="billing")

    refused = scoped.call("POST", f"/parked/{billing_id}/replay", ORDERS_TOKEN)
    assert refused.status_code == 403, refused.text
    body = refused.json()
    assert (body["error"], body["token"], body["topic"], body["scope"]) == ("forbidden", "orders-team", "billing", "act")
    assert "token 'orders-team' may not act on messages of origin topic 'billing'" in body["detail"]
    assert "orders-*" in body["detail"]
    group = scoped.call("POST", "/parked-groups/replay", ORDERS_TOKEN, origin_topic="billing", error_class="Boom")
    assert group.status_code == 403 and group.json()["topic"] == "billing", group.text
    assert scoped.call("DELETE", f"/parked/{billing_id}", ORDERS_TOKEN).status_code == 403
    assert scoped.call("GET", f"/parked/{billing_id}", TOKEN).status_code == 200  # still parked, untouched

    replayed = scoped.call("POST", f"/parked/{orders_id}/replay", ORDERS_TOKEN)
    assert replayed.status_code == 200, replayed.text
    assert replayed.json()["status"] == "redelivered"
    wait_for(lambda: len(records_for(scoped.retry, orders_id)) == 1, timeout=20, message="the replay redelivered")
    # its consumer fails again: the next attempt is parked, its history naming the token that replayed it
    send_letter(scoped.s, b"the-key", b"the-value", letter_headers(orders_id, scoped.retry, attempt=5, origin="orders-x"))
    wait_for(lambda: scoped.call("GET", f"/parked/{orders_id}", TOKEN).status_code == 200, timeout=20, message="parked again")
    [event] = scoped.call("GET", f"/parked/{orders_id}", ORDERS_TOKEN).json()["history"]
    assert (event["action"], event["attempt"], event["actor"]) == ("unpark", 4, "orders-team")
    deleted = scoped.call("DELETE", f"/parked/{orders_id}", ORDERS_TOKEN)
    assert deleted.status_code == 200, deleted.text
    gone = scoped.call("GET", f"/parked/{orders_id}", ORDERS_TOKEN)
    assert gone.status_code == 404 and "deleted at" in gone.json()["detail"] and gone.json()["detail"].endswith("by orders-team)")


def test_a_read_only_token_reads_payloads_but_cannot_act(scoped: Scoped) -> None:
    dlq_id = scoped.parked("read-only", origin="billing")
    read = scoped.call("GET", f"/parked/{dlq_id}", AUDITOR_TOKEN)
    assert read.status_code == 200, read.text
    assert base64.b64decode(read.json()["value_base64"]) == b"the-value" and read.json()["key"] == "the-key"
    anonymous = scoped.call("POST", f"/parked/{dlq_id}/replay", None)
    assert anonymous.status_code == 401 and anonymous.json()["scope"] == "act", anonymous.text
    for method, path in (("POST", f"/parked/{dlq_id}/replay"), ("DELETE", f"/parked/{dlq_id}")):
        refused = scoped.call(method, path, AUDITOR_TOKEN)
        assert refused.status_code == 403, (method, refused.text)
        body = refused.json()
        assert (body["token"], body["topic"], body["scope"]) == ("auditor", "billing", "act")
        assert "it has no act scope (its scopes: read)" in body["detail"]
    assert scoped.call("GET", f"/parked/{dlq_id}", AUDITOR_TOKEN).status_code == 200  # still parked


def test_payload_reads_need_a_token_covering_the_topic_and_lists_hide_the_rest(scoped: Scoped) -> None:
    orders_id, billing_id = scoped.parked("payload-o", origin="orders-y"), scoped.parked("payload-b", origin="billing")
    missing = scoped.call("GET", f"/parked/{orders_id}", None)
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert missing.json()["error"] == "unauthorized"
    assert "STATEFLEET_PAYLOADS_REQUIRE_TOKEN is on" in missing.json()["detail"]
    assert "a token with the read scope: no bearer token was given" in missing.json()["detail"]
    assert missing.json()["scope"] == "read"
    wrong = scoped.call("GET", f"/parked/{orders_id}", "not-a-token")
    assert wrong.status_code == 401 and wrong.json()["detail"].endswith("the bearer token is not valid")
    assert "not-a-token" not in wrong.text
    assert scoped.call("GET", f"/parked/{orders_id}", ORDERS_TOKEN).json()["key"] == "the-key"
    other = scoped.call("GET", f"/parked/{billing_id}", ORDERS_TOKEN)
    assert other.status_code == 403 and (other.json()["topic"], other.json()["scope"]) == ("billing", "read"), other.text
    assert "value_base64" not in other.text

    # a scheduled message (origin "slow": 10 minutes away) alike, through /retries/{id} and /scheduled/{id}
    slow_id = new_id("payload-s")
    send_letter(scoped.s, b"the-key", b"the-value", letter_headers(slow_id, scoped.retry, origin="slow"))
    wait_for(lambda: scoped.call("GET", f"/retries/{slow_id}", TOKEN).status_code == 200, timeout=20, message="scheduled")
    for path in (f"/retries/{slow_id}", f"/scheduled/{slow_id}"):
        assert scoped.call("GET", path, None).status_code == 401
        assert scoped.call("GET", path, ORDERS_TOKEN).status_code == 403
        assert scoped.call("GET", path, AUDITOR_TOKEN).json()["value_base64"] == base64.b64encode(b"the-value").decode()

    def listed(token: str | None) -> dict[str, dict[str, object]]:
        r = scoped.call("GET", "/parked", token, limit=1000)
        assert r.status_code == 200, r.text
        return {str(item["id"]): item for item in r.json()["items"]}

    anonymous, orders = listed(None), listed(ORDERS_TOKEN)
    assert anonymous[orders_id]["payload_hidden"] is True and anonymous[orders_id]["key"] is None
    assert anonymous[billing_id]["headers"] == {} and anonymous[billing_id]["origin_topic"] == "billing"
    assert orders[orders_id]["payload_hidden"] is False and orders[orders_id]["key"] == "the-key"
    assert orders[billing_id]["payload_hidden"] is True and orders[billing_id]["key_base64"] is None
    assert listed(TOKEN)[billing_id]["key"] == "the-key"
    assert scoped.call("GET", "/parked", "not-a-token").status_code == 401
    retries = scoped.call("GET", "/retries", None, origin_topic="slow").json()["items"]
    assert [i["payload_hidden"] for i in retries if i["id"] == slow_id] == [True]
    assert scoped.call("GET", "/retries/stats", None).status_code == 200  # no payloads: open
