"""Scheduled and parked messages: their lists (filtered in the console where the API does
not filter), one message, and the replay / cancel / unpark actions on it."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from services.console.clients import ServiceClient, UpstreamError, path_id
from services.console.pages.common import (
    PAGE_LIMIT,
    Action,
    clean,
    clients_of,
    form_data,
    page,
    query_string,
    refused,
    result,
    token_of,
)

router = APIRouter()

#: Pages of the API one console page reads at most while filtering in the console.
FILTER_SCAN_PAGES = 10


# -- retries and parked: lists -----------------------------------------------------------------------


def matches_filter(item: dict[str, Any], error_class: str | None, attempt: int | None) -> bool:
    if error_class and item.get("error_class") != error_class:
        return False
    return not (attempt is not None and item.get("attempt") != attempt)


async def filtered_page(
    client: ServiceClient,
    path: str,
    params: dict[str, Any],
    *,
    cursor: str | None,
    limit: int,
    error_class: str | None,
    attempt: int | None,
    max_pages: int = FILTER_SCAN_PAGES,
    token: str | None = None,
) -> tuple[list[dict[str, Any]], str | None, int]:
    """Items of the API's list that pass the console's own filters (error class, attempt).

    The API filters by origin topic and due time itself; the other filters are applied
    here, reading the API's pages (through its cursor) until ``limit`` items pass or
    ``max_pages`` were read. Returns the items, the API cursor to go on from, and how
    many items were examined. ``token``, the operator's, shows the keys and headers it covers
    where the scheduler puts payloads behind a token.
    """
    items: list[dict[str, Any]] = []
    examined = 0
    for _ in range(max_pages):
        body = await client.get(path, params={**params, "limit": limit, "cursor": cursor}, token=token)
        examined += len(body["items"])
        items.extend(i for i in body["items"] if matches_filter(i, error_class, attempt))
        cursor = body.get("next_cursor")
        if cursor is None or len(items) >= limit or not (error_class or attempt is not None):
            break
    return items, cursor, examined


@router.get("/retries", response_class=HTMLResponse)
async def retries(
    request: Request,
    origin_topic: str | None = None,
    error_class: str | None = None,
    attempt: Annotated[str | None, Query()] = None,
    due_within_min: Annotated[str | None, Query()] = None,
    cursor: str | None = None,
) -> HTMLResponse:
    client = clients_of(request).retry_scheduler
    origin_topic, error_class = clean(origin_topic), clean(error_class)
    filters = {
        "origin_topic": origin_topic,
        "error_class": error_class,
        "attempt": clean(attempt),
        "due_within_min": clean(due_within_min),
    }
    context: dict[str, Any] = {"nav": "retries", "filters": filters, "items": [], "next_cursor": None, "stats": None}
    try:
        attempt_n = int(filters["attempt"]) if filters["attempt"] else None
        due_min = float(filters["due_within_min"]) if filters["due_within_min"] else None
    except ValueError:
        return page(request, "retries.html", status_code=400, error="Attempt and due-within must be numbers.", **context)
    due_before = int(time.time() * 1000 + due_min * 60_000) if due_min is not None else None
    try:
        stats, (items, next_cursor, examined) = await asyncio.gather(
            client.get("/retries/stats"),
            filtered_page(
                client,
                "/retries",
                {"origin_topic": origin_topic, "due_before": due_before},
                cursor=clean(cursor),
                limit=PAGE_LIMIT,
                error_class=error_class,
                attempt=attempt_n,
                token=token_of(request),
            ),
        )
    except UpstreamError as exc:
        return page(request, "retries.html", status_code=200, error=str(exc), **context)
    context.update(
        stats=stats,
        items=items,
        examined=examined,
        next_cursor=next_cursor,
        next_query=query_string(**filters, cursor=next_cursor) if next_cursor else None,
        first_query=query_string(**filters),
        paged=bool(clean(cursor)),
    )
    return page(request, "retries.html", **context)


def form_time_ms(value: str | None) -> int | None:
    """A form's UTC time (``2026-01-31T14:05``, seconds optional) as epoch ms; ``ValueError`` if it is not one."""
    text = clean(value)
    if text is None:
        return None
    parsed = dt.datetime.fromisoformat(text.replace(" ", "T"))
    return int(parsed.replace(tzinfo=dt.UTC).timestamp() * 1000)


def parked_range(source: dict[str, str]) -> tuple[dict[str, str | None], int | None, int | None]:
    """The "parked between" fields of a form: as typed, and as epoch ms. The end counts its
    whole second. (The fields take seconds, ``step="1"``, and a browser leaves ``:00`` out:
    ``14:05`` is 14:05:00, not the minute.)"""
    typed = {k: clean(source.get(k)) for k in ("parked_from", "parked_to")}
    start, end = form_time_ms(typed["parked_from"]), form_time_ms(typed["parked_to"])
    if end is not None and typed["parked_to"] is not None and "." not in typed["parked_to"]:
        end += 999
    return typed, start, end


@router.get("/parked", response_class=HTMLResponse)
async def parked(
    request: Request,
    origin_topic: str | None = None,
    error_class: str | None = None,
    attempt: str | None = None,
    cursor: str | None = None,
) -> HTMLResponse:
    client = clients_of(request).retry_scheduler
    origin_topic, error_class = clean(origin_topic), clean(error_class)
    filters = {"origin_topic": origin_topic, "error_class": error_class, "attempt": clean(attempt)}
    context: dict[str, Any] = {
        "nav": "parked",
        "filters": filters,
        "items": [],
        "next_cursor": None,
        "stats": None,
        "groups": None,
        "span": {},
    }
    try:
        attempt_n = int(filters["attempt"]) if filters["attempt"] else None
        span, parked_from, parked_to = parked_range(dict(request.query_params))
    except ValueError:
        return page(
            request,
            "parked.html",
            status_code=400,
            error="Attempt must be a number, and times look like 2026-01-31T14:05 (UTC).",
            **context,
        )
    context["span"] = span
    try:
        stats, groups, (items, next_cursor, examined) = await asyncio.gather(
            client.get("/retries/stats"),
            client.get("/parked-groups", params={"parked_from": parked_from, "parked_to": parked_to}),
            filtered_page(
                client,
                "/parked",
                {"origin_topic": origin_topic},
                cursor=clean(cursor),
                limit=PAGE_LIMIT,
                error_class=error_class,
                attempt=attempt_n,
                token=token_of(request),
            ),
        )
    except UpstreamError as exc:
        return page(request, "parked.html", error=str(exc), **context)
    context.update(
        stats=stats,
        groups=groups,
        items=items,
        examined=examined,
        next_cursor=next_cursor,
        next_query=query_string(**filters, cursor=next_cursor) if next_cursor else None,
        first_query=query_string(**filters),
        filter_query=query_string(**filters),
        paged=bool(clean(cursor)),
    )
    return page(request, "parked.html", **context)


# -- one message -------------------------------------------------------------------------------------


@router.get("/retries/message", response_class=HTMLResponse)
async def retry_message(request: Request, id: Annotated[str, Query(min_length=1, max_length=1024)]) -> Response:
    client = clients_of(request).retry_scheduler
    try:
        # /retries/{id} cannot ask for the id "stats"; the token: payloads may need one (the scheduler's setting)
        item = await client.get(f"/scheduled/{path_id(id)}", token=token_of(request))
    except UpstreamError as exc:
        if exc.status == 404:
            try:
                if await client.get_or_none(f"/parked/{path_id(id)}", token=token_of(request)) is not None:
                    return RedirectResponse(f"/parked/message?{query_string(id=id)}", status_code=303)
            except UpstreamError:
                pass
        return page(
            request, "message.html", status_code=refused(exc), nav="retries", kind="retry", item=None, dlq_id=id, error=str(exc)
        )
    return page(request, "message.html", nav="retries", kind="retry", item=item, dlq_id=id)


@router.get("/parked/message", response_class=HTMLResponse)
async def parked_message(request: Request, id: Annotated[str, Query(min_length=1, max_length=1024)]) -> HTMLResponse:
    client = clients_of(request).retry_scheduler
    try:
        item = await client.get(f"/parked/{path_id(id)}", token=token_of(request))
    except UpstreamError as exc:
        return page(
            request, "message.html", status_code=refused(exc), nav="parked", kind="parked", item=None, dlq_id=id, error=str(exc)
        )
    return page(request, "message.html", nav="parked", kind="parked", item=item, dlq_id=id, heads=await headed_key(client, item))


async def headed_key(client: ServiceClient, item: dict[str, Any]) -> str | None:
    """The console page of the blocked key a parked message is the head of (ordered retries), or
    None. Only the retry scheduler knows which topics are ordered: a key it does not hold
    blocked (any key of a topic that is not ordered) answers 404. The link is an aid, so a
    refusal leaves it out rather than failing the message's page."""
    if item.get("key") is None:
        return None  # no key, or not UTF-8 text: /ordered-keys names keys as text
    params = {"origin_topic": item["origin_topic"], "key": item["key"]}
    try:
        lane = await client.get_or_none("/ordered-keys", params=params)
    except UpstreamError:
        return None
    if lane is None or lane.get("head") != item.get("id"):
        return None
    return f"/blocked-keys/key?{query_string(**params)}"


_ACTIONS: dict[tuple[str, str], tuple[str, str, str]] = {
    # (kind, action) -> (method, API path template, what it does)
    ("retry", "replay"): ("POST", "/retries/{id}/replay", "Redeliver the scheduled message {id} to its retry topic now."),
    ("retry", "cancel"): ("DELETE", "/retries/{id}", "Cancel the scheduled message {id}: it will not be redelivered."),
    ("parked", "replay"): ("POST", "/parked/{id}/replay", "Redeliver the parked message {id} to its retry topic and unpark it."),
}


@router.get("/confirm", response_class=HTMLResponse)
async def confirm(
    request: Request, kind: Literal["retry", "parked"], action: Action, id: Annotated[str, Query(min_length=1, max_length=1024)]
) -> HTMLResponse:
    if (kind, action) not in _ACTIONS:
        return page(
            request,
            "result.html",
            status_code=400,
            title="Unknown action",
            ok=False,
            text=f"{action} is not an action on a {kind} message",
            back="/retries",
        )
    what = _ACTIONS[(kind, action)][2].format(id=id)
    return page(
        request, "confirm.html", nav="parked" if kind == "parked" else "retries", kind=kind, action=action, dlq_id=id, what=what
    )


@router.post("/act", response_class=HTMLResponse)
async def act(request: Request) -> HTMLResponse:
    form = await form_data(request)
    kind, action, dlq_id = form.get("kind", ""), form.get("action", ""), form.get("id", "")
    back = f"/{'parked' if kind == 'parked' else 'retries'}/message?{query_string(id=dlq_id)}"
    if (kind, action) not in _ACTIONS or not dlq_id:
        return result(
            request,
            title="Unknown action",
            ok=False,
            text="the form did not name a known action",
            back="/retries",
            status_code=400,
        )
    method, template, _ = _ACTIONS[(kind, action)]
    client = clients_of(request).retry_scheduler
    try:
        answer = await client.call(method, template.format(id=path_id(dlq_id)), token=token_of(request))
    except UpstreamError as exc:
        return result(
            request,
            title=f"{action.capitalize()} refused",
            ok=False,
            text=explain_refusal(exc),
            back=back,
            status_code=refused(exc),
        )
    body = answer.body if isinstance(answer.body, dict) else {}
    status = body.get("status", "done")
    text = f"Message {dlq_id}: {status}"
    if body.get("topic"):
        text += f" to {body['topic']}"
    if body.get("attempt") is not None:
        text += f" (attempt {body['attempt']})"
    if answer.status == 202:
        text += " — accepted; the scheduler applies it shortly."
    return result(
        request, title=f"{action.capitalize()} done", ok=True, text=text, back="/parked" if kind == "parked" else "/retries"
    )


def explain_refusal(exc: UpstreamError) -> str:
    hint = {
        401: " Enter the admin token (or a valid one) on the token page.",
        403: " The token entered does not cover this message's origin topic with that scope; enter one that does.",
        409: " The message changed meanwhile; reload it.",
        503: " The owning instance is recovering or rebalancing; try again shortly.",
    }.get(exc.status or 0, "")
    return str(exc) + hint
