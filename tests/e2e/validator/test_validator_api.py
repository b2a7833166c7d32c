"""The validator end to end over HTTP: commands in through POST /commands, exact outcomes
back through the API and on the topics, the program listing, bad input, and several
instances answering for any key."""

from __future__ import annotations

import http.client
import time
import uuid
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import pytest

from tests.support.kafka import read_all
from tests.support.services import ServiceProcess, wait_for
from tools import web

pytestmark = pytest.mark.e2e


def post(proc: ServiceProcess, body: dict[str, Any], wait: bool = True) -> httpx.Response:
    params = {"wait": "true"} if wait else {}
    return web.post(proc.url + "/commands", json=body, params=params, timeout=15)


def get(proc: ServiceProcess, path: str, **params: Any) -> httpx.Response:
    return web.get(proc.url + path, params=params, timeout=15)


def topic(proc: ServiceProcess, base: str) -> str:
    return proc.env["STATEFLEET_TOPIC_PREFIX"] + base


def test_scripted_sequence_over_http(shared_validator: ServiceProcess) -> None:
    v = shared_validator
    a = f"acct-{uuid.uuid4().hex[:8]}"

    def c(n: int, type_: str, **kw: Any) -> dict[str, Any]:
        return {"command_id": f"{a}-{n}", "type": type_, "account_id": a, "issued_at": 1_700_000_000_000 + n, **kw}

    created = post(v, c(1, "CreateAccount", program_id="prog-http", data={"name": "Ann"}))
    assert created.status_code == 200, created.text
    body = created.json()
    assert body["status"] == "accepted" and body["command_id"] == f"{a}-1" and body["account_id"] == a
    assert body["rejection"] is None and body["reason"] is None
    event = body["event"]
    assert {k: event[k] for k in event if k != "event_id"} == {
        "command_id": f"{a}-1",
        "type": "AccountCreated",
        "account_id": a,
        "program_id": "prog-http",
        "version": 1,
        "occurred_at": 1_700_000_000_001,
        "data": {"name": "Ann"},
    }

    steps = [
        (c(2, "UpdateAccount", expected_version=1, data={"email": "ann@example.com"}), ("accepted", "AccountUpdated", 2)),
        (c(3, "DeactivateAccount"), ("accepted", "AccountDeactivated", 3)),
        (c(4, "UpdateAccount", expected_version=2, data={"name": "Stale"}), ("rejected", "VERSION_CONFLICT", 3)),
        (c(5, "DeleteAccount", expected_version=3), ("accepted", "AccountDeleted", 4)),
        (c(6, "UpdateAccount", data={"name": "Ghost"}), ("rejected", "DELETED", 4)),
    ]
    answers: dict[str, dict[str, Any]] = {f"{a}-1": body}
    for command, (status, what, version) in steps:
        r = post(v, command)
        assert r.status_code == 200, r.text
        out = r.json()
        answers[command["command_id"]] = out
        assert out["status"] == status, out
        if status == "accepted":
            assert (out["event"]["type"], out["event"]["version"]) == (what, version)
        else:
            assert (out["reason"], out["rejection"]["reason"], out["rejection"]["current_version"]) == (what, what, version)
            assert out["event"] is None and out["detail"]
    assert answers[f"{a}-2"]["event"]["data"] == {"name": "Ann", "email": "ann@example.com"}

    # the duplicate: the same answer, and no new event
    dup = post(v, c(2, "UpdateAccount", expected_version=1, data={"email": "ann@example.com"}))
    assert dup.status_code == 200 and dup.json() == answers[f"{a}-2"]

    for command_id, answer in answers.items():
        assert get(v, f"/commands/{command_id}").json() == answer
    assert get(v, f"/accounts/{a}").json() == {"account_id": a, "program_id": "prog-http", "status": "deleted", "version": 4}

    events = [orjson.loads(r.body) for r in read_all(topic(v, "account-events")) if r.key == a.encode()]
    assert [(e["type"], e["version"], e["command_id"]) for e in events] == [
        ("AccountCreated", 1, f"{a}-1"),
        ("AccountUpdated", 2, f"{a}-2"),
        ("AccountDeactivated", 3, f"{a}-3"),
        ("AccountDeleted", 4, f"{a}-5"),
    ]
    assert [e["event_id"] for e in events] == [answers[f"{a}-{n}"]["event"]["event_id"] for n in (1, 2, 3, 5)]
    rejections = [orjson.loads(r.body) for r in read_all(topic(v, "account-rejections")) if r.key == a.encode()]
    assert rejections == [answers[f"{a}-4"]["rejection"], answers[f"{a}-6"]["rejection"]]


def test_post_returns_202_and_the_command_reads_as_pending_or_answered(shared_validator: ServiceProcess) -> None:
    v = shared_validator
    a = f"acct-{uuid.uuid4().hex[:8]}"
    r = post(v, {"type": "CreateAccount", "account_id": a, "program_id": "prog-202"}, wait=False)
    assert r.status_code == 202
    command_id = r.json()["command_id"]
    assert r.json() == {"command_id": command_id} and uuid.UUID(command_id)
    first = get(v, f"/commands/{command_id}")
    assert first.status_code == 200 and first.json()["status"] in ("pending", "accepted")

    def answered() -> dict[str, Any] | None:
        body: dict[str, Any] = get(v, f"/commands/{command_id}").json()
        return body if body["status"] != "pending" else None

    final = wait_for(answered, timeout=15, message="the command answered")
    assert final["status"] == "accepted" and final["event"]["version"] == 1
    assert get(v, f"/commands/{command_id}", wait=2).json() == final
    assert get(v, f"/accounts/{a}").json()["status"] == "active"


def test_program_listing_newest_first_with_pages_and_status(shared_validator: ServiceProcess) -> None:
    v = shared_validator
    program = f"prog-{uuid.uuid4().hex[:8]}"
    ids = [f"{program}-a{i}" for i in range(7)]
    for i, a in enumerate(ids):
        r = post(
            v,
            {
                "command_id": f"{a}-c",
                "type": "CreateAccount",
                "account_id": a,
                "program_id": program,
                "issued_at": 1_700_000_000_000 + i * 1000,
            },
        )
        assert r.json()["status"] == "accepted"
    for command_id, type_, a, at in (("x1", "DeactivateAccount", ids[2], 0), ("x2", "DeleteAccount", ids[5], 1)):
        body = {"command_id": f"{program}-{command_id}", "type": type_, "account_id": a, "issued_at": 1_800_000_000_000 + at}
        assert post(v, body).json()["status"] == "accepted"
    expected_status = {a: "active" for a in ids} | {ids[2]: "inactive", ids[5]: "deleted"}

    def listing(**params: Any) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cursor = None
        while True:
            q = dict(params) | ({"cursor": cursor} if cursor else {})
            body = get(v, f"/programs/{program}/accounts", **q).raise_for_status().json()
            items.extend(body["items"])
            cursor = body["next_cursor"]
            if cursor is None:
                return items

    def settled() -> list[dict[str, Any]] | None:
        items = listing(limit=3)
        return items if {i["account_id"]: i["status"] for i in items} == expected_status else None

    items = wait_for(settled, timeout=20, message="the listing caught up")
    assert [i["account_id"] for i in items] == list(reversed(ids))
    assert items[0] == {
        "account_id": ids[6],
        "program_id": program,
        "status": "active",
        "version": 1,
        "created_at": 1_700_000_006_000,
        "updated_at": 1_700_000_006_000,
    }
    deleted = next(i for i in items if i["account_id"] == ids[5])
    assert deleted["version"] == 2 and deleted["updated_at"] == 1_800_000_000_001
    assert [i["account_id"] for i in listing(limit=2, status="active")] == [ids[6], ids[4], ids[3], ids[1], ids[0]]
    assert [i["account_id"] for i in listing(status="inactive")] == [ids[2]]
    assert get(v, "/programs/nobody-here/accounts").json() == {"items": [], "next_cursor": None}


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status"),
    [
        ("POST", "/commands", {"content": b"{not json", "headers": {"content-type": "application/json"}}, 422),
        ("POST", "/commands", {"json": [1, 2]}, 422),
        ("POST", "/commands", {"json": {"type": "Explode", "account_id": "a"}}, 422),
        ("POST", "/commands", {"json": {"type": "UpdateAccount"}}, 422),
        ("POST", "/commands", {"json": {"type": "UpdateAccount", "account_id": 5}}, 422),
        ("POST", "/commands", {"json": {"type": "UpdateAccount", "account_id": "a", "expected_version": "1"}}, 422),
        ("POST", "/commands", {"json": {"type": "UpdateAccount", "account_id": "a", "expectedVersion": 1}}, 422),
        ("POST", "/commands", {"json": {"type": "UpdateAccount", "account_id": "a", "data": "x" * 1_000_000}}, 413),
        ("POST", "/commands?wait=maybe", {"json": {"type": "UpdateAccount", "account_id": "a"}}, 422),
        ("GET", "/commands/never-sent", {}, 404),
        ("GET", "/commands/x?wait=-1", {}, 422),
        ("GET", "/accounts/never-created", {}, 404),
        ("GET", "/programs/p/accounts?cursor=%%%", {}, 400),
        ("GET", "/programs/p/accounts?cursor=bm90LWEtY3Vyc29y", {}, 400),
        ("GET", "/programs/p/accounts?limit=0", {}, 422),
        ("GET", "/programs/p/accounts?status=sleepy", {}, 422),
        ("DELETE", "/commands", {}, 405),
        ("POST", "/commands/batch", {"json": {"batch_id": "b", "commands": []}}, 422),
        ("POST", "/commands/batch", {"json": {"batch_id": "b", "commands": [{}] * 1001}}, 422),
        ("POST", "/commands/batch", {"json": {"commands": [{}]}}, 422),
        ("GET", "/batches/never-sent", {}, 404),
        ("GET", "/batches/b?cursor=bm90LWEtY3Vyc29y", {}, 400),
    ],
)
def test_bad_input_gets_a_json_4xx(
    shared_validator: ServiceProcess, method: str, path: str, kwargs: dict[str, Any], status: int
) -> None:
    r = web.request(method, shared_validator.url + path, timeout=10, **kwargs)
    assert r.status_code == status, r.text
    assert "error" in r.json()
    assert get(shared_validator, "/healthz").status_code == 200


@pytest.mark.parametrize("size", [80_000, 500_000])
def test_a_huge_request_line_gets_a_json_4xx(shared_validator: ServiceProcess, size: int) -> None:
    """Over h11's 16 KiB for a request head arriving in pieces, uvicorn itself answered 400 in
    plain text; the services read heads up to 1 MiB, so the API answers (httpx refuses such URLs)."""
    conn = http.client.HTTPConnection("127.0.0.1", int(shared_validator.url.rsplit(":", 1)[1]), timeout=10)
    try:
        conn.request("GET", "/batches/b?cursor=" + "A" * size)
        resp = conn.getresponse()
        assert resp.status == 422
        assert resp.getheader("content-type") == "application/json"
        assert "error" in orjson.loads(resp.read())
    finally:
        conn.close()


def test_an_idle_connection_outlives_the_clients_keep_alive(shared_validator: ServiceProcess) -> None:
    """httpx keeps an idle connection 5 s, uvicorn kept one 5 s too: a request sent as the server
    closed it failed with "Server disconnected without sending a response". The services keep idle
    connections 75 s, so a connection reused after 6 s idle still answers."""
    conn = http.client.HTTPConnection("127.0.0.1", int(shared_validator.url.rsplit(":", 1)[1]), timeout=10)
    try:
        for pause_s in (0.0, 6.0):
            time.sleep(pause_s)
            conn.request("GET", "/healthz")
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200
            assert resp.getheader("connection") != "close"
    finally:
        conn.close()


#: Ids with the characters a URL path treats specially; each must be readable back.
ODD_IDS = ["a/b", "/lead", "trail/", "a//b", "x/accounts", "pct%2Fenc", "q?x=1#frag", "sp ace", "line\nbreak"]


@pytest.mark.parametrize("odd", ODD_IDS)
def test_ids_with_slashes_and_url_characters_read_back(shared_validator: ServiceProcess, odd: str) -> None:
    v = shared_validator
    tag = uuid.uuid4().hex[:6]
    account, program, command = f"{tag}{odd}", f"{odd}{tag}", f"{odd}-cmd-{tag}"
    r = post(v, {"command_id": command, "type": "CreateAccount", "account_id": account, "program_id": program})
    assert r.status_code == 200 and r.json()["status"] == "accepted", r.text
    for safe in ("/", ""):  # raw slashes and %2F
        assert get(v, f"/commands/{quote(command, safe=safe)}").json()["command_id"] == command
        assert get(v, f"/accounts/{quote(account, safe=safe)}").json()["account_id"] == account
        path = f"/programs/{quote(program, safe=safe)}/accounts"
        listed = wait_for(lambda p=path: get(v, p).json().get("items"), timeout=15, message="the listing")
        assert [i["account_id"] for i in listed] == [account]


def _unrepresentable(command_id: str) -> list[bytes]:
    """Bodies Python's JSON parser takes but no message can carry (orjson, UTF-8, 64-bit longs)."""
    head = f'"type":"ReactivateAccount","program_id":"0","account_id":"0","command_id":"{command_id}"'
    return [
        ("{" + head + ',"issued_at":59539714981774057472,"data":{}}').encode(),
        ("{" + head + ',"issued_at":-1}').encode(),
        ("{" + head + ',"expected_version":9223372036854775808}').encode(),
        ("{" + head + ',"data":{"n":[{"deep":18446744073709551616}]}}').encode(),
        ("{" + head + ',"data":{"n":-9223372036854775809}}').encode(),
        ("{" + head + ',"data":{"s":"\\ud800"}}').encode(),
        ("{" + head + ',"data":{"\\udfff":1}}').encode(),
        ("{" + head + ',"data":{"x":NaN}}').encode(),
        ("{" + head + ',"data":{"x":1e400}}').encode(),
        ("{" + head + ',"data":' + "[" * 100 + "]" * 100 + "}").encode(),
        ("{" + head + ',"data":{"d":' + '{"a":' * 100 + "1" + "}" * 100 + "}}").encode(),
        ("{" + head + ',"\\ud800":1}').encode(),
    ]


@pytest.mark.parametrize("case", range(len(_unrepresentable("x"))))
@pytest.mark.parametrize("wait", [True, False])
def test_unrepresentable_values_get_422_and_leave_nothing_behind(shared_validator: ServiceProcess, case: int, wait: bool) -> None:
    command_id = f"bad-{uuid.uuid4().hex[:8]}"
    body = _unrepresentable(command_id)[case]
    r = web.post(
        shared_validator.url + "/commands",
        content=body,
        params={"wait": str(wait).lower()},
        headers={"content-type": "application/json"},
        timeout=15,
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid_request"
    assert get(shared_validator, f"/commands/{command_id}").status_code == 404
    assert get(shared_validator, "/healthz").status_code == 200


def owns_partitions(proc: ServiceProcess) -> bool:
    """Ready, not rebalancing, owning input partitions, with no warm-up copy pending."""
    body = get(proc, "/instance").json()
    return bool(body["ready"] and not body["rebalancing"] and body["active"] and not body["warmup"])


def test_two_instances_answer_for_any_key(start_validator: Any) -> None:
    first = start_validator("a")
    second = start_validator("b")
    wait_for(lambda: all(get(p, "/readyz").status_code == 200 for p in (first, second)), timeout=60, message="both ready")
    # A joining instance takes partitions over once its copies are warm (STATEFLEET_WARMUPS).
    wait_for(lambda: all(owns_partitions(p) for p in (first, second)), timeout=90, message="both to own partitions")
    accounts = [f"multi-{i}" for i in range(12)]

    def post_ok(proc: ServiceProcess, body: dict[str, Any]) -> dict[str, Any]:
        def attempt() -> dict[str, Any] | None:
            r = post(proc, body)
            return r.json() if r.status_code == 200 else None  # 503 while the group settles

        result: dict[str, Any] = wait_for(attempt, timeout=30, message=f"an answer to {body['command_id']}")
        return result

    for i, a in enumerate(accounts):
        via = first if i % 2 else second
        out = post_ok(via, {"command_id": f"{a}-1", "type": "CreateAccount", "account_id": a, "program_id": "multi"})
        assert out["status"] == "accepted" and out["event"]["version"] == 1
    served_by: set[str] = set()
    for a in accounts:
        for proc in (first, second):
            r = get(proc, f"/accounts/{a}")
            assert r.status_code == 200, r.text
            assert r.json() == {"account_id": a, "program_id": "multi", "status": "active", "version": 1}
            served_by.add(r.headers["x-statefleet-served-by"].split(",")[0].strip())
            assert get(proc, f"/commands/{a}-1").json()["status"] == "accepted"
    assert served_by == {first.url, second.url}, "both instances own some accounts and forward to each other"


def test_command_outcomes_expire_after_the_retention_and_the_account_stays(start_validator: Any) -> None:
    proc = start_validator("retention", STATEFLEET_COMMAND_OUTCOME_RETENTION_S="2")
    a = f"expiring-{uuid.uuid4().hex[:8]}"
    created = post(proc, {"command_id": f"{a}-1", "type": "CreateAccount", "account_id": a, "program_id": "exp"})
    assert created.status_code == 200 and created.json()["status"] == "accepted", created.text
    assert get(proc, f"/commands/{a}-1").status_code == 200

    # Rows are deleted as batches of the outcomes stream go by: keep commands coming.
    later: list[str] = []

    def expired() -> bool:
        later.append(f"{a}-later-{len(later)}")
        post(proc, {"command_id": later[-1], "type": "UpdateAccount", "account_id": a, "data": {"n": len(later)}})
        return get(proc, f"/commands/{a}-1").status_code == 404

    wait_for(expired, timeout=60, interval=0.5, message=f"the outcome of {a}-1 to expire")
    wait_for(
        lambda: get(proc, f"/commands/{later[-1]}").json()["status"] == "accepted",
        timeout=15,
        message="the latest command's outcome, younger than the retention",
    )
    account = get(proc, f"/accounts/{a}").json()
    assert account["status"] == "active" and account["version"] == 1 + len(later)
    metrics = get(proc, "/metrics").text
    assert any(
        line.startswith("statefleet_validator_outcomes_expired_total ") and float(line.split()[1]) >= 1
        for line in metrics.splitlines()
    )
    # The table's own rows are not command ids.
    assert get(proc, "/commands/%00expires%00").status_code in (404, 422)
