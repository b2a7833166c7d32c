"""The operator's admin token: entered once per browser session, kept in a session cookie."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from services.console.clients import UpstreamError
from services.console.pages.common import TOKEN_COOKIE, clients_of, form_data, local_path, page

router = APIRouter()


# -- the admin token ---------------------------------------------------------------------------------


#: An id no message has: replaying it checks the token (401 if wrong) and changes nothing (404).
def _probe_id() -> str:
    return f"console-token-check-{uuid.uuid4().hex}"


@router.get("/token", response_class=HTMLResponse)
async def token_form(request: Request, next: str | None = None) -> HTMLResponse:
    return page(request, "token.html", nav="token", next=local_path(next, "/fleet"))


@router.post("/token", response_class=HTMLResponse)
async def token_set(request: Request) -> Response:
    form = await form_data(request)
    token = form.get("token", "").strip()
    target = local_path(form.get("next"), "/fleet")
    if not token:
        return page(request, "token.html", status_code=400, nav="token", next=target, error="Enter the token.")
    note = None
    try:
        await clients_of(request).retry_scheduler.call("POST", f"/retries/{_probe_id()}/replay", token=token)
    except UpstreamError as exc:
        if exc.status in (401, 403):
            return page(
                request,
                "token.html",
                status_code=exc.status,
                nav="token",
                next=target,
                error=f"The retry scheduler refused this token: {exc}",
            )
        if exc.status != 404:
            note = f"The token could not be checked ({exc}); it is kept for this session."
    response = page(
        request,
        "token.html",
        nav="token",
        next=target,
        saved=True,
        token_set=True,
        message=note or "Token accepted: changing actions are enabled for this browser session.",
    )
    response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict", path="/", secure=request.url.scheme == "https")
    return response


@router.post("/token/forget", response_class=HTMLResponse)
async def token_forget(request: Request) -> Response:
    form = await form_data(request)
    response = RedirectResponse(local_path(form.get("next"), "/fleet"), status_code=303)
    response.delete_cookie(TOKEN_COOKIE, path="/")
    return response
