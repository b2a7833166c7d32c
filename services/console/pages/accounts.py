"""Tallies per program, one program, and looking up an account or a command."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from services.console.clients import UpstreamError, path_id
from services.console.pages.common import PAGE_LIMIT, clean, clients_of, page, query_string

router = APIRouter()

#: Most tallies the tallies page reads to search and sort them.
TALLIES_MAX = 20_000
TALLIES_PAGE = 100


# -- tallies -----------------------------------------------------------------------------------------

SortKey = Literal["program_id", "numberActive", "numberInactive", "lastLogin"]


@router.get("/tallies", response_class=HTMLResponse)
async def tallies(
    request: Request,
    q: str | None = None,
    sort: SortKey = "program_id",
    order: Literal["asc", "desc"] = "asc",
    page_no: Annotated[int, Query(alias="page", ge=1)] = 1,
) -> HTMLResponse:
    client = clients_of(request).tallies
    context: dict[str, Any] = {
        "nav": "tallies",
        "q": q or "",
        "sort": sort,
        "order": order,
        "rows": [],
        "total": 0,
        "truncated": False,
        "page_no": page_no,
        "pages": 1,
    }
    rows: list[dict[str, Any]] = []
    cursor: str | None = None
    try:
        while len(rows) < TALLIES_MAX:
            body = await client.get("/tallies", params={"limit": 1000, "cursor": cursor})
            rows.extend(body["items"])
            cursor = body.get("next_cursor")
            if cursor is None:
                break
    except UpstreamError as exc:
        return page(request, "tallies.html", error=str(exc), **context)
    needle = (q or "").strip().lower()
    if needle:
        rows = [r for r in rows if needle in str(r["program_id"]).lower()]
    rows.sort(key=lambda r: (r[sort] is None, r[sort] if r[sort] is not None else 0, r["program_id"]), reverse=order == "desc")
    pages = max(1, -(-len(rows) // TALLIES_PAGE))
    start = (min(page_no, pages) - 1) * TALLIES_PAGE
    context.update(
        rows=rows[start : start + TALLIES_PAGE],
        total=len(rows),
        truncated=cursor is not None,
        pages=pages,
        page_no=min(page_no, pages),
    )
    return page(request, "tallies.html", **context)


@router.get("/programs/{program_id:path}", response_class=HTMLResponse)
async def program(
    request: Request, program_id: str, status: Literal["active", "inactive", "deleted", ""] = "", cursor: str | None = None
) -> HTMLResponse:
    clients = clients_of(request)
    context: dict[str, Any] = {
        "nav": "tallies",
        "program_id": program_id,
        "status": status,
        "tally": None,
        "accounts": [],
        "next_query": None,
        "tally_error": None,
    }
    try:
        context["tally"] = await clients.tallies.get_or_none(f"/tallies/{path_id(program_id)}")
    except UpstreamError as exc:
        context["tally_error"] = str(exc)
    try:
        body = await clients.validator.get(
            f"/programs/{path_id(program_id)}/accounts",
            params={"limit": PAGE_LIMIT, "cursor": clean(cursor), "status": status or None},
        )
    except UpstreamError as exc:
        return page(request, "program.html", error=str(exc), **context)
    context["accounts"] = body["items"]
    if body.get("next_cursor"):
        context["next_query"] = query_string(status=status, cursor=body["next_cursor"])
    return page(request, "program.html", **context)


# -- accounts and commands ---------------------------------------------------------------------------


@router.get("/accounts", response_class=HTMLResponse)
async def accounts(request: Request, account_id: str | None = None) -> HTMLResponse:
    return await _lookup(request, account_id=clean(account_id), command_id=None)


@router.get("/commands", response_class=HTMLResponse)
async def commands(request: Request, command_id: str | None = None) -> HTMLResponse:
    return await _lookup(request, account_id=None, command_id=clean(command_id))


async def _lookup(request: Request, *, account_id: str | None, command_id: str | None) -> HTMLResponse:
    client = clients_of(request).validator
    context: dict[str, Any] = {
        "nav": "lookup",
        "account_id": account_id or "",
        "command_id": command_id or "",
        "account": None,
        "command": None,
        "not_found": None,
    }
    try:
        if account_id:
            context["account"] = await client.get_or_none(f"/accounts/{path_id(account_id)}")
            if context["account"] is None:
                context["not_found"] = f"No account {account_id!r}: it never existed."
        if command_id:
            context["command"] = await client.get_or_none(f"/commands/{path_id(command_id)}")
            if context["command"] is None:
                context["not_found"] = f"No command {command_id!r} was submitted or answered."
    except UpstreamError as exc:
        return page(request, "lookup.html", error=str(exc), **context)
    return page(request, "lookup.html", **context)
