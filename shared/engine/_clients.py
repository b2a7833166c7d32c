"""Keyword arguments for plain aiokafka clients (admin, producers in tools and
benchmarks) from the same settings the Faust apps use."""

from __future__ import annotations

import ssl
from typing import Any

from shared.settings import Settings


def ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context for SSL and SASL_SSL, trusting ``kafka_ssl_cafile``; else None."""
    if settings.kafka_security_protocol not in ("SSL", "SASL_SSL"):
        return None
    context = ssl.create_default_context(cafile=settings.kafka_ssl_cafile)
    if settings.kafka_ssl_certfile:
        context.load_cert_chain(settings.kafka_ssl_certfile, settings.kafka_ssl_keyfile)
    return context


def require_sasl_credentials(settings: Settings) -> tuple[str, str]:
    if not settings.kafka_sasl_username or not settings.kafka_sasl_password:
        raise ValueError(
            f"{settings.kafka_security_protocol} needs STATEFLEET_KAFKA_SASL_USERNAME and STATEFLEET_KAFKA_SASL_PASSWORD"
        )
    return settings.kafka_sasl_username, settings.kafka_sasl_password


def client_kwargs(settings: Settings) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "bootstrap_servers": settings.kafka_bootstrap_servers,
        "security_protocol": settings.kafka_security_protocol,
    }
    context = ssl_context(settings)
    if context is not None:
        kwargs["ssl_context"] = context
    if settings.kafka_security_protocol.startswith("SASL"):
        kwargs["sasl_mechanism"] = settings.kafka_sasl_mechanism
        kwargs["sasl_plain_username"], kwargs["sasl_plain_password"] = require_sasl_credentials(settings)
    return kwargs
