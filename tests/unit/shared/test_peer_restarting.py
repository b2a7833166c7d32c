"""POST /instance/restarting: a peer's restart announcement reaches the peer watch, and only
with the admin token."""

from __future__ import annotations

import time
from types import SimpleNamespace

from fastapi.testclient import TestClient

from shared.engine._membership import PeerWatch
from shared.http.api import create_api
from shared.metrics import PEER_RESTARTS_ANNOUNCED
from shared.settings import Settings

PEER = "http://10.0.0.3:8002"


class FakeApp:
    """Stands for the Faust app: the peer watch is looked up by it."""


def client(app: FakeApp, settings: Settings) -> TestClient:
    ctx = SimpleNamespace(settings=settings, url="http://10.0.0.1:8002", service="tallies", app=app)
    return TestClient(create_api(ctx, title="t", description="t"))  # type: ignore[arg-type]


def test_an_announcement_spares_the_peer_for_the_session_timeout() -> None:
    settings = Settings(session_timeout_s=30)
    app = FakeApp()
    watch = PeerWatch(app, "tallies", "g", "http://10.0.0.1:8002", settings)  # type: ignore[arg-type]
    before = PEER_RESTARTS_ANNOUNCED.labels("tallies")._value.get()
    headers = {"Authorization": f"Bearer {settings.admin_token}"}
    got = client(app, settings).post("/instance/restarting", json={"url": PEER + "/"}, headers=headers)
    assert got.status_code == 200
    assert got.json() == {"url": PEER + "/", "noted": True, "grace_s": 30.0}
    now = time.monotonic()
    assert watch.verdicts.restarting(PEER, now)
    assert PEER_RESTARTS_ANNOUNCED.labels("tallies")._value.get() == before + 1
    assert not watch.verdicts.restarting(PEER, now + 31)  # the session timeout has passed


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
