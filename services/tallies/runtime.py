"""Wire the tallies service together: Faust app, HTTP API, topics; and run it."""

from __future__ import annotations

from fastapi import FastAPI

from services.tallies import DEFAULT_PORT
from services.tallies.app import TalliesService
from services.tallies.routes import build_router
from shared.projection import ProjectionError
from shared.runtime import run, serve_http
from shared.settings import Settings, get_settings


def build(settings: Settings) -> tuple[TalliesService, FastAPI]:
    service = TalliesService(settings)
    api = serve_http(
        service,
        service.name,
        DEFAULT_PORT,
        settings,
        build_router(service.projection),
        title="statefleet tallies",
        description=service.projection.description or f"Tallies of the {service.projection.name} projection, from any instance.",
    )
    return service, api


def main() -> None:
    settings = get_settings()
    try:
        service, _ = build(settings)
    except ProjectionError as exc:
        # Stops the worker at start, naming the module and what is missing (no traceback to read through).
        raise SystemExit(f"statefleet tallies: STATEFLEET_TALLIES_PROJECTION: {exc}") from None
    run(service, service.name, settings)
