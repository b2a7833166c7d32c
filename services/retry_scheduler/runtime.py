"""Wire the retry scheduler together: Faust app, HTTP API, topics; and run it."""

from __future__ import annotations

from fastapi import FastAPI

from services.retry_scheduler import DEFAULT_PORT, SERVICE
from services.retry_scheduler.api import router
from services.retry_scheduler.app import RetrySchedulerService
from shared.faust_app import run_worker, serve_api
from shared.http.api import create_api
from shared.http.context import ServiceContext
from shared.settings import Settings, get_settings
from shared.topic_admin import ensure_topics


def build(settings: Settings) -> tuple[RetrySchedulerService, FastAPI]:
    service = RetrySchedulerService(settings)
    ctx = ServiceContext(
        service=SERVICE, settings=settings, app=service.app, topics=service.topics,
        url=settings.url_for(DEFAULT_PORT), extras={"service": service},
    )
    api = create_api(
        ctx, title="statefleet retry scheduler",
        description=(
            "Dead letters waiting for redelivery and messages parked after their last attempt, from any instance. "
            "Changing calls need `Authorization: Bearer <token>`."
        ),
    )
    api.include_router(router)
    serve_api(service.app, api, settings, DEFAULT_PORT)
    return service, api


def main() -> None:
    settings = get_settings()
    service, _ = build(settings)
    ensure_topics(settings, service.topic_specs())
    run_worker(service.app, SERVICE, settings)
