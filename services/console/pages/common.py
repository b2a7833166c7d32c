"""What every page of the console shares: the templates, the clients of the services and
the fleet monitor, the operator's token, forms, and how a result or a refusal is shown."""

from __future__ import annotations

import time
from typing import Any, Literal
from urllib.parse import parse_qs, urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse
from starlette.templating import Jinja2Templates

from services.console.clients import Clients, UpstreamError
from services.console.fleet import FleetMonitor

TOKEN_COOKIE = "statefleet_console_token"
PAGE_LIMIT = 50
MAX_FORM_BYTES = 16_384

Action = Literal["replay", "cancel"]


# -- plumbing ----------------------------------------------------------------------------------------


def templates_of(request: Request) -> Jinja2Templates:
    templates: Jinja2Templates = request.app.state.templates
    return templates


def clients_of(request: Request) -> Clients:
    clients: Clients = request.app.state.clients
    return clients


def monitor_of(request: Request) -> FleetMonitor:
    monitor: FleetMonitor = request.app.state.monitor
    return monitor


def token_of(request: Request) -> str | None:
    return request.cookies.get(TOKEN_COOKIE) or None


def page(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    context.setdefault("error", None)
    context.setdefault("message", None)
    base = {
        "request": request,
        "token_set": token_of(request) is not None,
        "now_ms": time.time() * 1000,
        "here": request.url.path + (f"?{request.url.query}" if request.url.query else ""),
    }
    return templates_of(request).TemplateResponse(request, template, {**base, **context}, status_code=status_code)


async def form_data(request: Request) -> dict[str, str]:
    """An application/x-www-form-urlencoded body (last value of each field)."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return {}
    return {k: v[-1] for k, v in parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True).items()}


def local_path(value: str | None, default: str) -> str:
    """Only paths of this console are redirected to (never another site)."""
    if value and value.startswith("/") and not value.startswith("//") and "\\" not in value:
        return value
    return default


def result(request: Request, *, title: str, ok: bool, text: str, back: str, status_code: int = 200) -> HTMLResponse:
    return page(request, "result.html", status_code=status_code, title=title, ok=ok, text=text, back=back)


def refused(exc: UpstreamError) -> int:
    """The status the console answers with when a service refused or did not answer."""
    return exc.status if exc.status is not None and exc.status >= 400 else 502


def clean(value: str | None) -> str | None:
    value = (value or "").strip()
    return value or None


def query_string(**params: Any) -> str:
    return urlencode({k: v for k, v in params.items() if v is not None and v != ""})
