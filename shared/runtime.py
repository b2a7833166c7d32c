"""Wire a service's engine to its HTTP API, and run it: the same for every service."""

from __future__ import annotations

import sys
from typing import Protocol

from fastapi import APIRouter, FastAPI

from shared.engine import BrokerAccessDenied, Engine, TopicSpec, app_id, ensure_topics
from shared.http.api import create_api
from shared.http.context import ServiceContext
from shared.settings import Settings, UnsafeSettings
from shared.topics import TopicNames


class StreamService(Protocol):
    """What every service's app class offers."""

    engine: Engine
    topics: TopicNames

    def topic_specs(self) -> list[TopicSpec]: ...


def serve_http(
    service: StreamService, name: str, default_port: int, settings: Settings, router: APIRouter, *, title: str, description: str
) -> FastAPI:
    """The service's FastAPI app (health, metrics, its router), served on the worker's loop.

    Exits, saying what to set, when the settings are fit only for a local run and this is not one.
    """
    try:
        settings.check_deployable()
    except UnsafeSettings as exc:
        raise SystemExit(f"error: {exc}") from None
    ctx = ServiceContext(
        service=name,
        settings=settings,
        instance=service.engine.instance,
        topics=service.topics,
        url=settings.url_for(default_port),
        extras={"service": service},
    )
    api = create_api(ctx, title=title, description=description)
    api.include_router(router)
    service.engine.serve(api)
    return api


def run(service: StreamService, name: str, settings: Settings) -> None:
    """Create the service's topics if missing, then run its worker until SIGTERM.

    Exits, saying what is wrong and what to change, when the brokers refuse the service's
    credentials or its user lacks an ACL it needs: the worker would not get further.

    With ``--describe`` it prints the service's topology instead (no broker needed)."""
    if "--describe" in sys.argv[1:]:
        print(service.engine.describe())
        return
    try:
        ensure_topics(settings, service.topic_specs(), group=app_id(name, settings))
    except BrokerAccessDenied as exc:
        raise SystemExit(f"error: {name} cannot start: {exc}") from None
    service.engine.run()
