"""GET /healthz, /readyz and /metrics, mounted on every service."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from shared.http.deps import Ctx
from shared.metrics import READY, REGISTRY, UNOWNED_INPUT_TOPICS

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: Literal["ok"]
    service: str
    instance: str


class Readiness(BaseModel):
    status: Literal["ready", "recovering"]
    service: str
    instance: str


@router.get("/healthz", summary="The process is alive", response_model=Health)
async def healthz(ctx: Ctx) -> dict[str, str]:
    return {"status": "ok", "service": ctx.service, "instance": ctx.settings.instance_id}


@router.get(
    "/readyz",
    summary="200 once table state is restored, 503 before",
    response_model=Readiness,
    responses={
        503: {
            "model": Readiness,
            "description": "Restoring state",
            "headers": {"Retry-After": {"description": "Seconds to wait before asking again", "schema": {"type": "string"}}},
        }
    },
)
async def readyz(ctx: Ctx) -> Response:
    ready = ctx.ready()
    READY.labels(ctx.service).set(1 if ready else 0)
    body = {"status": "ready" if ready else "recovering", "service": ctx.service, "instance": ctx.settings.instance_id}
    return JSONResponse(body, status_code=200 if ready else 503, headers={} if ready else {"Retry-After": "1"})


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={
        200: {"description": "Prometheus text exposition format", "content": {"text/plain": {"schema": {"type": "string"}}}}
    },
)
async def metrics(ctx: Ctx) -> Response:
    READY.labels(ctx.service).set(1 if ctx.ready() else 0)
    UNOWNED_INPUT_TOPICS.labels(ctx.service).set(len(ctx.instance.unowned_inputs()))
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
