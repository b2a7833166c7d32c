"""A route whose key may be in any of several partitions (``located_key``) answers from the one
that holds it: each is asked in turn, here or at its owner with ``X-Statefleet-Partition``,
its home partition first; where none holds it, the home partition's own answer stands."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Path

from shared.engine import Copy
from shared.http.api import create_api
from shared.http.context import ServiceContext
from shared.http.deps import Ctx, Located, located_key
from shared.http.errors import NotFound
from shared.http.forwarding import FORWARDED_BY, PARTITION_ASKED
from shared.settings import Settings
from tests.support.forwarding import INSTANCE, TABLE, stand_in_engine

ME, PEER = "http://me:1", "http://peer:2"
HOME = 5  # every item's home partition in these tests


@dataclass
class StandInFleet:
    """Which partitions this instance owns (the peer owns the rest), where items are, and what
    the peer was asked."""

    mine: set[int] = field(default_factory=lambda: set(range(8)))
    items: dict[str, int] = field(default_factory=dict)  # item -> the partition it is in
    asked: list[httpx.Request] = field(default_factory=list)

    def owner(self, partition: int) -> str:
        return ME if partition in self.mine else PEER

    def peer(self, request: httpx.Request) -> httpx.Response:
        """The peer answers for the partition it is asked about, as the route would."""
        self.asked.append(request)
        item = request.url.path.split("/")[2]  # /items/{item}[/touch]
        partition = int(request.headers.get(PARTITION_ASKED, HOME))
        if self.items.get(item) == partition:
            return httpx.Response(200, json={"item": item, "partition": partition, "by": PEER})
        return httpx.Response(404, json={"detail": f"not in partition {partition} at the peer"})


class ReadyContext(ServiceContext):
    def ready(self) -> bool:
        return True


async def _item_id(item: Annotated[str, Path(min_length=1)]) -> str:
    return item


def _table(_: ServiceContext) -> Any:
    return TABLE


def _places(_: ServiceContext, item: str) -> list[int]:
    return [HOME, *(p for p in range(8) if p != HOME)]


def _holds(ctx: ServiceContext, item: str, partition: int) -> bool:
    stand_in_fleet: StandInFleet = ctx.extras["fleet"]
    return stand_in_fleet.items.get(item) == partition


ItemRead = Annotated[Located, located_key(_item_id, _table, _places, _holds)]
ItemChange = Annotated[Located, located_key(_item_id, _table, _places, _holds, reads=False)]


def service(stand_in_fleet: StandInFleet) -> FastAPI:
    ctx = ReadyContext(
        service="test",
        settings=Settings(read_retry_s=0),
        instance=INSTANCE,
        topics=None,  # type: ignore[arg-type]
        url=ME,
        transport=httpx.MockTransport(stand_in_fleet.peer),
    )
    ctx.extras["fleet"] = stand_in_fleet
    router = APIRouter()

    @router.get("/items/{item}")
    async def get_item(item: ItemRead, ctx: Ctx) -> Any:
        if stand_in_fleet.items.get(item.key) != item.partition:
            raise NotFound(f"no item {item.key!r} in partition {item.partition} here")
        return {"item": item.key, "partition": item.partition, "by": ctx.url}

    @router.post("/items/{item}/touch")
    async def touch_item(item: ItemChange, ctx: Ctx) -> Any:
        if stand_in_fleet.items.get(item.key) != item.partition:
            raise NotFound(f"no item {item.key!r} in partition {item.partition} here")
        return {"touched": item.key, "partition": item.partition, "by": ctx.url}

    api = create_api(ctx, title="t", description="t")
    api.include_router(router)
    return api


@pytest.fixture
def stand_in_fleet(monkeypatch: pytest.MonkeyPatch) -> StandInFleet:
    state = StandInFleet()
    stand_in_engine(monkeypatch, owner=state.owner, copy=lambda: Copy("active", 0), instances={ME, PEER})
    return state


def client(stand_in_fleet: StandInFleet) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=service(stand_in_fleet)), base_url=ME)


def partitions_asked(stand_in_fleet: StandInFleet) -> list[int]:
    return [int(request.headers[PARTITION_ASKED]) for request in stand_in_fleet.asked]


async def test_an_item_in_its_home_partition_is_answered_there_without_asking_further(stand_in_fleet: StandInFleet) -> None:
    stand_in_fleet.items["a"] = HOME
    stand_in_fleet.mine = {HOME}
    async with client(stand_in_fleet) as http:
        got = await http.get("/items/a")
    assert got.json() == {"item": "a", "partition": HOME, "by": ME}
    assert stand_in_fleet.asked == []


async def test_an_item_elsewhere_is_found_in_the_partition_that_holds_it_here_or_at_its_owner(
    stand_in_fleet: StandInFleet,
) -> None:
    stand_in_fleet.items = {"here": 2, "there": 6}
    stand_in_fleet.mine = {HOME, 0, 1, 2}
    async with client(stand_in_fleet) as http:
        here = await http.get("/items/here")
        assert partitions_asked(stand_in_fleet) == [], "partitions 0 to 2 are this instance's: read here"
        there = await http.get("/items/there")
    assert here.json() == {"item": "here", "partition": 2, "by": ME}
    assert there.json() == {"item": "there", "partition": 6, "by": PEER}
    assert partitions_asked(stand_in_fleet) == [3, 4, 6], "the peer's partitions are asked one by one until one holds it"
    assert all(request.headers[FORWARDED_BY] == ME for request in stand_in_fleet.asked)


async def test_an_item_nowhere_gets_its_home_partitions_answer(stand_in_fleet: StandInFleet) -> None:
    stand_in_fleet.mine = {HOME}
    async with client(stand_in_fleet) as http:
        got = await http.get("/items/nowhere")
    assert got.status_code == 404
    assert got.json()["detail"] == f"no item 'nowhere' in partition {HOME} here"
    assert sorted(partitions_asked(stand_in_fleet)) == [p for p in range(8) if p != HOME]

    stand_in_fleet.mine, stand_in_fleet.asked = {0}, []
    async with client(stand_in_fleet) as http:
        got = await http.get("/items/nowhere")
    assert got.status_code == 404 and got.json()["detail"] == f"not in partition {HOME} at the peer"
    assert partitions_asked(stand_in_fleet)[0] == HOME


async def test_a_change_runs_at_the_owner_of_the_partition_that_holds_it(stand_in_fleet: StandInFleet) -> None:
    stand_in_fleet.items = {"a": 3}
    stand_in_fleet.mine = {HOME}
    async with client(stand_in_fleet) as http:
        got = await http.post("/items/a/touch")
    assert got.status_code == 200 and got.json() == {"item": "a", "partition": 3, "by": PEER}
    assert [r.method for r in stand_in_fleet.asked] == ["POST"] * len(stand_in_fleet.asked) and partitions_asked(stand_in_fleet)[
        -1
    ] == 3


async def test_a_request_naming_its_partition_is_answered_for_that_partition_alone(stand_in_fleet: StandInFleet) -> None:
    stand_in_fleet.items = {"a": 3}
    async with client(stand_in_fleet) as http:
        found = await http.get("/items/a", headers={PARTITION_ASKED: "3"})
        elsewhere = await http.get("/items/a", headers={PARTITION_ASKED: "4"})
        wrong = await http.get("/items/a", headers={PARTITION_ASKED: "8"})
    assert found.json()["partition"] == 3
    assert elsewhere.status_code == 404 and "partition 4" in elsewhere.json()["detail"]
    assert wrong.status_code == 422 and PARTITION_ASKED in wrong.json()["detail"]
    assert stand_in_fleet.asked == []


async def test_a_partition_that_cannot_answer_is_not_taken_for_one_without_the_item(
    stand_in_fleet: StandInFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in_fleet.mine = {HOME}

    def peer_restoring(request: httpx.Request) -> httpx.Response:
        stand_in_fleet.asked.append(request)
        return httpx.Response(503, json={"detail": "restoring"})

    monkeypatch.setattr(stand_in_fleet, "peer", peer_restoring)
    async with client(stand_in_fleet) as http:
        got = await http.post("/items/a/touch")
    assert got.status_code == 503 and got.json()["detail"] == "restoring"
    assert len(stand_in_fleet.asked) == 1, "the first partition that cannot answer ends the search"
