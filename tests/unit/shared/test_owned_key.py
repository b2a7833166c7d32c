"""A route that declares its key with ``owned_key`` runs its body only where the key is
answered; elsewhere the answer of the instance that should answer is passed on as it was given,
and a request the route would refuse is refused where it arrived, never forwarded."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Path, Query

from shared.engine import Copy
from shared.http.api import create_api
from shared.http.context import ServiceContext
from shared.http.deps import Ctx, owned_key
from shared.http.errors import ApiError
from shared.http.forwarding import FORWARDED_BY, LAG, READ_COPY, SERVED_BY, SOURCE
from shared.settings import Settings
from tests.support.forwarding import INSTANCE, TABLE, stand_in_engine

ME, OWNER, PEER = "http://me:1", "http://owner:2", "http://peer:3"


@dataclass
class StandInFleet:
    """The owner of every partition, this instance's copy, and what the peers were asked."""

    owner: str | None = ME
    mine: Copy | None = field(default_factory=lambda: Copy("active", 0))
    asked: list[httpx.Request] = field(default_factory=list)
    answered: list[str] = field(default_factory=list)

    def transport(self, request: httpx.Request) -> httpx.Response:
        self.asked.append(request)
        if request.headers.get(READ_COPY):  # asked for its copy: the peer is away too
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(201, json={"from": "owner"}, headers={"X-Owner-Header": "kept", SOURCE: "standby", LAG: "3"})


class ReadyContext(ServiceContext):
    def ready(self) -> bool:
        return True


async def _item_id(item_id: Annotated[str, Path(min_length=1, max_length=5)]) -> str:
    return item_id


def _no_x(item_id: str) -> None:
    if "x" in item_id:
        raise ApiError("item_id must not hold x")


def _table(_: ServiceContext) -> Any:
    return TABLE


#: Read here by the owner of the item's partition (or a copy), with a check of its own.
ItemRead = Annotated[str, owned_key(_item_id, _table, check=_no_x)]
#: Changed by the active owner of the item's partition only.
ItemChange = Annotated[str, owned_key(_item_id, _table, reads=False)]


def service(stand_in_fleet: StandInFleet) -> FastAPI:
    ctx = ReadyContext(
        service="test",
        settings=Settings(read_retry_s=0),
        instance=INSTANCE,
        topics=None,  # type: ignore[arg-type]
        url=ME,
        transport=httpx.MockTransport(stand_in_fleet.transport),
    )
    router = APIRouter()

    @router.get("/items/{item_id}")
    async def get_item(item_id: ItemRead, ctx: Ctx, limit: Annotated[int, Query(ge=1, le=10)] = 5) -> Any:
        stand_in_fleet.answered.append(item_id)
        return {"item_id": item_id, "limit": limit, "by": ctx.url}

    @router.post("/items/{item_id}/touch")
    async def touch_item(item_id: ItemChange) -> Any:
        stand_in_fleet.answered.append(item_id)
        return {"touched": item_id}

    api = create_api(ctx, title="t", description="t")
    api.include_router(router)
    return api


@pytest.fixture
def stand_in_fleet(monkeypatch: pytest.MonkeyPatch) -> StandInFleet:
    state = StandInFleet()
    stand_in_engine(monkeypatch, owner=lambda _: state.owner, copy=lambda: state.mine, instances={ME, OWNER})
    return state


def client(stand_in_fleet: StandInFleet) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=service(stand_in_fleet)), base_url=ME)


async def test_the_owner_answers_from_its_own_state(stand_in_fleet: StandInFleet) -> None:
    async with client(stand_in_fleet) as http:
        got = await http.get("/items/a1", params={"limit": 2})
    assert got.status_code == 200 and got.json() == {"item_id": "a1", "limit": 2, "by": ME}
    assert got.headers[SOURCE] == "active" and got.headers[LAG] == "0" and got.headers[SERVED_BY] == ME
    assert stand_in_fleet.asked == []


async def test_elsewhere_the_owners_answer_is_passed_on_as_given(stand_in_fleet: StandInFleet) -> None:
    stand_in_fleet.owner = OWNER
    async with client(stand_in_fleet) as http:
        got = await http.get("/items/a1", params={"limit": 2})
    assert got.status_code == 201 and got.json() == {"from": "owner"}
    assert got.headers["x-owner-header"] == "kept"
    assert (got.headers[SERVED_BY], got.headers[SOURCE], got.headers[LAG]) == (OWNER, "standby", "3")
    [sent] = stand_in_fleet.asked
    assert sent.url == httpx.URL(f"{OWNER}/items/a1?limit=2") and sent.headers[FORWARDED_BY] == ME
    assert stand_in_fleet.answered == [], "the route's body does not run where the key is not answered"


async def test_a_change_goes_to_the_active_owner_and_runs_there(stand_in_fleet: StandInFleet) -> None:
    async with client(stand_in_fleet) as http:
        assert (await http.post("/items/a1/touch")).json() == {"touched": "a1"}
        stand_in_fleet.owner = OWNER
        got = await http.post("/items/a2/touch")
    assert got.status_code == 201 and got.headers[SERVED_BY] == OWNER
    [sent] = stand_in_fleet.asked
    assert sent.method == "POST" and not sent.headers.get(READ_COPY)
    assert stand_in_fleet.answered == ["a1"]


@pytest.mark.parametrize(("query", "loc"), [({"limit": "0"}, ["query", "limit"]), ({"max_lag": "-1"}, ["query", "max_lag"])])
async def test_a_request_the_route_refuses_is_refused_here_and_never_forwarded(
    stand_in_fleet: StandInFleet, query: dict[str, str], loc: list[str]
) -> None:
    stand_in_fleet.owner = OWNER
    async with client(stand_in_fleet) as http:
        got = await http.get("/items/a1", params=query)
    assert got.status_code == 422 and [e["loc"] for e in got.json()["detail"]] == [loc]
    assert got.headers[SERVED_BY] == ME and SOURCE not in got.headers
    assert stand_in_fleet.asked == []


async def test_an_invalid_key_is_refused_once_here(stand_in_fleet: StandInFleet) -> None:
    stand_in_fleet.owner = OWNER
    async with client(stand_in_fleet) as http:
        got = await http.get("/items/toolong", params={"max_lag": "x"})
    assert got.status_code == 422
    assert [e["loc"] for e in got.json()["detail"]] == [["query", "max_lag"], ["path", "item_id"]]
    assert stand_in_fleet.asked == []


async def test_the_routes_check_of_its_key_comes_after_validation_and_before_routing(stand_in_fleet: StandInFleet) -> None:
    stand_in_fleet.owner = OWNER
    async with client(stand_in_fleet) as http:
        refused = await http.get("/items/ax")
        invalid = await http.get("/items/ax", params={"limit": "11"})
    assert refused.status_code == 400 and "must not hold x" in refused.text
    assert invalid.status_code == 422
    assert stand_in_fleet.asked == []


async def test_an_owner_away_is_answered_from_this_instances_copy(stand_in_fleet: StandInFleet) -> None:
    stand_in_fleet.owner, stand_in_fleet.mine = None, Copy("standby", 4)
    async with client(stand_in_fleet) as http:
        got = await http.get("/items/a1")
        stale = await http.get("/items/a1", params={"max_lag": "2"})
    assert got.status_code == 200 and (got.headers[SOURCE], got.headers[LAG]) == ("standby", "4")
    assert stale.status_code == 503 and stale.headers["Retry-After"] == "1" and stale.json()["lag"] == 4
    assert stand_in_fleet.answered == ["a1"]


def test_a_read_documents_max_lag_and_a_change_does_not(stand_in_fleet: StandInFleet) -> None:
    schema = service(stand_in_fleet).openapi()
    read = schema["paths"]["/items/{item_id}"]["get"]
    change = schema["paths"]["/items/{item_id}/touch"]["post"]
    assert [(p["in"], p["name"]) for p in read["parameters"]] == [("path", "item_id"), ("query", "limit"), ("query", "max_lag")]
    assert [(p["in"], p["name"]) for p in change["parameters"]] == [("path", "item_id")]
    assert SOURCE in read["responses"]["200"]["headers"]
