"""Wire the validator together: Faust app, HTTP API, topics; and run it."""

from __future__ import annotations

from fastapi import FastAPI

from services.validator import DEFAULT_PORT, SERVICE
from services.validator.api import router
from services.validator.app import ValidatorService
from shared.runtime import run, serve_http
from shared.settings import Settings, get_settings


def build(settings: Settings) -> tuple[ValidatorService, FastAPI]:
    service = ValidatorService(settings)
    api = serve_http(
        service,
        SERVICE,
        DEFAULT_PORT,
        settings,
        router,
        title="statefleet validator",
        description=(
            "The write side of the account domain: submit commands, read their outcomes, "
            "accounts, and each program's accounts, from any instance."
        ),
    )
    return service, api


def main() -> None:
    settings = get_settings()
    service, _ = build(settings)
    run(service, SERVICE, settings)
