"""Ordered retries' blocked keys: their list, one key (its head, the head's status, what it
holds), and the operator's three actions on it (replay a parked head, skip the head, park the
whole key), each confirmed first."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from services.console.clients import ServiceClient, UpstreamError, path_id
from services.console.pages.common import PAGE_LIMIT, clean, clients_of, form_data, page, query_string, refused, result, token_of
from services.console.pages.messages import explain_refusal

router = APIRouter()

#: Held ids a key's page shows (the API gives the first 100).
HELD_SHOWN = 20

LaneAction = Literal["replay-head", "skip-head", "park-key"]
OriginTopic = Annotated[str, Query(min_length=1, max_length=249)]
OriginalKey = Annotated[str, Query(min_length=1, max_length=4096)]

#: Each action's button label and result title.
_ACTIONS: dict[str, tuple[str, str]] = {
    "replay-head": ("Replay head", "Head replayed"),
    "skip-head": ("Skip head", "Head skipped"),
    "park-key": ("Park key", "Key parked"),
}

#: What parking a key does with its head, by the head's status (its held records are parked alike).
_PARKED_HEAD = {
    "scheduled": "its head {head} goes to the parking lot, with",
    "parked": "its head {head} stays in the parking lot, and",
    "away": "its head {head} is out (redelivered) and is let go, and",
}


def records(n: int) -> str:
    return f"{n:,} record{'' if n == 1 else 's'}"


def what_it_does(action: str, lane: dict[str, Any]) -> str:
    """What ``action`` does to the key as it is now, said on its confirmation page."""
    head, held = lane["head"], int(lane["held"])
    if action == "replay-head":
        return (
            f"Redeliver the parked head {head} to its retry topic (its attempt unchanged) and unpark it. "
            f"The {records(held)} held behind it wait until its consumer acknowledges it."
        )
    if action == "skip-head":
        after = "the next held record is redelivered at once and becomes the head" if held else "nothing is held: the key is free"
        if lane["head_status"] == "away":
            out = "it is out (redelivered), and its acknowledgement no longer counts"
            return f"Stop waiting for the head {head}: {out}. Then {after}."
        return f"Drop the head {head}: it is never redelivered. Then {after}."
    parked_head = _PARKED_HEAD.get(lane["head_status"], "its head {head} is let go, and").format(head=head)
    return (
        f"Park the whole key: {parked_head} the {records(held)} held behind it go to the parking lot. "
        "Then the key is free and its later records are processed again."
    )


def key_page(origin_topic: str, key: str) -> str:
    return f"/blocked-keys/key?{query_string(origin_topic=origin_topic, key=key)}"


#: Where a head's message is read by id (API path) and shown (console page), by the head's status;
#: an away head is not stored, so it has neither.
_HEAD_PAGES = {"parked": ("/parked/{id}", "/parked/message"), "scheduled": ("/scheduled/{id}", "/retries/message")}


async def head_page(client: ServiceClient, head: str, status: str) -> str | None:
    """The console page of a head, when the scheduler has its message (it may have moved on since
    the key was read): a link to a page that would answer 404 is left out."""
    if status not in _HEAD_PAGES:
        return None
    api_path, console_path = _HEAD_PAGES[status]
    try:
        found = await client.get_or_none(api_path.format(id=path_id(head)))
    except UpstreamError:
        return None
    return f"{console_path}?{query_string(id=head)}" if found is not None else None


async def lane_of(client: ServiceClient, origin_topic: str, key: str) -> dict[str, Any] | None:
    """The blocked key's view (GET /ordered-keys), or None when it is not blocked."""
    lane: dict[str, Any] | None = await client.get_or_none("/ordered-keys", params={"origin_topic": origin_topic, "key": key})
    return lane


@router.get("/blocked-keys", response_class=HTMLResponse)
async def blocked_keys(request: Request, origin_topic: str | None = None, cursor: str | None = None) -> HTMLResponse:
    client = clients_of(request).retry_scheduler
    filters = {"origin_topic": clean(origin_topic)}
    context: dict[str, Any] = {"nav": "blocked", "filters": filters, "items": [], "stats": None}
    try:
        stats, body = await asyncio.gather(
            client.get("/retries/stats"),
            client.get("/ordered-keys/blocked", params={**filters, "limit": PAGE_LIMIT, "cursor": clean(cursor)}),
        )
    except UpstreamError as exc:
        return page(request, "blocked_keys.html", error=str(exc), **context)
    next_cursor = body.get("next_cursor")
    topics = sorted({str(i["origin_topic"]) for i in body["items"]})
    context.update(
        stats=stats,
        items=body["items"],
        topics=topics,
        next_query=query_string(**filters, cursor=next_cursor) if next_cursor else None,
        first_query=query_string(**filters),
        paged=bool(clean(cursor)),
    )
    return page(request, "blocked_keys.html", **context)


@router.get("/blocked-keys/key", response_class=HTMLResponse)
async def blocked_key(request: Request, origin_topic: OriginTopic, key: OriginalKey) -> HTMLResponse:
    client = clients_of(request).retry_scheduler
    context: dict[str, Any] = {"nav": "blocked", "origin_topic": origin_topic, "key": key, "lane": None}
    try:
        lane = await lane_of(client, origin_topic, key)
    except UpstreamError as exc:
        return page(request, "blocked_key.html", status_code=refused(exc), error=explain_refusal(exc), **context)
    if lane is None:
        return page(
            request,
            "blocked_key.html",
            status_code=404,
            error=f"The key is not blocked (any more): nothing of {origin_topic} with this key waits in the retry scheduler.",
            **context,
        )
    head_href = await head_page(client, lane["head"], lane["head_status"])
    context.update(lane=lane, held_shown=lane["held_ids"][:HELD_SHOWN], head_href=head_href)
    return page(request, "blocked_key.html", **context)


@router.get("/blocked-keys/confirm", response_class=HTMLResponse)
async def confirm(request: Request, action: LaneAction, origin_topic: OriginTopic, key: OriginalKey) -> HTMLResponse:
    """What the action does to this key as it is now; nothing changes until the operator confirms."""
    client = clients_of(request).retry_scheduler
    context: dict[str, Any] = {"nav": "blocked", "action": action, "origin_topic": origin_topic, "key": key, "what": None}
    try:
        lane = await lane_of(client, origin_topic, key)
    except UpstreamError as exc:
        return page(request, "lane_confirm.html", status_code=refused(exc), error=explain_refusal(exc), **context)
    context["label"] = _ACTIONS[action][0]
    if lane is None:
        return page(request, "lane_confirm.html", status_code=404, error="The key is not blocked (any more).", **context)
    if action == "replay-head" and lane["head_status"] != "parked":
        return page(
            request,
            "lane_confirm.html",
            status_code=409,
            error=f"Only a parked head is replayed; the head {lane['head']} is {lane['head_status']}.",
            **context,
        )
    context.update(what=what_it_does(action, lane), lane=lane)
    return page(request, "lane_confirm.html", **context)


@router.post("/blocked-keys/act", response_class=HTMLResponse)
async def act(request: Request) -> HTMLResponse:
    form = await form_data(request)
    action, origin_topic, key = form.get("action", ""), form.get("origin_topic", ""), form.get("key", "")
    if action not in _ACTIONS or not origin_topic or not key:
        return result(
            request,
            title="Unknown action",
            ok=False,
            text="the form did not name a key and an action on it",
            back="/blocked-keys",
            status_code=400,
        )
    back = key_page(origin_topic, key)
    named = f"Key {key} of {origin_topic}: "
    client = clients_of(request).retry_scheduler
    try:
        answer = await client.call(
            "POST", f"/ordered-keys/{action}", params={"origin_topic": origin_topic, "key": key}, token=token_of(request)
        )
    except UpstreamError as exc:
        return result(
            request,
            title=f"{_ACTIONS[action][0]} refused",
            ok=False,
            text=named + _lane_refusal(exc),
            back=back,
            status_code=refused(exc),
        )
    body = answer.body if isinstance(answer.body, dict) else {}
    if answer.status == 202:
        text = f"{_ACTIONS[action][0]}: accepted; the scheduler applies it shortly."
    elif action == "replay-head":
        text = f"The head {body.get('head')} was redelivered; the held records wait for its acknowledgement."
    elif action == "skip-head":
        new_head = body.get("head")
        released = f"The next record, {new_head}, was redelivered and is the head now."
        text = f"The head {body.get('skipped')} was dropped. " + (released if new_head else "Nothing was held: the key is free.")
        if not new_head:
            back = "/blocked-keys"
    else:
        moved = records(int(body.get("parked") or 0))
        text = f"{moved} moved to the parking lot; the key is free."
        if body.get("continuing"):
            text = f"{moved} moved to the parking lot so far; the rest follow in rounds, then the key is free."
        back = "/blocked-keys"
    return result(request, title=_ACTIONS[action][1], ok=True, text=named + text, back=back)


def _lane_refusal(exc: UpstreamError) -> str:
    """The service's refusal, with what the operator can do about it."""
    hint = {
        401: " Enter the admin token (or a valid one) on the token page.",
        404: " The key is not blocked any more; someone freed it meanwhile.",
        409: " The key changed meanwhile (its head is not parked, or it is being parked); reload it.",
        503: " The owning instance is recovering or rebalancing, or the redelivery failed; try again shortly.",
    }.get(exc.status or 0, "")
    return str(exc) + hint
