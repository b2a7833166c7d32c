"""Wire the retry scheduler together: Faust app, HTTP API, topics; and run it."""

from __future__ import annotations

from fastapi import FastAPI

from services.retry_scheduler import DEFAULT_PORT, SERVICE
from services.retry_scheduler.app import RetrySchedulerService
from services.retry_scheduler.domain import PolicyError
from services.retry_scheduler.routes import router
from services.retry_scheduler.tokens import TokenError
from shared.runtime import run, serve_http
from shared.settings import Settings, get_settings


def build(settings: Settings) -> tuple[RetrySchedulerService, FastAPI]:
    """The service and its HTTP API. Exits, saying which rule or token and what is wrong, when the retry policy
    or the tokens file is not valid."""
    try:
        service = RetrySchedulerService(settings)
    except PolicyError as exc:
        raise SystemExit(f"error: {SERVICE} cannot start: the retry policy is not valid: {exc}") from None
    except TokenError as exc:
        raise SystemExit(f"error: {SERVICE} cannot start: the tokens are not valid: {exc}") from None
    api = serve_http(
        service,
        SERVICE,
        DEFAULT_PORT,
        settings,
        router,
        title="statefleet retry scheduler",
        description=(
            "Dead letters waiting for redelivery and messages parked after their last attempt, from any instance. "
            "Changing calls need `Authorization: Bearer <token>` of a token with the act scope on the origin topic; "
            "with STATEFLEET_PAYLOADS_REQUIRE_TOKEN, reads of payloads need one with the read scope."
        ),
    )
    return service, api


def main() -> None:
    settings = get_settings()
    service, _ = build(settings)
    run(service, SERVICE, settings)
