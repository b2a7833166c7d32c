"""Batches of commands end to end: each item decided once, like a single command; a resent
batch decides only what was not decided; a SIGKILL mid-batch loses and doubles nothing."""

from __future__ import annotations

import collections
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.kafka import create_topics, produce, read_all
from tests.support.services import ServiceProcess, free_port, run_until_killed, wait_for
from tools import web

pytestmark = pytest.mark.e2e

FILLER = 400  # plain creates after the mixed items, so that a SIGKILL lands mid-batch


def mixed_batch(batch_id: str, run: str) -> tuple[dict[str, Any], dict[int, tuple[str, str | None]]]:
    """The batch, and what each item must come to: (status, reason)."""
    a1, a2, a3 = f"{run}-a1", f"{run}-a2", f"{run}-a3"
    items: list[Any] = [
        {"type": "CreateAccount", "account_id": a1, "program_id": "P"},  # 0 accepted (v1)
        {"type": "UpdateAccount", "account_id": a1, "expected_version": 1, "data": {"x": 1}},  # 1 accepted (v2)
        {"type": "UpdateAccount", "account_id": a1, "expected_version": 1, "data": {"x": 2}},  # 2 version conflict
        {"type": "ReactivateAccount", "account_id": a1},  # 3 invalid transition
        {"type": "CreateAccount", "account_id": a2},  # 4 no program_id
        42,  # 5 not an object
        {"type": "Bogus", "account_id": a3},  # 6 unknown type
        {"type": "CreateAccount", "account_id": 5, "program_id": "P"},  # 7 no usable account id
    ]
    expected: dict[int, tuple[str, str | None]] = {
        0: ("accepted", None),
        1: ("accepted", None),
        2: ("rejected", "VERSION_CONFLICT"),
        3: ("rejected", "INVALID_TRANSITION"),
        4: ("rejected", "INVALID_COMMAND"),
        5: ("rejected", "INVALID_COMMAND"),
        6: ("rejected", "INVALID_COMMAND"),
        7: ("rejected", "INVALID_COMMAND"),
    }
    for i in range(FILLER):
        expected[len(items)] = ("accepted", None)
        items.append({"type": "CreateAccount", "account_id": f"{run}-f{i}", "program_id": "P"})
    return {"batch_id": batch_id, "commands": items}, expected


def summary(proc: ServiceProcess, batch_id: str) -> dict[str, Any] | None:
    items: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": 150}
    while True:
        resp = web.get(f"{proc.url}/batches/{batch_id}", params=params, timeout=15)
        if resp.status_code in (404, 503):
            return None
        assert resp.status_code == 200, resp.text
        body = resp.json()
        items += body["items"]
        if body["next_cursor"] is None:
            return {**body, "items": items}
        params["cursor"] = body["next_cursor"]


def settled(proc: ServiceProcess, batch_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        body = summary(proc, batch_id)
        return body if body is not None and body["counts"]["pending"] == 0 else None

    result: dict[str, Any] = wait_for(done, timeout=90, message=f"batch {batch_id} decided")
    return result


def check_exact(
    proc: ServiceProcess, body: dict[str, Any], expected: dict[int, tuple[str, str | None]], *, crashed: bool
) -> None:
    """The summary, the events, the rejections and the dead letters of the batch are exact. After a
    SIGKILL a record sent before the state it implied was written is sent again, identical (the
    same event_id, the same rejection, the same dlq.id): a copy, never a second outcome."""
    assert body["total"] == len(expected)
    got = {item["index"]: (item["status"], item["reason"]) for item in body["items"]}
    assert got == expected
    reasons = collections.Counter(reason for status, reason in expected.values() if status == "rejected")
    accepted = sum(1 for status, _ in expected.values() if status == "accepted")
    assert body["counts"] == {
        "pending": 0,
        "accepted": accepted,
        "rejected": sum(reasons.values()),
        "rejected_by_reason": dict(reasons),
    }
    prefix = proc.env["STATEFLEET_TOPIC_PREFIX"]
    ids = {item["command_id"]: item for item in body["items"]}

    def once_each(records: list[tuple[str, bytes]]) -> dict[str, bytes]:
        copies: dict[str, list[bytes]] = collections.defaultdict(list)
        for item_key, value in records:
            copies[item_key].append(value)
        for item_key, values in copies.items():
            assert len(set(values)) == 1, f"{item_key}: two different records"
            assert crashed or len(values) == 1, f"{item_key}: sent {len(values)} times without a crash"
        return {k: v[0] for k, v in copies.items()}

    # Exactly one event per accepted item.
    events = once_each(
        [
            (e["command_id"], orjson.dumps(e))
            for e in (orjson.loads(r.body) for r in read_all(prefix + "account-events"))
            if e["command_id"] in ids
        ]
    )
    assert set(events) == {cid for cid, item in ids.items() if item["status"] == "accepted"}
    # Each rejection once per item (items that are not readable commands are dead letters instead).
    rejections = once_each(
        [
            (rej["command_id"], r.body)
            for r in read_all(prefix + "account-rejections")
            if (rej := orjson.loads(r.body))["command_id"] in ids
        ]
    )
    assert set(rejections) == {cid for cid, item in ids.items() if item["status"] == "rejected"} - {
        body["items"][5]["command_id"],
        body["items"][7]["command_id"],
    }
    letters = once_each(
        [
            (dict(r.headers)["statefleet.batch.index"].decode(), dict(r.headers)["dlq.id"])
            for r in read_all(prefix + "dead-letters")
            if dict(r.headers).get("statefleet.batch.id")
        ]
    )
    assert sorted(letters) == ["5", "7"]


def test_a_mixed_batch_resent_twice_is_decided_once(start_validator: Any) -> None:
    proc: ServiceProcess = start_validator("a")
    run = uuid.uuid4().hex[:8]
    body, expected = mixed_batch(f"batch-{run}", run)
    first = web.post(f"{proc.url}/commands/batch", params={"wait": "true"}, json=body, timeout=30)
    assert first.status_code in (200, 202), first.text
    assert len(first.json().get("command_ids") or first.json()["items"]) == len(expected)
    decided = settled(proc, body["batch_id"])
    check_exact(proc, decided, expected, crashed=False)
    for _ in range(2):
        again = web.post(f"{proc.url}/commands/batch", params={"wait": "true"}, json=body, timeout=30)
        assert again.status_code == 200, again.text
        assert again.json()["counts"] == decided["counts"]
    check_exact(proc, settled(proc, body["batch_id"]), expected, crashed=False)


def test_a_batch_resent_after_a_sigkill_mid_batch_is_decided_once(
    service_env: dict[str, str], prefix: str, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    body, expected = mixed_batch(f"batch-{run}", run)
    # As a producer that batches on its side would: one record on account-command-batches.
    create_topics([f"{prefix}account-command-batches"])
    produce(f"{prefix}account-command-batches", [(body["batch_id"], orjson.dumps(body))])
    # Small fetches split the batch's 408 commands over many commits; the worker SIGKILLs
    # itself at the third, with that commit's events sent and its state not yet written.
    env = {**service_env, "STATEFLEET_INSTANCE_ID": "a", "STATEFLEET_CONSUMER_MAX_POLL_RECORDS": "50"}
    port = free_port()
    run_until_killed("validator", env, tmp_path / "validator-1.log", port, "sent:3")

    proc = ServiceProcess("validator", env, tmp_path / "validator-2.log", port=port).start().wait_ready()
    try:
        resent = web.post(f"{proc.url}/commands/batch", params={"wait": "true"}, json=body, timeout=30)
        assert resent.status_code in (200, 202), resent.text
        check_exact(proc, settled(proc, body["batch_id"]), expected, crashed=True)
    finally:
        proc.kill()


def test_a_record_that_is_not_a_batch_is_a_dead_letter_and_the_next_batch_is_decided(start_validator: Any, prefix: str) -> None:
    create_topics([f"{prefix}account-command-batches"])
    run = uuid.uuid4().hex[:8]
    good_id = f"after-{run}"
    good = {"batch_id": good_id, "commands": [{"type": "CreateAccount", "account_id": f"{run}-ok", "program_id": "P"}]}
    produce(
        f"{prefix}account-command-batches",
        [
            ("junk-1", b"\xff not json"),
            ("junk-2", orjson.dumps({"batch_id": "no-commands"})),
            ("junk-3", orjson.dumps({"commands": [{"type": "CreateAccount"}]})),
            (good_id, orjson.dumps(good)),
        ],
    )
    proc: ServiceProcess = start_validator("a")
    body = settled(proc, good_id)
    assert body["counts"]["accepted"] == 1

    def letters() -> list[Any] | None:
        found = [
            r
            for r in read_all(f"{prefix}dead-letters")
            if dict(r.headers).get("dlq.original.topic") == f"{prefix}account-command-batches".encode()
        ]
        return found if len(found) >= 3 else None

    found = wait_for(letters, timeout=30, message="three dead letters from account-command-batches")
    assert sorted(r.key for r in found) == [b"junk-1", b"junk-2", b"junk-3"]
    assert all(dict(r.headers)["dlq.error.message"] for r in found)


def test_any_instance_answers_for_any_batch(start_validator: Any) -> None:
    a: ServiceProcess = start_validator("a")
    b: ServiceProcess = start_validator("b")
    run = uuid.uuid4().hex[:8]
    ids = [f"{run}-{i}" for i in range(12)]  # batch ids on several partitions, owned by either instance
    for batch_id in ids:
        body = {"batch_id": batch_id, "commands": [{"type": "CreateAccount", "account_id": f"{batch_id}-x", "program_id": "P"}]}
        wait_for(
            lambda body=body: web.post(f"{a.url}/commands/batch", json=body, timeout=30).status_code == 202,
            timeout=60,
            message="batch accepted",
        )
    for batch_id in ids:
        for proc in (a, b):
            answer = settled(proc, batch_id)
            assert answer["counts"] == {"pending": 0, "accepted": 1, "rejected": 0, "rejected_by_reason": {}}
