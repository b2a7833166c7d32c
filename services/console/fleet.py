"""The fleet as the console sees it: every instance of every service, polled in the background.

Each poll asks one instance of a service (its first base URL that answers) for
``GET /instance``, whose ``peers`` name every instance the last assignment knew; then
each of them for ``/instance`` and ``/metrics``. Records/s come from the difference of
``statefleet_messages_processed_total`` between two polls, kept for the last minutes
for the chart. An instance seen before that stops answering stays listed as down for a
while, with the error, so a crash shows instead of a row quietly disappearing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from services.console.clients import Clients, ServiceClient, UpstreamError
from services.console.models import FleetSnapshot, InstanceView, ServiceView

log = logging.getLogger(__name__)

PROCESSED = "statefleet_messages_processed_total"

#: An instance no peer names any more is dropped after this long without an answer.
FORGET_AFTER_S = 120.0


def processed_total(metrics_text: str) -> float:
    """Sum of statefleet_messages_processed_total over its labels."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics_text)
        for sample in family.samples
        if sample.name == PROCESSED
    )


@dataclass
class _Track:
    """What the monitor remembers of one instance between polls."""

    service: str
    last_total: float | None = None
    last_at: float | None = None
    seen_at: float | None = None
    history: deque[tuple[float, float | None]] = field(default_factory=deque)


class FleetMonitor:
    def __init__(self, clients: Clients, interval_s: float, history_s: float, timeout_s: float) -> None:
        self.clients = clients
        self.interval_s = interval_s
        self.history_s = history_s
        self.timeout_s = timeout_s
        self._tracks: dict[str, _Track] = {}
        self._service_history: dict[str, deque[tuple[float, float | None]]] = {}
        self._snapshot = FleetSnapshot(None, [ServiceView(c.name, c.label, c.base_urls) for c in clients.deployed()])
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    @property
    def snapshot(self) -> FleetSnapshot:
        return self._snapshot

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="fleet-monitor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                await self.poll()
            except Exception:  # one bad poll must not end the monitor
                log.exception("fleet poll failed")
            await asyncio.sleep(self.interval_s)

    async def poll(self) -> FleetSnapshot:
        async with self._lock:
            now = time.time()
            services = await asyncio.gather(*(self._poll_service(c, now) for c in self.clients.deployed()))
            self._snapshot = FleetSnapshot(now, list(services))
            return self._snapshot

    async def _poll_service(self, client: ServiceClient, now: float) -> ServiceView:
        view = ServiceView(client.name, client.label, client.base_urls)
        first: dict[str, Any] | None = None
        try:
            first = await client.get("/instance", wait_s=self.timeout_s)
        except UpstreamError as exc:
            view.error = str(exc)
        urls: set[str] = set()
        if first is not None:
            urls.update(str(u).rstrip("/") for u in first.get("peers", []))
            urls.add(str(first["url"]).rstrip("/"))
        urls.update(
            url
            for url, t in self._tracks.items()
            if t.service == client.name and t.seen_at is not None and now - t.seen_at < FORGET_AFTER_S
        )
        known = {str(first["url"]).rstrip("/"): first} if first is not None else {}
        view.instances = list(await asyncio.gather(*(self._poll_instance(client, u, known.get(u), now) for u in sorted(urls))))
        up = [i for i in view.instances if i.state != "down"]
        if first is None:
            view.state = "down"
        elif len(up) == len(view.instances) and all(i.state == "ready" for i in up) and not view.unowned_inputs:
            view.state = "up"
        else:
            view.state = "degraded"
        rates = [i.rate for i in view.instances if i.rate is not None]
        history = self._service_history.setdefault(client.name, deque())
        history.append((now, sum(rates) if rates else None))
        self._trim(history, now)
        view.history = list(history)
        return view

    async def _poll_instance(self, client: ServiceClient, url: str, info: dict[str, Any] | None, now: float) -> InstanceView:
        track = self._tracks.setdefault(url, _Track(client.name))
        try:
            if info is None:
                info = await client.get("/instance", base_url=url, wait_s=self.timeout_s)
            metrics = await client.get("/metrics", base_url=url, wait_s=self.timeout_s)
        except UpstreamError as exc:
            track.history.append((now, None))
            self._trim(track.history, now)
            track.last_total = track.last_at = None
            return InstanceView(url, "down", error=str(exc), history=list(track.history), seen_at=track.seen_at)
        total = processed_total(str(metrics))
        rate = None
        if track.last_total is not None and track.last_at is not None and now > track.last_at and total >= track.last_total:
            rate = (total - track.last_total) / (now - track.last_at)
        track.last_total, track.last_at, track.seen_at = total, now, now
        track.history.append((now, rate))
        self._trim(track.history, now)
        assert info is not None
        return InstanceView(
            url=url,
            state="ready" if info.get("ready") else "recovering",
            instance_id=info.get("instance"),
            active=info.get("active", {}),
            standby=info.get("standby", {}),
            warmup=info.get("warmup", {}),
            copies=info.get("copies", {}),
            lag={topic: v.get("total") for topic, v in info.get("lag", {}).items()},
            unowned_inputs=[str(t) for t in info.get("unowned_inputs", [])],
            rate=rate,
            processed_total=total,
            history=list(track.history),
            seen_at=now,
        )

    def _trim(self, history: deque[tuple[float, float | None]], now: float) -> None:
        while history and history[0][0] < now - self.history_s:
            history.popleft()
