"""Keyword arguments for plain aiokafka clients (admin, producers in tools and
benchmarks) from the same settings the Faust apps use."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from aiokafka.errors import KafkaConnectionError

from shared.settings import Settings

log = logging.getLogger(__name__)


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


def exactly_once(settings: Settings) -> bool:
    return settings.processing_guarantee == "exactly_once"


#: What the engine's consumers read: only committed records, in either guarantee, so that
#: records of a transaction that was aborted (or is still open) never reach a table, a handler
#: or a restore. Under at_least_once nothing is written in transactions and read_committed
#: reads what read_uncommitted would; but topics written while the deployment ran
#: exactly_once keep their markers and aborted records, and after a switch back (docs/architecture.md,
#: "Switching the guarantee") neither may those records be applied nor the marker at a
#: changelog's end be waited for as if it were a record.
ISOLATION_LEVEL = "read_committed"


#: Waits between attempts to reach a broker that does not answer: the first, and the longest.
BROKER_RETRY_FIRST_S = 0.5
BROKER_RETRY_MAX_S = 5.0


class _Startable(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


C = TypeVar("C", bound=_Startable)


async def started_when_reachable(make: Callable[[], C], what: str, settings: Settings | None = None) -> C:
    """A client made by ``make`` and started, once the brokers answer.

    A worker's clients start while it runs (its producer after recovery, a read-back consumer),
    and a broker restarting at that moment must not take the worker down with it: the batch
    that needs the client waits, uncommitted, and goes on once the broker is back. Each failed
    attempt is logged, with the addresses tried.

    With ``settings`` (the client's), a broker that answers but refuses them (credentials,
    certificate) raises :class:`~shared.engine._access.BrokerAccessDenied` instead: waiting
    would not change that."""
    from shared.engine._access import refusal

    delay = BROKER_RETRY_FIRST_S
    while True:
        client = make()
        try:
            await client.start()
            return client
        except KafkaConnectionError as exc:
            with contextlib.suppress(Exception):
                await client.stop()
            if settings is not None and (refused := await refusal(settings, client_kwargs(settings))) is not None:
                raise refused from exc
            log.warning("%s: no broker answers yet (%s); trying again in %.1fs", what, exc, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, BROKER_RETRY_MAX_S)
