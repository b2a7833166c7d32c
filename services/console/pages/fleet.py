"""Health, and the fleet page: every instance of every service, refreshed in place."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

from services.console.pages.common import monitor_of, page

router = APIRouter()


# -- health ------------------------------------------------------------------------------------------


@router.get("/healthz", include_in_schema=False)
async def healthz() -> dict[str, str]:
    return {"status": "ok", "service": "console"}


@router.get("/readyz", include_in_schema=False)
async def readyz() -> dict[str, str]:
    # Nothing to restore: a service that is down shows on the pages, it does not make the console unready.
    return {"status": "ready", "service": "console"}


@router.get("/", include_in_schema=False)
async def home() -> RedirectResponse:
    return RedirectResponse("/fleet", status_code=303)


# -- fleet -------------------------------------------------------------------------------------------


@router.get("/fleet", response_class=HTMLResponse)
async def fleet(request: Request) -> HTMLResponse:
    monitor = monitor_of(request)
    snapshot = monitor.snapshot if monitor.snapshot.taken_at is not None else await monitor.poll()
    return page(
        request,
        "fleet.html",
        nav="fleet",
        snapshot=snapshot,
        history_s=monitor.history_s,
        refresh_ms=int(request.app.state.settings.console_refresh_s * 1000),
    )


@router.get("/fleet/table", response_class=HTMLResponse)
async def fleet_table(request: Request) -> HTMLResponse:
    monitor = monitor_of(request)
    return page(request, "_fleet.html", snapshot=monitor.snapshot, history_s=monitor.history_s)


@router.get("/fleet.json")
async def fleet_json(request: Request) -> JSONResponse:
    snap = monitor_of(request).snapshot
    return JSONResponse(
        {
            "taken_at": snap.taken_at,
            "services": [
                {
                    "name": s.name,
                    "state": s.state,
                    "error": s.error,
                    "rate": s.rate,
                    "unowned_inputs": s.unowned_inputs,
                    "instances": [
                        {
                            "url": i.url,
                            "instance": i.instance_id,
                            "state": i.state,
                            "error": i.error,
                            "rate": i.rate,
                            "active": i.active,
                            "standby": i.standby,
                            "lag": i.lag,
                        }
                        for i in s.instances
                    ],
                }
                for s in snap.services
            ],
        }
    )
