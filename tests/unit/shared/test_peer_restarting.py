"""POST /instance/restarting: a peer's restart announcement reaches the peer watch, and only
with the admin token."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from shared.engine import Instance
from shared.engine._context import AppContext
from shared.engine._membership import Gone, PeerWatch, Probe
from shared.http.api import create_api
from shared.metrics import PEER_RESTARTS_ANNOUNCED
from shared.settings import Settings

PEER = "http://10.0.0.3:8002"


class FakeApp:
    """Stands for the Faust app: the peer watch is found in its engine context."""

    def __init__(self) -> None:
        self.engine_context = AppContext(Settings(), "tallies")


def client(app: FakeApp, settings: Settings) -> TestClient:
    url = "http://10.0.0.1:8002"
    ctx = SimpleNamespace(settings=settings, url=url, service="tallies", instance=Instance(app, url))  # type: ignore[arg-type]
    return TestClient(create_api(ctx, title="t", description="t"))  # type: ignore[arg-type]


@pytest.mark.parametrize(("grace", "spared"), [(20.0, 20.0), (60.0, 30.0)])
def test_an_announcement_spares_the_peer_for_the_restart_grace_at_most_the_session_timeout(grace: float, spared: float) -> None:
    settings = Settings(session_timeout_s=30, restart_grace_s=grace)
    app = FakeApp()
    watch = PeerWatch(app, "tallies", "g", "http://10.0.0.1:8002", settings)  # type: ignore[arg-type]
    before = PEER_RESTARTS_ANNOUNCED.labels("tallies")._value.get()
    headers = {"Authorization": f"Bearer {settings.admin_token}"}
    got = client(app, settings).post("/instance/restarting", json={"url": PEER + "/"}, headers=headers)
    assert got.status_code == 200
    assert got.json() == {"url": PEER + "/", "noted": True, "grace_s": spared}
    now = time.monotonic()
    assert watch.verdicts.restarting(PEER, now)
    assert watch.verdicts.restarting(PEER, now + spared - 1)
    assert PEER_RESTARTS_ANNOUNCED.labels("tallies")._value.get() == before + 1
    assert not watch.verdicts.restarting(PEER, now + spared + 1)  # the grace has passed


def test_without_a_peer_watch_it_is_answered_but_not_noted() -> None:
    settings = Settings()
    headers = {"Authorization": f"Bearer {settings.admin_token}"}
    got = client(FakeApp(), settings).post("/instance/restarting", json={"url": PEER}, headers=headers)
    assert got.status_code == 200 and got.json()["noted"] is False


def test_it_needs_the_admin_token() -> None:
    settings = Settings()
    api = client(FakeApp(), settings)
    assert api.post("/instance/restarting", json={"url": PEER}).status_code == 401
    wrong = {"Authorization": "Bearer not-the-token"}
    assert api.post("/instance/restarting", json={"url": PEER}, headers=wrong).status_code == 401


class Group:
    """The group as DescribeGroups shows it, and the LeaveGroups sent to it."""

    def __init__(self, members: list[tuple[str, str]]) -> None:
        self.members = members
        self.left: list[str] = []

    async def describe(self) -> tuple[int, list[tuple[str, str | None]]]:
        return 1, list(self.members)

    async def leave(self, coordinator: int, member_id: str) -> None:
        self.left.append(member_id)


def watch_on(group: Group, monkeypatch: pytest.MonkeyPatch) -> PeerWatch:
    watch = PeerWatch(FakeApp(), "tallies", "g", "http://10.0.0.1:8002", Settings())  # type: ignore[arg-type]
    monkeypatch.setattr(watch, "describe_group", group.describe)
    monkeypatch.setattr(watch, "leave_group", group.leave)

    async def refused(url: str) -> Probe:
        return Probe.REFUSED

    monkeypatch.setattr(watch, "probe", refused)
    monkeypatch.setattr("shared.engine._membership.member_urls", lambda app: set())
    return watch


async def test_a_restarted_peer_still_away_after_the_grace_is_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    group = Group([("m-1", PEER), ("m-self", "http://10.0.0.1:8002")])
    watch = watch_on(group, monkeypatch)
    watch._members_at_restart[PEER] = {"m-1"}  # what it had when it announced its restart
    await watch.fail_over(Gone(PEER, 80, 0.0), act=True)
    assert group.left == ["m-1"]  # scaled in, or slow to come back: its partitions move on


async def test_a_restarted_peer_back_under_a_new_member_id_is_not_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    group = Group([("m-2", PEER), ("m-self", "http://10.0.0.1:8002")])
    watch = watch_on(group, monkeypatch)
    watch._members_at_restart[PEER] = {"m-1"}
    watch.verdicts.set_peers([PEER])
    watch.verdicts.record(PEER, Probe.UP, 0.0)
    await watch.fail_over(Gone(PEER, 80, 0.0), act=True)
    assert group.left == []  # rejoined, still recovering with its API not up yet
    assert watch.verdicts.gone(100.0) == []  # judged again only once seen answering
