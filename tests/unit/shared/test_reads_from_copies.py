"""Which instance answers a read, without a broker: the owner when it answers, else the freshest
copy of the partition (this instance's or a peer's), never a copy staler than ``?max_lag``,
and never a copy for a change."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from starlette.requests import Request

from shared.engine import Copy
from shared.http import forwarding
from shared.http.context import ServiceContext
from shared.http.errors import Unavailable, Unprocessable
from shared.http.forwarding import LAG, READ_COPY, SOURCE, StaleCopy, read_from_headers, route
from shared.settings import Settings
from tests.support.forwarding import INSTANCE, TABLE, stand_in_engine

ME, OWNER, PEER_A, PEER_B = "http://me:1", "http://owner:2", "http://peer-a:3", "http://peer-b:4"


@dataclass
class StandInFleet:
    """What the routing sees of the fleet: the owner map, this instance's copy, peers' answers."""

    owner: str | None = OWNER
    #: partition -> owner, where owners differ by partition (lists)
    owners: dict[int, str] = field(default_factory=dict)
    mine: Copy | None = None
    rebalancing: bool = False
    #: peer URL -> (status, lag header) it answers with; absent: it does not answer at all
    answers: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    asked: list[httpx.Request] = field(default_factory=list)

    def transport(self, request: httpx.Request) -> httpx.Response:
        self.asked.append(request)
        peer = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if peer not in self.answers:
            raise httpx.ConnectError("connection refused", request=request)
        status, lag = self.answers[peer]
        headers = {"x-statefleet-source": "standby"} if request.headers.get(READ_COPY) else {}
        if lag is not None and headers:
            headers[LAG] = str(lag)
        body = {"from": peer, "partitions": request.url.params.get("partitions")}
        return httpx.Response(status, json=body, headers=headers)


@pytest.fixture
def stand_in_fleet(monkeypatch: pytest.MonkeyPatch) -> StandInFleet:
    state = StandInFleet()
    stand_in_engine(
        monkeypatch,
        owner=lambda p: state.owners.get(p, state.owner),
        copy=lambda: state.mine,
        instances={ME, OWNER, PEER_A, PEER_B},
    )
    return state


def context(stand_in_fleet: StandInFleet, **settings: Any) -> ServiceContext:
    INSTANCE.rebalancing = stand_in_fleet.rebalancing
    ctx = ServiceContext(
        service="tallies",
        settings=Settings(read_retry_s=0, **settings),
        instance=INSTANCE,
        topics=None,  # type: ignore[arg-type]
        url=ME,
        transport=httpx.MockTransport(stand_in_fleet.transport),
    )
    return ctx


def request(method: str = "GET", query: bytes = b"", headers: dict[str, str] | None = None) -> Request:
    scope = {
        "type": "http",
        "method": method,
        "scheme": "http",
        "server": ("me", 1),
        "root_path": "",
        "path": "/tallies/p1",
        "raw_path": b"/tallies/p1",
        "query_string": query,
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
    }

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    return Request(scope, receive)


async def test_the_owner_answers_when_it_can(stand_in_fleet: StandInFleet) -> None:
    stand_in_fleet.answers = {OWNER: (200, 0)}
    resp = await route(context(stand_in_fleet), request(), TABLE, 3)
    assert resp is not None and resp.status_code == 200 and bytes(resp.body).startswith(b'{"from":"http://owner:2"')


async def test_the_owner_itself_answers_from_its_active_copy(stand_in_fleet: StandInFleet) -> None:
    stand_in_fleet.owner, stand_in_fleet.mine = ME, Copy("active", 0)
    req = request()
    assert await route(context(stand_in_fleet), req, TABLE, 3) is None
    assert read_from_headers(req.state.read_from) == {SOURCE: "active", LAG: "0"}
    assert stand_in_fleet.asked == []


async def test_a_dead_owner_is_read_from_an_up_to_date_local_standby_and_then_skipped(stand_in_fleet: StandInFleet) -> None:
    stand_in_fleet.mine = Copy("standby", 0)
    ctx = context(stand_in_fleet)
    req = request()
    assert await route(ctx, req, TABLE, 3) is None
    assert read_from_headers(req.state.read_from) == {SOURCE: "standby", LAG: "0"}
    assert ctx.suspected(OWNER)
    stand_in_fleet.asked.clear()
    assert await route(ctx, request(), TABLE, 3) is None
    assert stand_in_fleet.asked == [], "a suspected owner is not asked again at once"


async def test_the_freshest_peer_copy_wins_over_a_stale_local_one(stand_in_fleet: StandInFleet) -> None:
    stand_in_fleet.mine = Copy("standby", 40)
    stand_in_fleet.answers = {PEER_A: (200, 7), PEER_B: (404, 0)}  # 404: the key is not there, as of an up-to-date copy
    resp = await route(context(stand_in_fleet), request(), TABLE, 3)
    assert resp is not None and resp.status_code == 404 and bytes(resp.body).startswith(b'{"from":"http://peer-b:4"')
    copy_reads = [r for r in stand_in_fleet.asked if r.headers.get(READ_COPY)]
    assert {str(r.url.host) for r in copy_reads} >= {"peer-a", "peer-b"}


async def test_an_owner_that_answers_503_is_asked_for_its_copy_too(stand_in_fleet: StandInFleet) -> None:
    stand_in_fleet.answers = {OWNER: (503, None), PEER_A: (200, 12)}
    ctx = context(stand_in_fleet)
    resp = await route(ctx, request(), TABLE, 3)
    assert resp is not None and bytes(resp.body).startswith(b'{"from":"http://peer-a:3"')
    assert any(r.headers.get(READ_COPY) and r.url.host == "owner" for r in stand_in_fleet.asked)
    assert not ctx.suspected(OWNER), "an owner that answered is not suspected"


async def test_a_stale_local_copy_is_answered_when_nothing_fresher_turns_up(stand_in_fleet: StandInFleet) -> None:
    stand_in_fleet.mine = Copy("standby", 40)
    req = request()
    assert await route(context(stand_in_fleet), req, TABLE, 3) is None
    assert read_from_headers(req.state.read_from) == {SOURCE: "standby", LAG: "40"}


async def test_max_lag_refuses_a_staler_copy_with_its_lag(stand_in_fleet: StandInFleet) -> None:
    stand_in_fleet.mine = Copy("standby", 40)
    with pytest.raises(StaleCopy) as refused:
        await route(context(stand_in_fleet), request(query=b"max_lag=10"), TABLE, 3)
    assert refused.value.status == 503
    assert refused.value.headers["Retry-After"] == "1"
    assert refused.value.extra == {"lag": 40, "max_lag": 10}


async def test_max_lag_accepts_a_copy_within_it(stand_in_fleet: StandInFleet) -> None:
    stand_in_fleet.mine = Copy("restoring", 10)
    req = request(query=b"max_lag=10")
    assert await route(context(stand_in_fleet), req, TABLE, 3) is None
    assert read_from_headers(req.state.read_from) == {SOURCE: "restoring", LAG: "10"}


async def test_max_lag_must_be_a_whole_number(stand_in_fleet: StandInFleet) -> None:
    with pytest.raises(Unprocessable):
        await route(context(stand_in_fleet), request(query=b"max_lag=-1"), TABLE, 3)


async def test_no_copy_anywhere_is_503_with_what_was_asked(stand_in_fleet: StandInFleet) -> None:
    stand_in_fleet.answers = {PEER_A: (503, None)}
    with pytest.raises(Unavailable) as refused:
        await route(context(stand_in_fleet), request(), TABLE, 3)
    assert "partition 3" in str(refused.value.detail) and "peer-a:3 answered 503" in str(refused.value.detail)
    assert refused.value.headers["Retry-After"] == "1"


async def test_a_copy_read_from_a_peer_answers_only_from_this_instance(stand_in_fleet: StandInFleet) -> None:
    with pytest.raises(Unavailable):
        await route(context(stand_in_fleet), request(headers={READ_COPY: "1"}), TABLE, 3)
    stand_in_fleet.mine = Copy("standby", 2)
    req = request(headers={READ_COPY: "1"})
    assert await route(context(stand_in_fleet), req, TABLE, 3) is None
    assert read_from_headers(req.state.read_from) == {SOURCE: "standby", LAG: "2"}
    assert stand_in_fleet.asked == []


async def test_changes_never_go_to_a_copy(stand_in_fleet: StandInFleet) -> None:
    stand_in_fleet.mine = Copy("standby", 0)
    with pytest.raises(Unavailable) as refused:
        await route(context(stand_in_fleet), request(method="POST"), TABLE, 3)
    assert "did not answer" in str(refused.value.detail)
    assert not any(r.headers.get(READ_COPY) for r in stand_in_fleet.asked)


async def test_during_a_rebalance_reads_go_to_copies(stand_in_fleet: StandInFleet) -> None:
    stand_in_fleet.rebalancing = True
    stand_in_fleet.mine = Copy("standby", 0)
    req = request()
    assert await route(context(stand_in_fleet), req, TABLE, 3) is None
    assert read_from_headers(req.state.read_from)[SOURCE] == "standby"


def split_owners(stand_in_fleet: StandInFleet) -> None:
    stand_in_fleet.owners = {p: (OWNER if p < 4 else PEER_A) for p in range(8)}


async def test_a_list_takes_each_partition_from_its_owner(stand_in_fleet: StandInFleet) -> None:
    split_owners(stand_in_fleet)
    stand_in_fleet.answers = {OWNER: (200, None), PEER_A: (200, None)}
    req = request(query=b"limit=5")
    pages = await forwarding.gather(context(stand_in_fleet, topic_partitions=8), req, TABLE, local_pages)
    assert sorted(page["partitions"] for page in pages) == ["0,1,2,3", "4,5,6,7"]
    assert read_from_headers(req.state.read_from) == {SOURCE: "active", LAG: "0"}


async def test_a_list_takes_a_dead_owners_partitions_from_the_freshest_copies(stand_in_fleet: StandInFleet) -> None:
    split_owners(stand_in_fleet)
    stand_in_fleet.answers = {OWNER: (200, None), PEER_B: (200, 0)}  # peer-a, the owner of 4-7, is dead
    stand_in_fleet.mine = Copy("standby", 9)
    req = request()
    pages = await forwarding.gather(context(stand_in_fleet, topic_partitions=8), req, TABLE, local_pages)
    assert sorted(str(page["partitions"]) for page in pages) == ["0,1,2,3", "4", "5", "6", "7"]
    assert all(page["from"] == PEER_B for page in pages if page["partitions"] in ("4", "5", "6", "7"))
    assert read_from_headers(req.state.read_from) == {SOURCE: "standby", LAG: "0"}


async def test_a_list_refuses_copies_staler_than_max_lag(stand_in_fleet: StandInFleet) -> None:
    split_owners(stand_in_fleet)
    stand_in_fleet.answers = {OWNER: (200, None)}
    stand_in_fleet.mine = Copy("standby", 9)
    with pytest.raises(StaleCopy) as refused:
        await forwarding.gather(context(stand_in_fleet, topic_partitions=8), request(query=b"max_lag=3"), TABLE, local_pages)
    assert refused.value.extra == {"lag": 9, "max_lag": 3}


async def local_pages(partitions: list[int]) -> dict[str, Any]:
    return {"from": ME, "partitions": ",".join(map(str, partitions))}


def asked_as_owner(partitions: str) -> Request:
    """A peer gathering a list asks this instance for the partitions it takes it to own."""
    return request(query=f"limit=5&scope=local&partitions={partitions}".encode())


async def test_the_owners_part_of_a_list_comes_from_an_owner_that_has_restored_them(
    stand_in_fleet: StandInFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = context(stand_in_fleet)
    monkeypatch.setattr(ctx, "ready", lambda: True)
    req = asked_as_owner("1,3")
    assert await forwarding.local_scope_partitions(ctx, req, TABLE, {1, 2, 3}) == [1, 3]
    assert read_from_headers(getattr(req.state, "read_from", None)) == {}  # the asker takes it as the active owner's answer


@pytest.mark.parametrize(
    ("ready", "rebalancing", "owned"),
    [
        (False, False, {1, 2, 3}),  # restoring: a member that rejoined still holds the state of before
        (True, True, {1, 2, 3}),  # a rebalance under way
        (True, False, {1, 2}),  # partition 3 moved away
    ],
    ids=["restoring", "rebalancing", "not-owned"],
)
async def test_the_owners_part_of_a_list_is_refused_unless_it_is_current_here(
    stand_in_fleet: StandInFleet, monkeypatch: pytest.MonkeyPatch, ready: bool, rebalancing: bool, owned: set[int]
) -> None:
    stand_in_fleet.rebalancing = rebalancing
    ctx = context(stand_in_fleet)
    monkeypatch.setattr(ctx, "ready", lambda: ready)
    with pytest.raises(Unavailable) as refused:
        await forwarding.local_scope_partitions(ctx, asked_as_owner("1,3"), TABLE, owned)
    assert refused.value.headers["Retry-After"] == "1"


async def test_a_copy_read_of_a_list_is_answered_while_restoring_with_its_lag(
    stand_in_fleet: StandInFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in_fleet.mine = Copy("restoring", 5)
    ctx = context(stand_in_fleet)
    monkeypatch.setattr(ctx, "ready", lambda: False)
    req = request(query=b"limit=5&scope=local&partitions=1,3", headers={READ_COPY: "1"})
    assert await forwarding.local_scope_partitions(ctx, req, TABLE, {1, 2, 3}) == [1, 3]
    assert read_from_headers(req.state.read_from) == {SOURCE: "restoring", LAG: "5"}


async def test_a_list_whose_owner_is_restoring_takes_those_partitions_from_copies(stand_in_fleet: StandInFleet) -> None:
    split_owners(stand_in_fleet)
    # The owner of 0-3 rejoined and restores: it refuses its owner's part, its copy is behind.
    stand_in_fleet.answers = {OWNER: (503, 40), PEER_A: (200, None), PEER_B: (200, 0)}
    req = request()
    pages = await forwarding.gather(context(stand_in_fleet, topic_partitions=8), req, TABLE, local_pages)
    assert sorted(str(page["partitions"]) for page in pages) == ["0", "1", "2", "3", "4,5,6,7"]
    assert all(page["from"] == PEER_B for page in pages if page["partitions"] in ("0", "1", "2", "3"))
    assert read_from_headers(req.state.read_from) == {SOURCE: "standby", LAG: "0"}


async def test_a_list_asks_each_peer_with_the_callers_token_and_nothing_else_of_its_headers(stand_in_fleet: StandInFleet) -> None:
    split_owners(stand_in_fleet)
    stand_in_fleet.answers = {OWNER: (200, None), PEER_A: (200, None)}
    req = request(headers={"Authorization": "Bearer team-secret", "Cookie": "c=1"})
    await forwarding.gather(context(stand_in_fleet, topic_partitions=8), req, TABLE, local_pages)
    assert len(stand_in_fleet.asked) == 2
    for asked in stand_in_fleet.asked:  # a peer's part shows the payloads this caller's token covers, no more
        assert asked.headers["authorization"] == "Bearer team-secret" and "cookie" not in asked.headers
    stand_in_fleet.asked.clear()
    await forwarding.gather(context(stand_in_fleet, topic_partitions=8), request(), TABLE, local_pages)
    assert [a.headers.get("authorization") for a in stand_in_fleet.asked] == [None, None]
