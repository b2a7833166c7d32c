"""The console against fake services (httpx.MockTransport): what each page shows, token gating,
refusals shown with their status, the console's own filters, the fleet poll."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Iterator
from typing import Any, cast

import httpx
import pytest
from fastapi.testclient import TestClient

from services.console.app import create_app
from services.console.clients import Clients, ServiceClient
from services.console.fleet import FleetMonitor, processed_total
from services.console.models import FleetSnapshot, InstanceView, ServiceView, chart, ranges, render_bytes
from services.console.pages.common import TOKEN_COOKIE
from services.console.pages.messages import parked_range
from shared.settings import Settings

VALIDATOR, TALLIES, SCHEDULER = "http://validator:8001", "http://tallies:8002", "http://scheduler:8003"
TOKEN = "s3cret"

Handler = Callable[[httpx.Request], httpx.Response]


def entry(dlq_id: str, **over: Any) -> dict[str, Any]:
    item = {
        "id": dlq_id,
        "key": "k",
        "key_base64": "aw==",
        "value_bytes": 2,
        "attempt": 1,
        "max_attempts": 3,
        "retry_topic": "retry",
        "origin_topic": "orders",
        "origin_partition": 0,
        "origin_offset": 1,
        "error_class": "Boom",
        "error_message": "it broke",
        "first_failed_at": 1_700_000_000_000,
        "failed_at": 1_700_000_000_000,
        "received_at": 1_700_000_000_100,
        "due_at": 1_700_000_060_000,
        "headers": {"dlq.id": dlq_id, "traceparent": "00-x"},
    }
    return {**item, **over}


STATS = {
    "scheduled": 1,
    "parked": 1,
    "blocked_keys": 3,
    "held": 3,
    "by_origin_topic": {"orders": 1},
    "by_error_class": {"Boom": 1},
    "parked_by_origin_topic": {"orders": 1},
    "oldest_due_at": None,
    "redelivered_total": 0,
    "parked_total": 0,
    "lateness": {"count": 0, "p50_ms": None, "p99_ms": None, "max_ms": None},
    "last_ticks": [],
    "busy_ticks": [],
    "instances": 1,
    "policy": {},
}


GROUPS = {
    "groups": [
        {
            "origin_topic": "orders",
            "error_class": "Boom",
            "count": 3,
            "oldest_parked_at": 1,
            "newest_parked_at": 2,
            "newest_error_message": "the newest boom",
        }
    ],
    "total": 3,
    "complete": True,
}


def scheduler(request: httpx.Request, calls: list[httpx.Request]) -> httpx.Response:
    calls.append(request)
    path = request.url.path
    authorized = request.headers.get("authorization") == f"Bearer {TOKEN}"
    if path == "/parked/billing-1/replay" and request.headers.get("authorization") == "Bearer orders-team-token":
        detail = "token 'orders-team' may not act on messages of origin topic 'billing'"
        return httpx.Response(403, json={"error": "forbidden", "detail": detail, "token": "orders-team", "topic": "billing"})
    if request.method != "GET" and not authorized:
        return httpx.Response(401, json={"error": "unauthorized", "detail": "a valid bearer token is required"})
    if path == "/retries/stats":
        return httpx.Response(200, json=STATS)
    if path in ("/scheduled/m1", "/scheduled/stats") and request.method == "GET":
        dlq_id = path.rsplit("/", 1)[1]
        return httpx.Response(200, json=entry(dlq_id, value_base64=base64.b64encode(b'{"a": 1}').decode()))
    if path == "/retries/m1/replay":
        return httpx.Response(200, json={"id": "m1", "status": "redelivered", "attempt": 1, "topic": "retry"})
    if path == "/retries/m1" and request.method == "DELETE":
        return httpx.Response(200, json={"id": "m1", "status": "cancelled"})
    if path == "/retries/moved/replay":
        return httpx.Response(409, json={"error": "conflict", "detail": "it changed meanwhile"})
    if path == "/retries/busy/replay":
        return httpx.Response(503, json={"error": "unavailable", "detail": "state is being restored"})
    if path.endswith("/replay") and path.startswith("/retries/console-token-check-"):
        return httpx.Response(404, json={"error": "not_found", "detail": "no such message"})
    if path == "/parked":
        return httpx.Response(
            200,
            json={
                "items": [entry(f"p{i}", error_class="A" if i % 2 else "B", parked_at=1, parked_reason="max") for i in range(4)],
                "next_cursor": None,
            },
        )
    if path.startswith("/parked/") and path.endswith("/replay"):
        return httpx.Response(200, json={"id": path.split("/")[2], "status": "redelivered"})
    if path == "/parked-groups":
        return httpx.Response(200, json=GROUPS)
    if path in ("/parked-groups/replay", "/parked-groups/cancel"):
        params = request.url.params
        out = {
            "action": path.rsplit("/", 1)[1],
            "origin_topic": params["origin_topic"],
            "error_class": params["error_class"],
            "parked_from": params.get("parked_from"),
            "parked_to": params.get("parked_to"),
            "dry_run": params.get("dry_run") == "true",
            "matched": 2,
            "complete": True,
            "done": 0,
            "failed": 0,
            "continuing": False,
            "accepted_partitions": [],
        }
        if not out["dry_run"]:
            out.update(done=2, failed=1, accepted_partitions=[3])
        return httpx.Response(200, json=out)
    if path.startswith("/ordered-keys"):
        return ordered_keys(request)
    if path in ("/parked/h1", "/parked/h2"):  # of a blocked key: h1 its head, h2 not
        dlq_id = path.rsplit("/", 1)[1]
        parked = entry(dlq_id, origin_topic="ledger", key="acct-1", parked_at=1, parked_reason="max", value_base64="e30=")
        return httpx.Response(200, json=parked)
    if path == "/retries":
        cursor = request.url.params.get("cursor")
        if cursor is None:
            return httpx.Response(200, json={"items": [entry("a1", attempt=1), entry("a2", attempt=2)], "next_cursor": "c1"})
        return httpx.Response(200, json={"items": [entry("a3", attempt=2)], "next_cursor": None})
    return httpx.Response(404, json={"error": "not_found", "detail": f"no {path}"})


#: The blocked keys the fake scheduler holds: (origin topic, key) -> GET /ordered-keys's answer.
LANES: dict[tuple[str, str], dict[str, Any]] = {
    ("ledger", "acct-1"): {"head": "h1", "head_status": "parked", "held": 2, "held_ids": ["h2", "h3"]},
    ("ledger", "acct-away"): {"head": "h9", "head_status": "away", "held": 0, "held_ids": []},
    # parked, but GET /parked/h5 does not find it (by id, the scheduler looks in the id's partition)
    ("ledger", "acct-5"): {"head": "h5", "head_status": "parked", "held": 1, "held_ids": ["h6"]},
}


def ordered_keys(request: httpx.Request) -> httpx.Response:
    """The fake scheduler's ordered-keys calls: acct-1 acts, acct-away refuses a replay (409),
    parking a key finds no owner (503)."""
    path, params = request.url.path, request.url.params
    if path == "/ordered-keys/blocked":
        listed = ("head", "head_status", "held")  # the list names no held ids
        items: list[dict[str, Any]] = [
            {"origin_topic": t, "key": k, "key_base64": base64.b64encode(k.encode()).decode(), **{f: lane[f] for f in listed}}
            for (t, k), lane in LANES.items()
        ]
        not_text = {"origin_topic": "ledger", "key": None, "key_base64": "//4=", "head": "h7", "head_status": "parked", "held": 1}
        items.append(not_text)
        if params.get("origin_topic") == "paged":  # two pages, the second after the cursor "c1"
            first = params.get("cursor") is None
            return httpx.Response(200, json={"items": items[:1] if first else items[1:], "next_cursor": "c1" if first else None})
        return httpx.Response(200, json={"items": items, "next_cursor": None})
    lane = LANES.get((params.get("origin_topic", ""), params.get("key", "")))
    if lane is None:
        return httpx.Response(404, json={"error": "not_found", "detail": "the key is not blocked"})
    if path == "/ordered-keys":
        return httpx.Response(200, json=lane)
    if path == "/ordered-keys/replay-head" and lane["head_status"] != "parked":
        return httpx.Response(409, json={"error": "conflict", "detail": f"the head {lane['head']!r} is away, not parked"})
    if path == "/ordered-keys/replay-head":
        return httpx.Response(200, json={"status": "redelivered", "head": lane["head"]})
    if path == "/ordered-keys/skip-head":
        return httpx.Response(200, json={"status": "skipped", "skipped": lane["head"], "head": "h2"})
    return httpx.Response(503, json={"error": "unavailable", "detail": "no instance owns partition 2 yet; retry shortly"})


@pytest.fixture
def calls() -> list[httpx.Request]:
    return []


@pytest.fixture
def console(calls: list[httpx.Request]) -> Iterator[TestClient]:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "scheduler":
            return scheduler(request, calls)
        if request.url.host == "tallies" and request.url.path == "/tallies":
            items = [{"program_id": f"p{i}", "numberActive": i, "numberInactive": 10 - i, "lastLogin": None} for i in range(5)]
            return httpx.Response(200, json={"items": items, "next_cursor": None})
        raise httpx.ConnectError("connection refused", request=request)

    settings = Settings(console_validator_url=VALIDATOR, console_tallies_url=TALLIES, console_retry_scheduler_url=SCHEDULER)
    with TestClient(create_app(settings, httpx.MockTransport(handler), monitor=False)) as client:
        yield client


def test_values_are_json_text_or_hex() -> None:
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    assert render_bytes(b64(b'{"a":[1,2]}')).kind == "json"
    assert '"a": [' in render_bytes(b64(b'{"a":[1,2]}')).text
    assert render_bytes(b64("héllo".encode())).text == "héllo"
    assert render_bytes(b64(b"\xff\x00\x01")).kind == "hex"
    assert render_bytes(b64(bytes(range(20)))).kind == "hex", "control bytes are not text"
    assert render_bytes(None).kind == "none"


def test_partition_ranges_and_metrics() -> None:
    assert ranges([0, 1, 2, 5, 7, 8]) == "0\u20132, 5, 7\u20138"
    assert ranges([]) == "none"
    text = (
        "# TYPE statefleet_messages_processed_total counter\n"
        'statefleet_messages_processed_total{service="tallies",stream="events"} 10.0\n'
        'statefleet_messages_processed_total{service="tallies",stream="logins"} 5.0\n'
    )
    assert processed_total(text) == 15.0
    c = chart([(100.0, 1.0), (130.0, 3.0)], now=130.0, span_s=600.0)
    assert c.span_s == 60.0 and c.peak == 3.0 and c.samples == 2


def test_without_token_actions_are_disabled_and_say_why(console: TestClient) -> None:
    page = console.get("/retries/message", params={"id": "m1"})
    assert page.status_code == 200
    assert "traceparent" in page.text and "shown as json" in page.text
    assert 'data-action="replay" disabled' in page.text
    assert "enter the admin token</a> to redeliver or cancel it" in page.text


def test_a_message_whose_id_is_stats_is_shown_not_the_stats(console: TestClient, calls: list[httpx.Request]) -> None:
    page = console.get("/retries/message", params={"id": "stats"})
    assert page.status_code == 200
    assert [c.url.path for c in calls if c.method == "GET"] == ["/scheduled/stats"]
    assert "traceparent" in page.text


def test_a_refused_call_is_shown_with_its_status(console: TestClient, calls: list[httpx.Request]) -> None:
    resp = console.post("/act", data={"kind": "retry", "action": "replay", "id": "m1"})
    assert resp.status_code == 401
    assert "retry scheduler answered 401" in resp.text and "Replay refused" in resp.text
    assert "Authorization" not in calls[-1].headers

    console.cookies.set(TOKEN_COOKIE, TOKEN)
    busy = console.post("/act", data={"kind": "retry", "action": "replay", "id": "busy"})
    assert busy.status_code == 503 and "recovering or rebalancing" in busy.text
    moved = console.post("/act", data={"kind": "retry", "action": "replay", "id": "moved"})
    assert moved.status_code == 409 and "it changed meanwhile" in moved.text
    ok = console.post("/act", data={"kind": "retry", "action": "replay", "id": "m1"})
    assert ok.status_code == 200 and "redelivered to retry" in ok.text
    assert calls[-1].headers["authorization"] == f"Bearer {TOKEN}"
    cancelled = console.post("/act", data={"kind": "retry", "action": "cancel", "id": "m1"})
    assert cancelled.status_code == 200 and "m1: cancelled" in cancelled.text
    assert calls[-1].method == "DELETE"


def test_payloads_are_read_with_the_operators_token_and_a_refusal_says_which_token_to_enter(
    console: TestClient, calls: list[httpx.Request]
) -> None:
    console.get("/retries/message", params={"id": "m1"})
    assert "authorization" not in calls[-1].headers  # no token entered: none sent
    console.cookies.set(TOKEN_COOKIE, TOKEN)
    pages: list[tuple[str, dict[str, str]]] = [("/retries/message", {"id": "m1"}), ("/parked/message", {"id": "h1"})]
    for path, params in [*pages, ("/retries", {}), ("/parked", {})]:
        assert console.get(path, params=params).status_code == 200, path
    payload_reads = [c for c in calls if c.url.path in ("/scheduled/m1", "/parked/h1", "/retries", "/parked")]
    assert {c.url.path for c in payload_reads if c.headers.get("authorization") == f"Bearer {TOKEN}"} == {
        "/scheduled/m1",
        "/parked/h1",
        "/retries",
        "/parked",
    }
    console.cookies.set(TOKEN_COOKIE, "orders-team-token")
    refused = console.post("/act", data={"kind": "parked", "action": "replay", "id": "billing-1"})
    assert refused.status_code == 403, refused.text
    assert "does not cover this message&#39;s origin topic" in refused.text and "token &#39;orders-team&#39;" in refused.text


def test_confirmation_comes_before_any_change(console: TestClient, calls: list[httpx.Request]) -> None:
    console.cookies.set(TOKEN_COOKIE, TOKEN)
    page = console.get("/confirm", params={"kind": "retry", "action": "cancel", "id": "m1"})
    assert 'method="post" action="/act"' in page.text and 'id="confirm"' in page.text
    assert " disabled" not in page.text.split('id="confirm"')[1].split(">")[0]
    assert not [c for c in calls if c.method != "GET"], "showing the confirmation changes nothing"


def test_token_is_checked_before_it_is_kept(console: TestClient) -> None:
    wrong = console.post("/token", data={"token": "nope", "next": "/parked"})
    assert wrong.status_code == 401 and TOKEN_COOKIE not in wrong.cookies
    right = console.post("/token", data={"token": TOKEN, "next": "https://elsewhere.example/"})
    assert right.status_code == 200 and right.cookies[TOKEN_COOKIE] == TOKEN
    assert 'href="/fleet" id="continue"' in right.text, "only the console's own paths are followed"


def test_console_filters_follow_the_api_cursor(console: TestClient) -> None:
    page = console.get("/retries", params={"attempt": "2"})
    assert 'data-id="a2"' in page.text and 'data-id="a3"' in page.text and 'data-id="a1"' not in page.text


def test_replay_all_counts_first_then_replays_what_the_filter_selects(console: TestClient, calls: list[httpx.Request]) -> None:
    dry = console.get("/parked/replay-all", params={"error_class": "A"})
    assert "<strong>2</strong> parked messages match" in dry.text
    assert not [c for c in calls if c.method == "POST"], "a dry run replays nothing"
    refused = console.post("/parked/replay-all", data={"error_class": "A", "counted": "2"})
    assert refused.status_code == 401
    assert len([c for c in calls if c.method == "POST"]) == 1, "a refused token stops the rest"
    console.cookies.set(TOKEN_COOKIE, TOKEN)
    done = console.post("/parked/replay-all", data={"error_class": "A", "counted": "2"})
    assert "Replayed 2 of 2 selected (the dry run counted 2)" in done.text
    assert sorted(c.url.path for c in calls if c.method == "POST")[-2:] == ["/parked/p1/replay", "/parked/p3/replay"]


def test_tallies_search_and_sort(console: TestClient) -> None:
    page = console.get("/tallies", params={"sort": "numberActive", "order": "desc"})
    assert page.text.index('data-program="p4"') < page.text.index('data-program="p0"')
    assert 'aria-sort="descending"' in page.text
    found = console.get("/tallies", params={"q": "P3"})
    assert 'data-program="p3"' in found.text and 'data-program="p2"' not in found.text


def test_a_service_that_does_not_answer_is_shown_down_with_the_error(console: TestClient) -> None:
    page = console.get("/accounts", params={"account_id": "a1"})
    assert page.status_code == 200
    assert "validator did not answer" in page.text and "connection refused" in page.text


async def test_fleet_poll_rates_and_down_instances() -> None:
    totals = {"n": 100.0}
    up = {"tallies": True}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "tallies" and not up["tallies"]:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/instance":
            base = f"http://{request.url.host}:{request.url.port}"
            return httpx.Response(
                200,
                json={
                    "service": request.url.host,
                    "instance": f"{request.url.host}-0",
                    "url": base,
                    "ready": True,
                    "rebalancing": False,
                    "active": {"events": [0, 1]},
                    "peers": [base],
                    "standby": {"x-memberships-changelog": [2, 3]},
                    "warmup": {"x-memberships-changelog": [3]},
                    "lag": {"events": {"total": 3, "partitions": {"0": 1, "1": 2}}},
                },
            )
        totals["n"] += 50
        body = f'statefleet_messages_processed_total{{service="x",stream="s"}} {totals["n"]}\n'
        return httpx.Response(200, text=body, headers={"content-type": "text/plain"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        clients = Clients(
            *(
                ServiceClient(n, n, [u], http)
                for n, u in (("validator", VALIDATOR), ("tallies", TALLIES), ("retry-scheduler", SCHEDULER))
            )
        )
        monitor = FleetMonitor(clients, interval_s=1, history_s=600, timeout_s=1)
        await monitor.poll()
        await asyncio.sleep(0.05)
        snap = await monitor.poll()
        tallies = next(s for s in snap.services if s.name == "tallies")
        assert tallies.state == "up" and tallies.instances[0].lag == {"events": 3}
        assert tallies.instances[0].warmup == {"x-memberships-changelog": [3]}
        assert tallies.instances[0].rate is not None and tallies.instances[0].rate > 0

        up["tallies"] = False
        snap = await monitor.poll()
        tallies = next(s for s in snap.services if s.name == "tallies")
        assert tallies.state == "down" and "did not answer" in (tallies.error or "")
        assert [i.state for i in tallies.instances] == ["down"], "the instance seen before stays listed, as down"


def test_copies_behind_says_how_far_each_kind_of_copy_is_behind() -> None:
    from services.console.models import copies_behind

    copies: dict[str, dict[str, dict[str, Any]]] = {
        "x-memberships-changelog": {"0": {"source": "active", "lag": 0}, "3": {"source": "standby", "lag": 0}},
        "x-last-logins-changelog": {"3": {"source": "standby", "lag": 1200}, "5": {"source": "restoring", "lag": None}},
    }
    assert copies_behind(copies, "standby") == "up to 1,200 records behind"
    assert copies_behind(copies, "restoring") == "lag not known yet"
    assert copies_behind(copies, "active") == "up to date"
    assert copies_behind({}, "standby") is None


def test_parked_groups_come_first_with_counts_and_the_newest_error(console: TestClient) -> None:
    page = console.get("/parked")
    assert page.status_code == 200
    groups = page.text.split('id="groups"')[1].split("</table>")[0]
    assert 'data-group="orders/Boom"' in groups and ">3<" in groups and "the newest boom" in groups
    assert page.text.index('id="groups"') < page.text.index('id="parked"')
    assert 'data-action="group-replay" disabled' in groups, "read-only without the token"


def test_a_group_action_shows_the_dry_run_count_then_acts_on_confirmation(
    console: TestClient, calls: list[httpx.Request]
) -> None:
    console.cookies.set(TOKEN_COOKIE, TOKEN)
    dry = console.get(
        "/parked/group",
        params={
            "action": "cancel",
            "origin_topic": "orders",
            "error_class": "Boom",
            "parked_from": "2023-11-14T22:13",
            "parked_to": "2023-11-14T22:14:05",
        },
    )
    assert dry.status_code == 200 and "<strong>2</strong> parked messages are in this group" in dry.text
    [call] = [c for c in calls if c.method == "POST"]
    assert call.url.path == "/parked-groups/cancel" and call.url.params["dry_run"] == "true"
    # From the start of its minute, to the end of its second (the form's times are UTC).
    assert (call.url.params["parked_from"], call.url.params["parked_to"]) == ("1699999980000", "1700000045999")
    assert 'id="confirm-group"' in dry.text and 'name="counted" value="2"' in dry.text
    done = console.post(
        "/parked/group",
        data={
            "action": "cancel",
            "origin_topic": "orders",
            "error_class": "Boom",
            "parked_to": "2023-11-14T22:14:05",
            "counted": "2",
        },
    )
    assert "2 cancelled (the dry run counted 2); 1 could not be redelivered" in done.text
    assert "partitions [3] did not answer in time" in done.text
    last = [c for c in calls if c.method == "POST"][-1]
    assert "dry_run" not in last.url.params and last.headers["authorization"] == f"Bearer {TOKEN}"


@pytest.mark.parametrize(
    "params",
    [
        {"action": "cancel", "origin_topic": "orders"},  # no error class
        {"action": "drop", "origin_topic": "orders", "error_class": "Boom"},
        {"action": "cancel", "origin_topic": "orders", "error_class": "Boom", "parked_to": "yesterday"},
    ],
)
def test_a_group_action_without_a_group_or_with_a_bad_time_is_refused(
    console: TestClient, calls: list[httpx.Request], params: dict[str, str]
) -> None:
    console.cookies.set(TOKEN_COOKIE, TOKEN)
    assert console.get("/parked/group", params=params).status_code == 400
    assert console.post("/parked/group", data=params).status_code == 400
    assert not [c for c in calls if c.method == "POST"]


def test_without_the_token_the_group_count_comes_from_the_listing(console: TestClient, calls: list[httpx.Request]) -> None:
    dry = console.get("/parked/group", params={"action": "replay", "origin_topic": "orders", "error_class": "Boom"})
    assert "<strong>3</strong> parked messages are in this group" in dry.text
    assert 'id="confirm-group" class="primary" disabled' in dry.text
    assert not [c for c in calls if c.method == "POST"]


def test_input_topics_no_instance_owns_make_the_service_degraded_and_say_so(console: TestClient) -> None:
    """An assignment that skipped an input topic (its leader had no metadata for it) leaves every
    instance ready, yet none of the topic's records is processed: the fleet page says which."""
    monitor: FleetMonitor = cast(Any, console.app).state.monitor
    ready = InstanceView("http://tallies:8002", "ready", instance_id="tallies-0", unowned_inputs=["t.logins"])
    service = ServiceView("tallies", "Tallies", ["http://tallies:8002"], instances=[ready])
    assert service.unowned_inputs == ["t.logins"]
    monitor._snapshot = FleetSnapshot(1_700_000_000.0, [service])
    table = console.get("/fleet/table")
    assert table.status_code == 200
    warning = table.text.split('data-role="unowned-inputs"')[1].split("</p>")[0]
    assert "No instance processes <code>t.logins</code>" in warning and "gave none of its partitions out" in warning
    assert console.get("/fleet.json").json()["services"][0]["unowned_inputs"] == ["t.logins"]


async def test_the_fleet_poll_reads_unowned_inputs_and_calls_the_service_degraded() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        base = f"http://{request.url.host}:{request.url.port}"
        if request.url.path == "/instance":
            return httpx.Response(
                200,
                json={
                    "service": "tallies",
                    "instance": "tallies-0",
                    "url": base,
                    "ready": True,
                    "rebalancing": False,
                    "active": {"t.account-events": [0, 1]},
                    "peers": [base],
                    "standby": {},
                    "lag": {},
                    "unowned_inputs": ["t.logins"],
                },
            )
        return httpx.Response(200, text="", headers={"content-type": "text/plain"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        clients = Clients(
            *(ServiceClient(n, n, urls, http) for n, urls in (("validator", []), ("tallies", [TALLIES]), ("retry-scheduler", [])))
        )
        monitor = FleetMonitor(clients, interval_s=1, history_s=600, timeout_s=1)
        [tallies] = (await monitor.poll()).services
    assert tallies.instances[0].unowned_inputs == ["t.logins"]
    assert tallies.state == "degraded"


def test_blocked_keys_are_listed_and_a_key_shows_its_head_and_held_records(console: TestClient) -> None:
    listing = console.get("/blocked-keys")
    assert listing.status_code == 200
    assert 'href="/blocked-keys/key?origin_topic=ledger&amp;key=acct-1"' in listing.text
    assert "0xfffe" in listing.text and "not UTF-8 text" in listing.text  # shown, but not linked: no call names it
    key = console.get("/blocked-keys/key", params={"origin_topic": "ledger", "key": "acct-1"})
    assert key.status_code == 200
    assert 'href="/parked/message?id=h1"' in key.text and "h2" in key.text and "h3" in key.text
    assert [b for b in ("replay-head", "skip-head", "park-key") if f'data-action="{b}" disabled' in key.text] == [
        "replay-head",
        "skip-head",
        "park-key",
    ]
    away = console.get("/blocked-keys/key", params={"origin_topic": "ledger", "key": "acct-away"})
    assert 'data-action="replay-head"' not in away.text and 'data-action="skip-head"' in away.text
    moved_on = console.get("/blocked-keys/key", params={"origin_topic": "ledger", "key": "acct-5"})
    assert "/parked/message?id=h5" not in moved_on.text and "h5" in moved_on.text  # its message gone meanwhile: no link
    gone = console.get("/blocked-keys/key", params={"origin_topic": "ledger", "key": "free"})
    assert gone.status_code == 404 and "not blocked (any more)" in gone.text


def test_blocked_keys_are_paged_through_the_api_cursor(console: TestClient, calls: list[httpx.Request]) -> None:
    first = console.get("/blocked-keys", params={"origin_topic": "paged"})
    assert 'href="/blocked-keys?origin_topic=paged&amp;cursor=c1" rel="next"' in first.text and "acct-away" not in first.text
    second = console.get("/blocked-keys", params={"origin_topic": "paged", "cursor": "c1"})
    assert "acct-away" in second.text and 'rel="next"' not in second.text and "First page" in second.text
    assert calls[-1].url.params["cursor"] == "c1" and calls[-1].url.params["origin_topic"] == "paged"


def test_a_key_action_is_confirmed_first_and_refusals_are_readable(console: TestClient, calls: list[httpx.Request]) -> None:
    key = {"origin_topic": "ledger", "key": "acct-1"}
    console.cookies.set(TOKEN_COOKIE, TOKEN)
    confirm = console.get("/blocked-keys/confirm", params={"action": "skip-head", **key})
    assert confirm.status_code == 200 and 'action="/blocked-keys/act"' in confirm.text and "Drop the head h1" in confirm.text
    park = console.get("/blocked-keys/confirm", params={"action": "park-key", **key})
    assert "its head h1 stays in the parking lot, and the 2 records held behind it go to the parking lot" in park.text
    assert not [c for c in calls if c.method != "GET"], "showing the confirmation changes nothing"
    away = {"origin_topic": "ledger", "key": "acct-away"}
    skip_away = console.get("/blocked-keys/confirm", params={"action": "skip-head", **away})
    assert "Stop waiting for the head h9: it is out (redelivered)" in skip_away.text and "Then nothing is held" in skip_away.text
    not_parked = console.get("/blocked-keys/confirm", params={"action": "replay-head", **away})
    assert not_parked.status_code == 409 and "Only a parked head is replayed" in not_parked.text

    skipped = console.post("/blocked-keys/act", data={"action": "skip-head", **key})
    assert skipped.status_code == 200 and "h2, was redelivered and is the head now" in skipped.text
    assert calls[-1].url.path == "/ordered-keys/skip-head" and calls[-1].url.params["key"] == "acct-1"
    assert calls[-1].headers["authorization"] == f"Bearer {TOKEN}"
    replayed = console.post("/blocked-keys/act", data={"action": "replay-head", **key})
    assert replayed.status_code == 200 and "The head h1 was redelivered" in replayed.text
    refused = console.post("/blocked-keys/act", data={"action": "replay-head", **away})
    assert refused.status_code == 409 and "is away, not parked" in refused.text and "reload it" in refused.text
    busy = console.post("/blocked-keys/act", data={"action": "park-key", **key})
    assert busy.status_code == 503 and "no instance owns partition 2" in busy.text and "Traceback" not in busy.text
    gone = console.post("/blocked-keys/act", data={"action": "park-key", "origin_topic": "ledger", "key": "free"})
    assert gone.status_code == 404 and "not blocked any more" in gone.text
    console.cookies.clear()
    unauthorized = console.post("/blocked-keys/act", data={"action": "park-key", **key})
    assert unauthorized.status_code == 401 and "Enter the admin token" in unauthorized.text


def test_a_parked_head_of_a_blocked_key_links_to_its_key(console: TestClient) -> None:
    head = console.get("/parked/message", params={"id": "h1"})
    assert head.status_code == 200 and 'href="/blocked-keys/key?origin_topic=ledger&amp;key=acct-1"' in head.text
    other = console.get("/parked/message", params={"id": "h2"})
    assert other.status_code == 200 and 'id="heads-key"' not in other.text


def test_the_parked_until_field_counts_its_whole_second_as_a_browser_sends_it() -> None:
    """The field takes seconds (step="1"); a browser sends 14:05:00 as "14:05"."""
    at_1405 = 1_769_868_300_000  # 2026-01-31T14:05:00Z
    for typed in ("2026-01-31T14:05", "2026-01-31T14:05:00"):
        _, _, end = parked_range({"parked_to": typed})
        assert end == at_1405 + 999, typed
    _, start, end = parked_range({"parked_from": "2026-01-31T14:05:07", "parked_to": "2026-01-31T14:05:07.250"})
    assert (start, end) == (at_1405 + 7_000, at_1405 + 7_250)
