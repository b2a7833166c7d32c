"""The console's pages: fleet, retries, parked, tallies, accounts and commands, the admin token.

Pages are rendered on the server from the services' answers. Changing actions are
forms posted to the console, which passes them on with the operator's admin token (kept
in a session cookie: entered once per browser session) and renders the service's
answer, refusals included.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
import uuid
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.templating import Jinja2Templates

from services.console.clients import Clients, ServiceClient, UpstreamError, path_id
from services.console.fleet import FleetMonitor
from services.console.models import fmt_ms

router = APIRouter()

TOKEN_COOKIE = "statefleet_console_token"
PAGE_LIMIT = 50
#: Pages of the API one console page reads at most while filtering in the console.
FILTER_SCAN_PAGES = 10
#: Most parked messages one "replay all" selects.
REPLAY_ALL_MAX = 10_000
REPLAY_ALL_CONCURRENCY = 8
#: Most tallies the tallies page reads to search and sort them.
TALLIES_MAX = 20_000
TALLIES_PAGE = 100
MAX_FORM_BYTES = 16_384

Action = Literal["replay", "cancel"]


# -- plumbing ----------------------------------------------------------------------------------------


def _templates(request: Request) -> Jinja2Templates:
    templates: Jinja2Templates = request.app.state.templates
    return templates


def _clients(request: Request) -> Clients:
    clients: Clients = request.app.state.clients
    return clients


def _monitor(request: Request) -> FleetMonitor:
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
    return _templates(request).TemplateResponse(request, template, {**base, **context}, status_code=status_code)


async def form_data(request: Request) -> dict[str, str]:
    """An application/x-www-form-urlencoded body (last value of each field)."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return {}
    return {k: v[-1] for k, v in parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True).items()}


def _local_path(value: str | None, default: str) -> str:
    """Only paths of this console are redirected to (never another site)."""
    if value and value.startswith("/") and not value.startswith("//") and "\\" not in value:
        return value
    return default


def result(request: Request, *, title: str, ok: bool, text: str, back: str, status_code: int = 200) -> HTMLResponse:
    return page(request, "result.html", status_code=status_code, title=title, ok=ok, text=text, back=back)


def refused(exc: UpstreamError) -> int:
    """The status the console answers with when a service refused or did not answer."""
    return exc.status if exc.status is not None and exc.status >= 400 else 502


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
    monitor = _monitor(request)
    snapshot = monitor.snapshot if monitor.snapshot.taken_at is not None else await monitor.poll()
    return page(request, "fleet.html", nav="fleet", snapshot=snapshot, history_s=monitor.history_s,
                refresh_ms=int(request.app.state.settings.console_refresh_s * 1000))


@router.get("/fleet/table", response_class=HTMLResponse)
async def fleet_table(request: Request) -> HTMLResponse:
    monitor = _monitor(request)
    return page(request, "_fleet.html", snapshot=monitor.snapshot, history_s=monitor.history_s)


@router.get("/fleet.json")
async def fleet_json(request: Request) -> JSONResponse:
    snap = _monitor(request).snapshot
    return JSONResponse({
        "taken_at": snap.taken_at,
        "services": [
            {
                "name": s.name, "state": s.state, "error": s.error, "rate": s.rate,
                "instances": [
                    {"url": i.url, "instance": i.instance_id, "state": i.state, "error": i.error, "rate": i.rate,
                     "active": i.active, "standby": i.standby, "lag": i.lag}
                    for i in s.instances
                ],
            }
            for s in snap.services
        ],
    })


# -- retries and parked: lists -----------------------------------------------------------------------


def _matches(item: dict[str, Any], error_class: str | None, attempt: int | None) -> bool:
    if error_class and item.get("error_class") != error_class:
        return False
    return not (attempt is not None and item.get("attempt") != attempt)


async def filtered_page(
    client: ServiceClient, path: str, params: dict[str, Any], *, cursor: str | None, limit: int,
    error_class: str | None, attempt: int | None, max_pages: int = FILTER_SCAN_PAGES,
) -> tuple[list[dict[str, Any]], str | None, int]:
    """Items of the API's list that pass the console's own filters (error class, attempt).

    The API filters by origin topic and due time itself; the other filters are applied
    here, reading the API's pages (through its cursor) until ``limit`` items pass or
    ``max_pages`` were read. Returns the items, the API cursor to go on from, and how
    many items were examined.
    """
    items: list[dict[str, Any]] = []
    examined = 0
    for _ in range(max_pages):
        body = await client.get(path, params={**params, "limit": limit, "cursor": cursor})
        examined += len(body["items"])
        items.extend(i for i in body["items"] if _matches(i, error_class, attempt))
        cursor = body.get("next_cursor")
        if cursor is None or len(items) >= limit or not (error_class or attempt is not None):
            break
    return items, cursor, examined


def _clean(value: str | None) -> str | None:
    value = (value or "").strip()
    return value or None


def _query(**params: Any) -> str:
    return urlencode({k: v for k, v in params.items() if v is not None and v != ""})


@router.get("/retries", response_class=HTMLResponse)
async def retries(
    request: Request,
    origin_topic: str | None = None,
    error_class: str | None = None,
    attempt: Annotated[str | None, Query()] = None,
    due_within_min: Annotated[str | None, Query()] = None,
    cursor: str | None = None,
) -> HTMLResponse:
    client = _clients(request).retry_scheduler
    origin_topic, error_class = _clean(origin_topic), _clean(error_class)
    filters = {"origin_topic": origin_topic, "error_class": error_class, "attempt": _clean(attempt),
               "due_within_min": _clean(due_within_min)}
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
            filtered_page(client, "/retries", {"origin_topic": origin_topic, "due_before": due_before},
                          cursor=_clean(cursor), limit=PAGE_LIMIT, error_class=error_class, attempt=attempt_n),
        )
    except UpstreamError as exc:
        return page(request, "retries.html", status_code=200, error=str(exc), **context)
    context.update(stats=stats, items=items, examined=examined, next_cursor=next_cursor,
                   next_query=_query(**filters, cursor=next_cursor) if next_cursor else None,
                   first_query=_query(**filters), paged=bool(_clean(cursor)))
    return page(request, "retries.html", **context)


def form_time_ms(value: str | None) -> int | None:
    """A form's UTC time (``2026-01-31T14:05``, seconds optional) as epoch ms; ``ValueError`` if it is not one."""
    text = _clean(value)
    if text is None:
        return None
    parsed = dt.datetime.fromisoformat(text.replace(" ", "T"))
    return int(parsed.replace(tzinfo=dt.UTC).timestamp() * 1000)


def _parked_range(source: dict[str, str]) -> tuple[dict[str, str | None], int | None, int | None]:
    """The "parked between" fields of a form: as typed, and as epoch ms. The end counts whole:
    all of its minute, or of its second when seconds are given."""
    typed = {k: _clean(source.get(k)) for k in ("parked_from", "parked_to")}
    start, end = form_time_ms(typed["parked_from"]), form_time_ms(typed["parked_to"])
    if end is not None and typed["parked_to"] is not None and "." not in typed["parked_to"]:
        end += 59_999 if len(typed["parked_to"]) <= len("2026-01-31T14:05") else 999
    return typed, start, end


@router.get("/parked", response_class=HTMLResponse)
async def parked(
    request: Request,
    origin_topic: str | None = None,
    error_class: str | None = None,
    attempt: str | None = None,
    cursor: str | None = None,
) -> HTMLResponse:
    client = _clients(request).retry_scheduler
    origin_topic, error_class = _clean(origin_topic), _clean(error_class)
    filters = {"origin_topic": origin_topic, "error_class": error_class, "attempt": _clean(attempt)}
    context: dict[str, Any] = {"nav": "parked", "filters": filters, "items": [], "next_cursor": None, "stats": None,
                               "groups": None, "span": {}}
    try:
        attempt_n = int(filters["attempt"]) if filters["attempt"] else None
        span, parked_from, parked_to = _parked_range(dict(request.query_params))
    except ValueError:
        return page(request, "parked.html", status_code=400,
                    error="Attempt must be a number, and times look like 2026-01-31T14:05 (UTC).", **context)
    context["span"] = span
    try:
        stats, groups, (items, next_cursor, examined) = await asyncio.gather(
            client.get("/retries/stats"),
            client.get("/parked-groups", params={"parked_from": parked_from, "parked_to": parked_to}),
            filtered_page(client, "/parked", {"origin_topic": origin_topic}, cursor=_clean(cursor), limit=PAGE_LIMIT,
                          error_class=error_class, attempt=attempt_n),
        )
    except UpstreamError as exc:
        return page(request, "parked.html", error=str(exc), **context)
    context.update(stats=stats, groups=groups, items=items, examined=examined, next_cursor=next_cursor,
                   next_query=_query(**filters, cursor=next_cursor) if next_cursor else None,
                   first_query=_query(**filters), filter_query=_query(**filters), paged=bool(_clean(cursor)))
    return page(request, "parked.html", **context)


# -- one message -------------------------------------------------------------------------------------


@router.get("/retries/message", response_class=HTMLResponse)
async def retry_message(request: Request, id: Annotated[str, Query(min_length=1, max_length=1024)]) -> Response:
    client = _clients(request).retry_scheduler
    try:
        item = await client.get(f"/scheduled/{path_id(id)}")  # /retries/{id} cannot ask for the id "stats"
    except UpstreamError as exc:
        if exc.status == 404:
            try:
                if await client.get_or_none(f"/parked/{path_id(id)}") is not None:
                    return RedirectResponse(f"/parked/message?{_query(id=id)}", status_code=303)
            except UpstreamError:
                pass
        return page(request, "message.html", status_code=refused(exc), nav="retries", kind="retry", item=None,
                    dlq_id=id, error=str(exc))
    return page(request, "message.html", nav="retries", kind="retry", item=item, dlq_id=id)


@router.get("/parked/message", response_class=HTMLResponse)
async def parked_message(request: Request, id: Annotated[str, Query(min_length=1, max_length=1024)]) -> HTMLResponse:
    client = _clients(request).retry_scheduler
    try:
        item = await client.get(f"/parked/{path_id(id)}")
    except UpstreamError as exc:
        return page(request, "message.html", status_code=refused(exc), nav="parked", kind="parked", item=None,
                    dlq_id=id, error=str(exc))
    return page(request, "message.html", nav="parked", kind="parked", item=item, dlq_id=id)


_ACTIONS: dict[tuple[str, str], tuple[str, str, str]] = {
    # (kind, action) -> (method, API path template, what it does)
    ("retry", "replay"): ("POST", "/retries/{id}/replay", "Redeliver the scheduled message {id} to its retry topic now."),
    ("retry", "cancel"): ("DELETE", "/retries/{id}", "Cancel the scheduled message {id}: it will not be redelivered."),
    ("parked", "replay"): ("POST", "/parked/{id}/replay",
                           "Redeliver the parked message {id} to its retry topic and unpark it."),
}


@router.get("/confirm", response_class=HTMLResponse)
async def confirm(
    request: Request,
    kind: Literal["retry", "parked"],
    action: Action,
    id: Annotated[str, Query(min_length=1, max_length=1024)],
) -> HTMLResponse:
    if (kind, action) not in _ACTIONS:
        return page(request, "result.html", status_code=400, title="Unknown action", ok=False,
                    text=f"{action} is not an action on a {kind} message", back="/retries")
    what = _ACTIONS[(kind, action)][2].format(id=id)
    return page(request, "confirm.html", nav="parked" if kind == "parked" else "retries", kind=kind, action=action,
                dlq_id=id, what=what)


@router.post("/act", response_class=HTMLResponse)
async def act(request: Request) -> HTMLResponse:
    form = await form_data(request)
    kind, action, dlq_id = form.get("kind", ""), form.get("action", ""), form.get("id", "")
    back = f"/{'parked' if kind == 'parked' else 'retries'}/message?{_query(id=dlq_id)}"
    if (kind, action) not in _ACTIONS or not dlq_id:
        return result(request, title="Unknown action", ok=False, text="the form did not name a known action", back="/retries",
                      status_code=400)
    method, template, _ = _ACTIONS[(kind, action)]
    client = _clients(request).retry_scheduler
    try:
        answer = await client.call(method, template.format(id=path_id(dlq_id)), token=token_of(request))
    except UpstreamError as exc:
        return result(request, title=f"{action.capitalize()} refused", ok=False, text=_explain(exc), back=back,
                      status_code=refused(exc))
    body = answer.body if isinstance(answer.body, dict) else {}
    status = body.get("status", "done")
    text = f"Message {dlq_id}: {status}"
    if body.get("topic"):
        text += f" to {body['topic']}"
    if body.get("attempt") is not None:
        text += f" (attempt {body['attempt']})"
    if answer.status == 202:
        text += " — accepted; the scheduler applies it shortly."
    return result(request, title=f"{action.capitalize()} done", ok=True, text=text,
                  back="/parked" if kind == "parked" else "/retries")


def _explain(exc: UpstreamError) -> str:
    hint = {
        401: " Enter the admin token (or a valid one) on the token page.",
        409: " The message changed meanwhile; reload it.",
        503: " The owning instance is recovering or rebalancing; try again shortly.",
    }.get(exc.status or 0, "")
    return str(exc) + hint


# -- replay all that a filter selects ----------------------------------------------------------------


async def _select_parked(client: ServiceClient, origin_topic: str | None, error_class: str | None, attempt: int | None,
                         ) -> tuple[list[str], bool]:
    """Ids of every parked message the filters select (at most REPLAY_ALL_MAX), and whether more were left out."""
    ids: list[str] = []
    cursor: str | None = None
    while True:
        body = await client.get("/parked", params={"origin_topic": origin_topic, "limit": 1000, "cursor": cursor})
        ids.extend(i["id"] for i in body["items"] if _matches(i, error_class, attempt))
        cursor = body.get("next_cursor")
        if cursor is None:
            return ids[:REPLAY_ALL_MAX], len(ids) > REPLAY_ALL_MAX
        if len(ids) > REPLAY_ALL_MAX:
            return ids[:REPLAY_ALL_MAX], True


def _replay_filters(source: dict[str, str]) -> tuple[dict[str, str | None], int | None]:
    filters = {k: _clean(source.get(k)) for k in ("origin_topic", "error_class", "attempt")}
    attempt = int(filters["attempt"]) if filters["attempt"] and filters["attempt"].isdigit() else None
    return filters, attempt


@router.get("/parked/replay-all", response_class=HTMLResponse)
async def replay_all_dry_run(request: Request) -> HTMLResponse:
    filters, attempt = _replay_filters(dict(request.query_params))
    client = _clients(request).retry_scheduler
    try:
        ids, more = await _select_parked(client, filters["origin_topic"], filters["error_class"], attempt)
    except UpstreamError as exc:
        return page(request, "replay_all.html", nav="parked", filters=filters, ids=None, more=False, error=str(exc),
                    back=f"/parked?{_query(**filters)}")
    return page(request, "replay_all.html", nav="parked", filters=filters, ids=ids, more=more,
                back=f"/parked?{_query(**filters)}")


@router.post("/parked/replay-all", response_class=HTMLResponse)
async def replay_all(request: Request) -> HTMLResponse:
    form = await form_data(request)
    filters, attempt = _replay_filters(form)
    back = f"/parked?{_query(**filters)}"
    client = _clients(request).retry_scheduler
    token = token_of(request)
    try:
        ids, _ = await _select_parked(client, filters["origin_topic"], filters["error_class"], attempt)
    except UpstreamError as exc:
        return result(request, title="Replay all refused", ok=False, text=_explain(exc), back=back, status_code=refused(exc))
    gate = asyncio.Semaphore(REPLAY_ALL_CONCURRENCY)
    outcomes: list[tuple[str, UpstreamError | None]] = []

    async def one(dlq_id: str) -> None:
        async with gate:
            try:
                await client.call("POST", f"/parked/{path_id(dlq_id)}/replay", token=token)
                outcomes.append((dlq_id, None))
            except UpstreamError as exc:
                outcomes.append((dlq_id, exc))

    if ids:
        # The first call alone: a refused token fails it, and then none of the others is sent.
        await one(ids[0])
        if outcomes[0][1] is None or outcomes[0][1].status not in (401, 403):
            await asyncio.gather(*(one(i) for i in ids[1:]))
    failed = [(i, e) for i, e in outcomes if e is not None]
    done = len(outcomes) - len(failed)
    counted = form.get("counted")
    return page(
        request, "replay_all_result.html", status_code=refused(failed[0][1]) if failed and not done else 200,
        nav="parked", filters=filters, selected=len(ids), counted=counted, replayed=done,
        failed=[(i, _explain(e)) for i, e in failed[:20]], failed_count=len(failed), back=back,
    )


# -- a whole group (origin topic, error class), optionally parked within a time range ----------------


def _group_form(source: dict[str, str]) -> tuple[dict[str, Any], int | None, int | None]:
    """The group a form names, its time range as typed, and the range in epoch ms."""
    span, start, end = _parked_range(source)
    action = source.get("action", "")
    group = {"action": action if action in ("replay", "cancel") else None,
             "origin_topic": _clean(source.get("origin_topic")), "error_class": _clean(source.get("error_class")),
             **span}
    return group, start, end


def _group_params(group: dict[str, Any], start: int | None, end: int | None, **more: Any) -> dict[str, Any]:
    return {"origin_topic": group["origin_topic"], "error_class": group["error_class"],
            "parked_from": start, "parked_to": end, **more}


@router.get("/parked/group", response_class=HTMLResponse)
async def group_dry_run(request: Request) -> HTMLResponse:
    """How many parked messages a group action covers (the API's dry run), and a form to confirm it."""
    context: dict[str, Any] = {"nav": "parked", "group": {}, "dry": None, "back": "/parked"}
    try:
        group, start, end = _group_form(dict(request.query_params))
    except ValueError:
        return page(request, "group_action.html", status_code=400,
                    error="Times look like 2026-01-31T14:05 (UTC).", **context)
    context["group"] = group
    if group["action"] is None or not group["origin_topic"] or not group["error_class"]:
        return page(request, "group_action.html", status_code=400,
                    error="Name the action (replay or cancel), the origin topic and the error class.", **context)
    client = _clients(request).retry_scheduler
    token = token_of(request)
    try:
        if token is None:  # read-only: the count from the group listing; confirming needs the token anyway
            body = await client.get("/parked-groups", params=_group_params(group, start, end))
            dry: dict[str, Any] = {"matched": body["total"], "complete": body["complete"]}
        else:
            answer = await client.call("POST", f"/parked-groups/{group['action']}", token=token,
                                       params=_group_params(group, start, end, dry_run="true"))
            dry = answer.body
    except UpstreamError as exc:
        return page(request, "group_action.html", status_code=refused(exc), error=_explain(exc), **context)
    context.update(dry=dry, range_text=_range_text(start, end))
    return page(request, "group_action.html", **context)


def _range_text(start: int | None, end: int | None) -> str:
    if start is None and end is None:
        return "whenever parked"
    if end is None:
        return f"parked since {fmt_ms(start)}"
    if start is None:
        return f"parked until {fmt_ms(end)}"
    return f"parked between {fmt_ms(start)} and {fmt_ms(end)}"


@router.post("/parked/group", response_class=HTMLResponse)
async def group_act(request: Request) -> HTMLResponse:
    form = await form_data(request)
    try:
        group, start, end = _group_form(form)
    except ValueError:
        return result(request, title="Group action refused", ok=False, text="the times in the form are not valid",
                      back="/parked", status_code=400)
    if group["action"] is None or not group["origin_topic"] or not group["error_class"]:
        return result(request, title="Unknown action", ok=False, text="the form did not name a group and an action",
                      back="/parked", status_code=400)
    action = group["action"]
    client = _clients(request).retry_scheduler
    try:
        answer = await client.call("POST", f"/parked-groups/{action}", token=token_of(request),
                                   params=_group_params(group, start, end))
    except UpstreamError as exc:
        return result(request, title=f"Group {action} refused", ok=False, text=_explain(exc), back="/parked",
                      status_code=refused(exc))
    body = answer.body if isinstance(answer.body, dict) else {}
    did = "replayed" if action == "replay" else "cancelled"
    text = (f"{group['origin_topic']} / {group['error_class']} ({_range_text(start, end)}): "
            f"{body.get('done', 0)} {did}")
    if form.get("counted"):
        text += f" (the dry run counted {form['counted']})"
    if body.get("failed"):
        text += f"; {body['failed']} could not be redelivered and stay parked"
    if body.get("continuing"):
        text += "; more than one round's worth: the rest follows in the background"
    if body.get("accepted_partitions"):
        text += f"; partitions {body['accepted_partitions']} did not answer in time (applied shortly)"
    return result(request, title=f"Group {action} done", ok=not body.get("failed"), text=text + ".", back="/parked")


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
    client = _clients(request).tallies
    context: dict[str, Any] = {"nav": "tallies", "q": q or "", "sort": sort, "order": order, "rows": [], "total": 0,
                               "truncated": False, "page_no": page_no, "pages": 1}
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
    rows.sort(key=lambda r: (r[sort] is None, r[sort] if r[sort] is not None else 0, r["program_id"]),
              reverse=order == "desc")
    pages = max(1, -(-len(rows) // TALLIES_PAGE))
    start = (min(page_no, pages) - 1) * TALLIES_PAGE
    context.update(rows=rows[start : start + TALLIES_PAGE], total=len(rows), truncated=cursor is not None,
                   pages=pages, page_no=min(page_no, pages))
    return page(request, "tallies.html", **context)


@router.get("/programs/{program_id:path}", response_class=HTMLResponse)
async def program(
    request: Request,
    program_id: str,
    status: Literal["active", "inactive", "deleted", ""] = "",
    cursor: str | None = None,
) -> HTMLResponse:
    clients = _clients(request)
    context: dict[str, Any] = {"nav": "tallies", "program_id": program_id, "status": status, "tally": None,
                               "accounts": [], "next_query": None, "tally_error": None}
    try:
        context["tally"] = await clients.tallies.get_or_none(f"/tallies/{path_id(program_id)}")
    except UpstreamError as exc:
        context["tally_error"] = str(exc)
    try:
        body = await clients.validator.get(f"/programs/{path_id(program_id)}/accounts",
                                           params={"limit": PAGE_LIMIT, "cursor": _clean(cursor), "status": status or None})
    except UpstreamError as exc:
        return page(request, "program.html", error=str(exc), **context)
    context["accounts"] = body["items"]
    if body.get("next_cursor"):
        context["next_query"] = _query(status=status, cursor=body["next_cursor"])
    return page(request, "program.html", **context)


# -- accounts and commands ---------------------------------------------------------------------------


@router.get("/accounts", response_class=HTMLResponse)
async def accounts(request: Request, account_id: str | None = None) -> HTMLResponse:
    return await _lookup(request, account_id=_clean(account_id), command_id=None)


@router.get("/commands", response_class=HTMLResponse)
async def commands(request: Request, command_id: str | None = None) -> HTMLResponse:
    return await _lookup(request, account_id=None, command_id=_clean(command_id))


async def _lookup(request: Request, *, account_id: str | None, command_id: str | None) -> HTMLResponse:
    client = _clients(request).validator
    context: dict[str, Any] = {"nav": "lookup", "account_id": account_id or "", "command_id": command_id or "",
                               "account": None, "command": None, "not_found": None}
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


# -- the admin token ---------------------------------------------------------------------------------

#: An id no message has: replaying it checks the token (401 if wrong) and changes nothing (404).
def _probe_id() -> str:
    return f"console-token-check-{uuid.uuid4().hex}"


@router.get("/token", response_class=HTMLResponse)
async def token_form(request: Request, next: str | None = None) -> HTMLResponse:
    return page(request, "token.html", nav="token", next=_local_path(next, "/fleet"))


@router.post("/token", response_class=HTMLResponse)
async def token_set(request: Request) -> Response:
    form = await form_data(request)
    token = form.get("token", "").strip()
    target = _local_path(form.get("next"), "/fleet")
    if not token:
        return page(request, "token.html", status_code=400, nav="token", next=target, error="Enter the token.")
    note = None
    try:
        await _clients(request).retry_scheduler.call("POST", f"/retries/{_probe_id()}/replay", token=token)
    except UpstreamError as exc:
        if exc.status in (401, 403):
            return page(request, "token.html", status_code=exc.status, nav="token", next=target,
                        error=f"The retry scheduler refused this token: {exc}")
        if exc.status != 404:
            note = f"The token could not be checked ({exc}); it is kept for this session."
    response = page(request, "token.html", nav="token", next=target, saved=True, token_set=True,
                    message=note or "Token accepted: changing actions are enabled for this browser session.")
    response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict", path="/",
                        secure=request.url.scheme == "https")
    return response


@router.post("/token/forget", response_class=HTMLResponse)
async def token_forget(request: Request) -> Response:
    form = await form_data(request)
    response = RedirectResponse(_local_path(form.get("next"), "/fleet"), status_code=303)
    response.delete_cookie(TOKEN_COOKIE, path="/")
    return response
