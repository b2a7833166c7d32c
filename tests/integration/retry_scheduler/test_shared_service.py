"""The retry scheduler as a service many teams share, on the real broker: policy rules from a
YAML file, DELETE /parked/{id}, the actor in history, metrics by origin topic, and the parked
retention."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.integration.retry_scheduler.helpers import (
    Scheduler,
    letter_headers,
    new_id,
    scheduler_env,
    send_letter,
    start_scheduler,
)
from tests.support.kafka import create_topics
from tests.support.services import wait_for
from tools import web

pytestmark = pytest.mark.integration

#: Long enough for the tests that look at a parked message before it expires.
RETENTION_S = 15
#: Rule 1 caps its own delay: the fixture's default cap (1 s, see ``scheduler_env``) would make its
#: letter due a second after it failed, and redelivered before a look at it whenever the inbox
#: takes it in later than that (its partitions assigned at the group's second generation, say).
POLICY = """
rules:
  - name: payments-timeouts
    origin_topic: payments
    error_class: TimeoutException
    max_attempts: 10
    base_delay_ms: 600000
    max_delay_ms: 600000
  - name: payments
    origin_topic: "payments*"
    max_attempts: 2
"""
KAFKA_TIMEOUT = "org.apache.kafka.common.errors.TimeoutException"


@dataclass
class Shared:
    s: Scheduler
    retry: str


@pytest.fixture(scope="module")
def shared(kafka_bootstrap: str, module_prefix: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    prefix = module_prefix
    tmp = tmp_path_factory.mktemp("retry-shared")
    retry = f"{prefix}retry-shared"
    create_topics([f"{prefix}dead-letters", f"{prefix}retry", f"{prefix}parking-lot", retry])
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    env = scheduler_env(
        kafka_bootstrap,
        prefix,
        tmp / "data",
        retry_policy_file=policy,
        parked_retention_s=RETENTION_S,
        retry_metrics_origin_topics=3,
    )
    proc = start_scheduler(env, tmp)
    yield Shared(Scheduler(proc, prefix), retry)
    proc.kill()


def parked(sh: Shared, label: str, origin: str = "orders") -> str:
    dlq_id = new_id(label)
    send_letter(sh.s, b"k", b"v", letter_headers(dlq_id, sh.retry, attempt=4, origin=origin))  # the default policy: 4 attempts
    wait_for(lambda: sh.s.get(f"/parked/{dlq_id}").status_code == 200, timeout=20, message=f"{dlq_id} parked")
    return dlq_id


def test_rules_from_the_policy_file_match_origin_topic_and_error_class_together(shared: Shared) -> None:
    s = shared.s
    timeout_id, other_id = new_id("timeout"), new_id("other")
    send_letter(s, b"k", b"v", letter_headers(timeout_id, shared.retry, attempt=2, origin="payments", error=KAFKA_TIMEOUT))
    send_letter(s, b"k", b"v", letter_headers(other_id, shared.retry, attempt=2, origin="payments-eu", error="IllegalState"))
    wait_for(lambda: s.get(f"/retries/{timeout_id}").status_code == 200, timeout=20, message="the timeout scheduled")
    scheduled = s.get(f"/retries/{timeout_id}").json()
    assert scheduled["max_attempts"] == 10  # rule 1, by the simple name
    assert scheduled["due_at"] - scheduled["failed_at"] == 600_000  # its delay (jitter none), not the default's cap
    wait_for(lambda: s.get(f"/parked/{other_id}").status_code == 200, timeout=20, message="the other parked")
    assert "reached max_attempts 2" in s.get(f"/parked/{other_id}").json()["parked_reason"]  # rule 2, a glob
    rules = s.get("/retries/stats").json()["policy"]["rules"]
    assert [r["name"] for r in rules] == ["payments-timeouts", "payments"]


def test_delete_parked_needs_the_token_answers_404_for_unknown_and_is_recorded(shared: Shared) -> None:
    s = shared.s
    dlq_id = parked(shared, "delete-me")
    assert s.admin("DELETE", f"/parked/{dlq_id}", token=None).status_code == 401
    assert s.admin("DELETE", f"/parked/{dlq_id}", token="wrong").status_code == 401
    r = s.admin("DELETE", f"/parked/{dlq_id}")
    assert r.status_code == 200, r.text
    assert r.json() == {"id": dlq_id, "status": "deleted", "attempt": 4, "topic": None}
    gone = s.get(f"/parked/{dlq_id}")
    assert gone.status_code == 404
    assert re.search(r"attempt 4 was deleted at \d+ by admin", gone.json()["detail"]), gone.json()
    again = s.admin("DELETE", f"/parked/{dlq_id}")
    assert again.status_code == 404 and "detail" in again.json()
    unknown = s.admin("DELETE", "/parked/never-seen")
    assert unknown.status_code == 404 and unknown.json()["detail"] == "no parked message with dlq.id 'never-seen'"
    assert s.get(f"/retries/{dlq_id}").status_code == 404  # nothing scheduled either


def test_the_history_names_the_actor(shared: Shared) -> None:
    s = shared.s
    dlq_id = parked(shared, "actor")
    assert s.admin("POST", f"/parked/{dlq_id}/replay").json()["status"] == "redelivered"
    # its consumer fails again: the next attempt is parked with its history, actor included
    send_letter(s, b"k", b"v", letter_headers(dlq_id, shared.retry, attempt=5))
    wait_for(lambda: s.get(f"/parked/{dlq_id}").status_code == 200, timeout=20, message="parked again")
    [event] = s.get(f"/parked/{dlq_id}").json()["history"]
    assert (event["action"], event["attempt"], event["actor"]) == ("unpark", 4, "admin")


def test_counters_carry_the_origin_topic_bounded(shared: Shared) -> None:
    s = shared.s
    for origin in ("team-a", "team-b", "team-c", "team-d", "team-e"):
        parked(shared, f"metrics-{origin}", origin=origin)
    text = web.get(s.url + "/metrics", timeout=10).text
    labels = set(re.findall(r'^statefleet_retry_parked_total\{origin_topic="([^"]+)"\}', text, re.M))
    assert "other" in labels and len(labels - {"other"}) <= 3  # at most 3 topics by name here
    assert re.search(r'^statefleet_retry_scheduled_total\{origin_topic="payments"\} [1-9]', text, re.M)


def test_the_retention_removes_expired_parked_messages(shared: Shared) -> None:
    s = shared.s
    dlq_id = parked(shared, "expires")

    def expired() -> bool:
        r = s.get(f"/parked/{dlq_id}")
        return r.status_code == 404 and "expired" in r.json()["detail"]

    wait_for(expired, timeout=RETENTION_S + 30, message=f"{dlq_id} removed by the retention")
    text = web.get(s.url + "/metrics", timeout=10).text
    assert re.search(r'^statefleet_retry_parked_removed_total\{how="expire"\} [1-9]', text, re.M)
    assert "parked retention" in s.proc.log_path.read_text()
