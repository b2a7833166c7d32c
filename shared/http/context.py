"""What a request handler needs from the running service, in one object."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from shared.engine import App, partition_for, recovery_done
from shared.settings import Settings
from shared.topics import TopicNames


@dataclass
class ServiceContext:
    service: str
    settings: Settings
    app: App
    topics: TopicNames
    url: str
    extras: dict[str, Any] = field(default_factory=dict)
    _http: httpx.AsyncClient | None = None

    @property
    def http(self) -> httpx.AsyncClient:
        """Client for peer calls, created on first use so it binds to the worker's loop."""
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self.settings.forward_timeout_s)
        return self._http

    def ready(self) -> bool:
        return recovery_done(self.app)

    def partition_for(self, key: str | bytes) -> int:
        return partition_for(key, self.settings.topic_partitions)
