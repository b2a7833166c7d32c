"""Wire the validator together: Faust app, HTTP API, topics; and run it."""

from __future__ import annotations

from fastapi import FastAPI

from services.validator import DEFAULT_PORT, SERVICE
from services.validator.app import ValidatorService
from services.validator.domain import ACCOUNTS
from services.validator.routes import build_router
from shared.domain import DomainError
from shared.runtime import run, serve_http
from shared.settings import Settings, get_settings


def build(settings: Settings) -> tuple[ValidatorService, FastAPI]:
    service = ValidatorService(settings)
    api = serve_http(
        service,
        SERVICE,
        DEFAULT_PORT,
        settings,
        build_router(service.domain),
        title="statefleet validator",
        description=(
            "The write side of the account domain: submit commands, read their outcomes, "
            "accounts, and each program's accounts, from any instance."
            if service.domain is ACCOUNTS
            else f"The write side of the {service.domain.name} domain: submit commands, read their outcomes "
            "and aggregates, from any instance."
        ),
    )
    return service, api


def main() -> None:
    settings = get_settings()
    try:
        service, _ = build(settings)
    except DomainError as exc:
        # Stops the worker at start, naming the module and what is missing (no traceback to read through).
        raise SystemExit(f"statefleet validator: STATEFLEET_VALIDATOR_DOMAIN: {exc}") from exc
    run(service, SERVICE, settings)
