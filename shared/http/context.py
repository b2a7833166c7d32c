"""What a request handler needs from the running service, in one object."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from shared.engine import Instance, partition_for
from shared.settings import Settings
from shared.topics import TopicNames

#: The object a service's worker runs (its topology and state), as its routes see it.
ServiceT = TypeVar("ServiceT")


@dataclass
class ServiceContext:
    service: str
    settings: Settings
    instance: Instance
    topics: TopicNames
    url: str
    extras: dict[str, Any] = field(default_factory=dict)
    #: How peer calls (forwarded reads) reach the peers: httpx's own network transport unless a
    #: test passes one of its own (``httpx.MockTransport``, an ASGI app's transport).
    transport: httpx.AsyncBaseTransport | None = None
    _http: httpx.AsyncClient | None = None
    #: Peer URL -> until when (monotonic) reads skip it, after it failed to answer.
    _suspects: dict[str, float] = field(default_factory=dict)

    @property
    def http(self) -> httpx.AsyncClient:
        """Client for peer calls, created on first use so it binds to the worker's loop."""
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self.settings.forward_timeout_s, transport=self.transport)
        return self._http

    def suspect(self, peer: str) -> None:
        """Send reads straight to copies instead of ``peer`` for a while: it did not answer."""
        self._suspects[peer] = time.monotonic() + self.settings.peer_suspect_s

    def suspected(self, peer: str) -> bool:
        until = self._suspects.get(peer)
        if until is None:
            return False
        if time.monotonic() >= until:
            del self._suspects[peer]
            return False
        return True

    def ready(self) -> bool:
        return self.instance.ready()

    def partition_for(self, key: str | bytes) -> int:
        return partition_for(key, self.settings.topic_partitions)


def service_of(ctx: ServiceContext, kind: type[ServiceT]) -> ServiceT:
    """The service object the worker behind ``ctx`` runs, typed: every route reaches its
    service this way (or through the ``Annotated`` dependency its routes module makes of it)."""
    service = ctx.extras.get("service")
    if not isinstance(service, kind):
        raise TypeError(f"this API serves {type(service).__name__}, not {kind.__name__}")
    return service
