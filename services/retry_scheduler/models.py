"""HTTP models of the retry scheduler, and the JSON view of a stored entry."""

from __future__ import annotations

import base64
from typing import Any

from pydantic import BaseModel, Field

from services.retry_scheduler.entries import Entry


class HistoryOut(BaseModel):
    at: int = Field(description="When the operator's action was applied (epoch ms)")
    action: str = Field(
        description="replay (a scheduled message sent at once), unpark (one parked message "
        "replayed), group replay (replayed with its group), delete (a parked message deleted) or "
        "expire (a parked message removed by the retention)"
    )
    attempt: int = Field(description="The dlq.attempt it was replayed with")
    actor: str | None = Field(
        None,
        description='Who acted: the name of the token the call carried ("admin", the admin token); '
        "null for the scheduler's own actions (retention) and for events recorded before actors were",
    )


class RetryOut(BaseModel):
    id: str = Field(description="dlq.id")
    key: str | None = Field(description="Message key as UTF-8 text; null when absent or not valid UTF-8")
    key_base64: str | None = Field(description="Message key bytes, base64; null when the message has no key")
    value_bytes: int | None = Field(description="Size of the value; null for a tombstone")
    value_base64: str | None = Field(None, description="Value bytes, base64 (single-item queries only)")
    attempt: int = Field(description="dlq.attempt: failed attempts so far")
    max_attempts: int = Field(description="Attempts the policy allows before parking")
    retry_topic: str
    origin_topic: str
    origin_partition: int
    origin_offset: int
    error_class: str
    error_message: str
    first_failed_at: int
    failed_at: int
    received_at: int = Field(description="When the scheduler read the dead letter (epoch ms)")
    due_at: int = Field(description="When it is redelivered (epoch ms)")
    headers: dict[str, str] = Field(description="Headers it is redelivered with (values as UTF-8 text)")
    history: list[HistoryOut] = Field(
        default_factory=list, description="Replays so far, oldest first; kept across its later attempts"
    )
    payload_hidden: bool = Field(
        False,
        description="In a list with STATEFLEET_PAYLOADS_REQUIRE_TOKEN: the call's token does not cover this message's "
        "origin topic with read, so its key and headers are left out (key, key_base64 null, headers empty)",
    )


class ParkedOut(RetryOut):
    parked_at: int
    parked_reason: str


class RetryPage(BaseModel):
    items: list[RetryOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null on the last page")


class ParkedPage(BaseModel):
    items: list[ParkedOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null on the last page")


class ParkedGroupOut(BaseModel):
    origin_topic: str
    error_class: str
    count: int = Field(description="Parked messages of the group (within the filters)")
    oldest_parked_at: int | None = Field(description="Epoch ms")
    newest_parked_at: int | None = Field(description="Epoch ms")
    newest_error_message: str = Field(description="The error message of the most recently parked one")


class ParkedGroupsOut(BaseModel):
    groups: list[ParkedGroupOut] = Field(description="Largest first")
    total: int = Field(description="Parked messages in all the groups")
    complete: bool = Field(
        description="False when some partition had more parked rows than one answer examines: counts are then lower bounds"
    )

    model_config = {
        "json_schema_extra": {
            "examples": [
                {
                    "groups": [
                        {
                            "origin_topic": "orders",
                            "error_class": "TimeoutError",
                            "count": 1250,
                            "oldest_parked_at": 1764000000000,
                            "newest_parked_at": 1764003600000,
                            "newest_error_message": "payment-gateway did not answer within 5s",
                        }
                    ],
                    "total": 1250,
                    "complete": True,
                }
            ]
        }
    }


class GroupActionOut(BaseModel):
    action: str = Field(description="replay or cancel")
    dry_run: bool
    origin_topic: str
    error_class: str
    parked_from: int | None
    parked_to: int | None
    matched: int = Field(
        description="Dry run: parked messages the action would cover now. Otherwise: those the "
        "first round of each partition covered"
    )
    complete: bool = Field(True, description="Dry run: false when the count is a lower bound (see GET /parked-groups)")
    done: int = Field(0, description="Replayed (sent to their retry topic and unparked) or cancelled (dropped)")
    failed: int = Field(0, description="Redeliveries that failed: those messages stay parked")
    continuing: bool = Field(False, description="More than one round's worth: the rest follows in the background")
    accepted_partitions: list[int] = Field(
        default_factory=list, description="Partitions whose answer did not come in time (the action is still applied)"
    )

    model_config = {
        "json_schema_extra": {
            "examples": [
                {
                    "action": "replay",
                    "dry_run": True,
                    "origin_topic": "orders",
                    "error_class": "TimeoutError",
                    "parked_from": None,
                    "parked_to": None,
                    "matched": 1250,
                    "complete": True,
                    "done": 0,
                    "failed": 0,
                    "continuing": False,
                    "accepted_partitions": [],
                }
            ]
        }
    }


class CommandOut(BaseModel):
    id: str
    status: str = Field(description="redelivered, cancelled, deleted, or accepted (applied asynchronously)")
    attempt: int | None = None
    topic: str | None = Field(None, description="Topic it was redelivered to")


class Lateness(BaseModel):
    count: int = Field(description="Redeliveries the figures are taken over (the most recent ones)")
    p50_ms: int | None
    p99_ms: int | None
    max_ms: int | None


class TickOut(BaseModel):
    partition: int
    at: int
    examined: int
    redelivered: int
    failed: int
    scan_ms: float
    ms: float


class StatsOut(BaseModel):
    scheduled: int = Field(description="Messages waiting for their next delivery")
    parked: int = Field(description="Messages in the parked table")
    blocked_keys: int = Field(0, description="Ordered retries: keys whose later records wait behind a head")
    held: int = Field(0, description="Ordered retries: records held behind their key's head")
    by_origin_topic: dict[str, int] = Field(description="Scheduled messages per origin topic")
    by_error_class: dict[str, int] = Field(description="Scheduled messages per error class")
    parked_by_origin_topic: dict[str, int]
    oldest_due_at: int | None = Field(description="Earliest due time of a scheduled message (epoch ms)")
    redelivered_total: int = Field(description="Redeliveries since the instances started")
    parked_total: int = Field(description="Messages parked since the instances started")
    lateness: Lateness = Field(description="Redelivered at minus due at, over the last redeliveries")
    last_ticks: list[TickOut] = Field(description="The last tick of each partition")
    busy_ticks: list[TickOut] = Field(description="The most recent ticks that redelivered something (per instance)")
    instances: int
    policy: dict[str, Any] = Field(description="The default policy and the overrides in force")


def key_text(data: bytes | None) -> str | None:
    """A key as UTF-8 text; ``None`` when there is none or it is not valid UTF-8."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def entry_json(e: Entry, *, with_value: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": e.id,
        "key": key_text(e.key),
        "key_base64": _b64(e.key),
        "value_bytes": None if e.value is None else len(e.value),
        "attempt": e.attempt,
        "max_attempts": e.max_attempts,
        "retry_topic": e.retry_topic,
        "origin_topic": e.origin_topic,
        "origin_partition": e.origin_partition,
        "origin_offset": e.origin_offset,
        "error_class": e.error_class,
        "error_message": e.error_message,
        "first_failed_at": e.first_failed_at,
        "failed_at": e.failed_at,
        "received_at": e.received_at,
        "due_at": e.due_at,
        "headers": {name: value.decode("utf-8", errors="replace") for name, value in e.headers},
        "history": [h.to_json() for h in e.history],
    }
    if with_value:
        out["value_base64"] = _b64(e.value)
    if e.parked_at is not None:
        out["parked_at"] = e.parked_at
        out["parked_reason"] = e.parked_reason or ""
    return out
