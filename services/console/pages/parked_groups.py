"""Acting on many parked messages at once: replaying all that a filter selects, and
replaying or cancelling a whole group (origin topic, error class), each with a dry run first."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from services.console.clients import ServiceClient, UpstreamError, path_id
from services.console.models import fmt_ms
from services.console.pages.common import clean, clients_of, form_data, page, query_string, refused, result, token_of
from services.console.pages.messages import explain_refusal, matches_filter, parked_range

router = APIRouter()

#: Most parked messages one "replay all" selects.
REPLAY_ALL_MAX = 10_000
REPLAY_ALL_CONCURRENCY = 8


# -- replay all that a filter selects ----------------------------------------------------------------


async def _select_parked(
    client: ServiceClient, origin_topic: str | None, error_class: str | None, attempt: int | None
) -> tuple[list[str], bool]:
    """Ids of every parked message the filters select (at most REPLAY_ALL_MAX), and whether more were left out."""
    ids: list[str] = []
    cursor: str | None = None
    while True:
        body = await client.get("/parked", params={"origin_topic": origin_topic, "limit": 1000, "cursor": cursor})
        ids.extend(i["id"] for i in body["items"] if matches_filter(i, error_class, attempt))
        cursor = body.get("next_cursor")
        if cursor is None:
            return ids[:REPLAY_ALL_MAX], len(ids) > REPLAY_ALL_MAX
        if len(ids) > REPLAY_ALL_MAX:
            return ids[:REPLAY_ALL_MAX], True


def _replay_filters(source: dict[str, str]) -> tuple[dict[str, str | None], int | None]:
    filters = {k: clean(source.get(k)) for k in ("origin_topic", "error_class", "attempt")}
    attempt = int(filters["attempt"]) if filters["attempt"] and filters["attempt"].isdigit() else None
    return filters, attempt


@router.get("/parked/replay-all", response_class=HTMLResponse)
async def replay_all_dry_run(request: Request) -> HTMLResponse:
    filters, attempt = _replay_filters(dict(request.query_params))
    client = clients_of(request).retry_scheduler
    try:
        ids, more = await _select_parked(client, filters["origin_topic"], filters["error_class"], attempt)
    except UpstreamError as exc:
        return page(
            request,
            "replay_all.html",
            nav="parked",
            filters=filters,
            ids=None,
            more=False,
            error=str(exc),
            back=f"/parked?{query_string(**filters)}",
        )
    return page(
        request, "replay_all.html", nav="parked", filters=filters, ids=ids, more=more, back=f"/parked?{query_string(**filters)}"
    )


@router.post("/parked/replay-all", response_class=HTMLResponse)
async def replay_all(request: Request) -> HTMLResponse:
    form = await form_data(request)
    filters, attempt = _replay_filters(form)
    back = f"/parked?{query_string(**filters)}"
    client = clients_of(request).retry_scheduler
    token = token_of(request)
    try:
        ids, _ = await _select_parked(client, filters["origin_topic"], filters["error_class"], attempt)
    except UpstreamError as exc:
        return result(
            request, title="Replay all refused", ok=False, text=explain_refusal(exc), back=back, status_code=refused(exc)
        )
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
        request,
        "replay_all_result.html",
        status_code=refused(failed[0][1]) if failed and not done else 200,
        nav="parked",
        filters=filters,
        selected=len(ids),
        counted=counted,
        replayed=done,
        failed=[(i, explain_refusal(e)) for i, e in failed[:20]],
        failed_count=len(failed),
        back=back,
    )


# -- a whole group (origin topic, error class), optionally parked within a time range ----------------


def _group_form(source: dict[str, str]) -> tuple[dict[str, Any], int | None, int | None]:
    """The group a form names, its time range as typed, and the range in epoch ms."""
    span, start, end = parked_range(source)
    action = source.get("action", "")
    group = {
        "action": action if action in ("replay", "cancel") else None,
        "origin_topic": clean(source.get("origin_topic")),
        "error_class": clean(source.get("error_class")),
        **span,
    }
    return group, start, end


def _group_params(group: dict[str, Any], start: int | None, end: int | None, **more: Any) -> dict[str, Any]:
    return {
        "origin_topic": group["origin_topic"],
        "error_class": group["error_class"],
        "parked_from": start,
        "parked_to": end,
        **more,
    }


@router.get("/parked/group", response_class=HTMLResponse)
async def group_dry_run(request: Request) -> HTMLResponse:
    """How many parked messages a group action covers (the API's dry run), and a form to confirm it."""
    context: dict[str, Any] = {"nav": "parked", "group": {}, "dry": None, "back": "/parked"}
    try:
        group, start, end = _group_form(dict(request.query_params))
    except ValueError:
        return page(request, "group_action.html", status_code=400, error="Times look like 2026-01-31T14:05 (UTC).", **context)
    context["group"] = group
    if group["action"] is None or not group["origin_topic"] or not group["error_class"]:
        return page(
            request,
            "group_action.html",
            status_code=400,
            error="Name the action (replay or cancel), the origin topic and the error class.",
            **context,
        )
    client = clients_of(request).retry_scheduler
    token = token_of(request)
    try:
        if token is None:  # read-only: the count from the group listing; confirming needs the token anyway
            body = await client.get("/parked-groups", params=_group_params(group, start, end))
            dry: dict[str, Any] = {"matched": body["total"], "complete": body["complete"]}
        else:
            answer = await client.call(
                "POST", f"/parked-groups/{group['action']}", token=token, params=_group_params(group, start, end, dry_run="true")
            )
            dry = answer.body
    except UpstreamError as exc:
        return page(request, "group_action.html", status_code=refused(exc), error=explain_refusal(exc), **context)
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
        return result(
            request,
            title="Group action refused",
            ok=False,
            text="the times in the form are not valid",
            back="/parked",
            status_code=400,
        )
    if group["action"] is None or not group["origin_topic"] or not group["error_class"]:
        return result(
            request,
            title="Unknown action",
            ok=False,
            text="the form did not name a group and an action",
            back="/parked",
            status_code=400,
        )
    action = group["action"]
    client = clients_of(request).retry_scheduler
    try:
        answer = await client.call(
            "POST", f"/parked-groups/{action}", token=token_of(request), params=_group_params(group, start, end)
        )
    except UpstreamError as exc:
        return result(
            request,
            title=f"Group {action} refused",
            ok=False,
            text=explain_refusal(exc),
            back="/parked",
            status_code=refused(exc),
        )
    body = answer.body if isinstance(answer.body, dict) else {}
    did = "replayed" if action == "replay" else "cancelled"
    text = f"{group['origin_topic']} / {group['error_class']} ({_range_text(start, end)}): {body.get('done', 0)} {did}"
    if form.get("counted"):
        text += f" (the dry run counted {form['counted']})"
    if body.get("failed"):
        text += f"; {body['failed']} could not be redelivered and stay parked"
    if body.get("continuing"):
        text += "; more than one round's worth: the rest follows in the background"
    if body.get("accepted_partitions"):
        text += f"; partitions {body['accepted_partitions']} did not answer in time (applied shortly)"
    return result(request, title=f"Group {action} done", ok=not body.get("failed"), text=text + ".", back="/parked")
