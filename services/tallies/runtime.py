"""Wire the tallies service together: Faust app, HTTP API, topics; and run it."""

from __future__ import annotations

from fastapi import FastAPI

from services.tallies import DEFAULT_PORT, SERVICE
from services.tallies.api import router
from services.tallies.app import TalliesService
from shared.runtime import run, serve_http
from shared.settings import Settings, get_settings


def build(settings: Settings) -> tuple[TalliesService, FastAPI]:
    service = TalliesService(settings)
    api = serve_http(
        service,
        SERVICE,
        DEFAULT_PORT,
        settings,
        router,
        title="statefleet tallies",
        description="Running tallies per program (numberActive, numberInactive, lastLogin), from any instance.",
    )
    return service, api


def main() -> None:
    settings = get_settings()
    service, _ = build(settings)
    run(service, SERVICE, settings)
