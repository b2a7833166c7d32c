"""The console's FastAPI app: pages, static assets, the upstream clients and the fleet monitor."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import uvicorn
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from services.console import DEFAULT_PORT, models
from services.console.api import router
from services.console.clients import Clients, ServiceClient, split_urls
from services.console.fleet import FleetMonitor
from shared.settings import Settings, get_settings

HERE = Path(__file__).resolve().parent
log = logging.getLogger(__name__)


def templates() -> Jinja2Templates:
    t = Jinja2Templates(directory=str(HERE / "templates"))
    env = t.env
    env.globals.update(
        fmt_ms=models.fmt_ms,
        fmt_relative=models.fmt_relative,
        fmt_rate=models.fmt_rate,
        ranges=models.ranges,
        union_partitions=models.union_partitions,
        chart=models.chart,
        render_bytes=models.render_bytes,
        render_key=models.render_key,
        is_internal=models.is_internal,
        is_changelog=models.is_changelog,
        copies_behind=models.copies_behind,
    )
    env.trim_blocks = True
    env.lstrip_blocks = True
    return t


def create_app(settings: Settings, transport: httpx.AsyncBaseTransport | None = None, *, monitor: bool = True) -> FastAPI:
    """The console; ``transport`` replaces the network (tests), ``monitor`` runs the background fleet poll."""

    @asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        http = httpx.AsyncClient(timeout=settings.console_upstream_timeout_s, transport=transport)
        clients = Clients(
            validator=ServiceClient("validator", "validator", split_urls(settings.console_validator_url), http),
            tallies=ServiceClient("tallies", "tallies", split_urls(settings.console_tallies_url), http),
            retry_scheduler=ServiceClient(
                "retry-scheduler", "retry scheduler", split_urls(settings.console_retry_scheduler_url), http
            ),
        )
        fleet = FleetMonitor(
            clients,
            settings.console_sample_interval_s,
            settings.console_history_s,
            min(settings.console_upstream_timeout_s, max(1.0, settings.console_sample_interval_s)),
        )
        api.state.clients = clients
        api.state.monitor = fleet
        if monitor:
            fleet.start()
        try:
            yield
        finally:
            await fleet.stop()
            await http.aclose()

    api = FastAPI(title="statefleet console", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    api.state.settings = settings
    api.state.templates = templates()
    api.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
    api.include_router(router)
    return api


def main() -> None:
    settings = get_settings()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s console %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream call is noise
    port = settings.port_for(DEFAULT_PORT)
    log.info(
        "console on http://%s:%d; validator %s, tallies %s, retry scheduler %s",
        settings.http_host,
        port,
        settings.console_validator_url,
        settings.console_tallies_url,
        settings.console_retry_scheduler_url,
    )
    uvicorn.run(
        create_app(settings),
        host=settings.http_host,
        port=port,
        log_level=settings.log_level.lower(),
        access_log=False,
        timeout_keep_alive=settings.http_keep_alive_s,
    )
