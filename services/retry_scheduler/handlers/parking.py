"""The parking lot's commands: replaying one parked message, and replaying or cancelling
the parked messages a group filter covers (an origin topic and error class).

A group action acts on at most :data:`GROUP_CHUNK` parked messages per inbox record; the
rest follow in a record it sends to the same partition, committed with this batch, so
other work of the partition is not held up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson

from services.retry_scheduler.entries import Entry, Replayed, decode_entry
from services.retry_scheduler.handlers.inbox_state import InboxState, now_ms
from services.retry_scheduler.handlers.kinds import KIND_GROUP
from services.retry_scheduler.metrics import CANCELLED, PARKED_REMOVED
from services.retry_scheduler.scans import GroupFilter, scan_parked_matching
from services.retry_scheduler.state import DONE_CANCELLED, id_key, id_of
from shared.engine import InputBatch
from shared.settings import Settings

log = logging.getLogger(__name__)

#: What a group command may do with the parked messages it covers.
GROUP_ACTIONS = ("replay", "cancel")
#: Parked rows the retention examines per partition per tick: a partition's parked messages are
#: swept a slice at a time, so a tick stays short however many are parked.
RETENTION_SCAN_BUDGET = 1000
#: Most parked messages a partition's tick removes for the retention.
RETENTION_LIMIT = 500
#: Most parked messages one group command acts on, and rows it examines, before it goes on
#: in a record of its own (so other work of the partition is not held up).
GROUP_CHUNK = 500
GROUP_SCAN_BUDGET = 20_000
# History actions (Replayed.action).
UNPARKED = "unpark"
GROUP_REPLAYED = "group replay"
DELETED = "delete"
EXPIRED = "expire"


def actor_of(body: dict[str, Any]) -> str | None:
    """Who sent a command (the name of the token its call carried), from the command's body."""
    actor = body.get("actor")
    return actor if isinstance(actor, str) else None


class Parking:
    def __init__(self, state: InboxState, inbox_topic: str) -> None:
        self.state = state
        self.inbox_topic = inbox_topic

    async def unpark(self, batch: InputBatch, dlq_id: str, actor: str | None = None) -> dict[str, Any]:
        """Redeliver one parked message; the answer to the HTTP request."""
        state = self.state
        parked_raw = batch.read(state.parked, id_key(dlq_id))
        if parked_raw is None:
            return {"id": dlq_id, "status": "not_found"}
        entry = decode_entry(parked_raw)
        [d] = await state.redeliver(batch, [(id_key(dlq_id), parked_raw)], trigger="unpark")
        if d.error is not None:
            return {"id": dlq_id, "status": "failed", "detail": d.error}
        state.unparked(batch, entry, UNPARKED, actor)
        state.write_expiry(batch)
        log.info("replayed parked dlq.id=%s attempt=%s", dlq_id, entry.attempt)
        return {"id": dlq_id, "status": "redelivered", "attempt": entry.attempt, "topic": entry.retry_topic}

    def remove(self, batch: InputBatch, entry: Entry, how: str, actor: str | None) -> None:
        """Take a parked message out of the parking lot without redelivering it (deleted over HTTP,
        or expired): a done marker drops a copy of its dead letter read later, and its history,
        with this event, is kept with the marker. The caller writes the expiry row."""
        state = self.state
        idk = id_key(entry.id)
        if state.delete(batch, state.parked, idk):
            state.count(batch, "parked", entry.counted_as, -1)
        state.mark_done(batch, idk, entry.id, DONE_CANCELLED, entry.attempt, entry.fingerprints)
        state.keep_history(batch, entry.with_history(Replayed(now_ms(), how, entry.attempt, actor)))
        PARKED_REMOVED.labels(how=how).inc()
        log.info(
            "%s parked dlq.id=%s attempt=%s from %s%s",
            "deleted" if how == DELETED else "expired",
            entry.id,
            entry.attempt,
            entry.origin_topic,
            f" by {actor}" if actor else "",
        )

    async def group_action(self, batch: InputBatch, body: dict[str, Any]) -> dict[str, Any]:
        """Replay or cancel the parked messages of this partition that a group filter covers.

        The answer (to the waiting HTTP request, if any) is this first record's outcome,
        with ``more`` set when the work goes on.
        """
        state = self.state
        action = body["action"]
        if action not in GROUP_ACTIONS:
            raise ValueError(f"unknown group action {action!r}")
        flt = GroupFilter.from_json(body["filter"])
        after = body.get("after")
        found, resume = scan_parked_matching(
            batch.view(state.parked),
            flt,
            after=id_key(after) if isinstance(after, str) else None,
            limit=GROUP_CHUNK,
            budget=GROUP_SCAN_BUDGET,
        )
        done = failed = 0
        if action == "cancel":
            for key, raw, _ in found:
                entry = decode_entry(raw)
                if state.delete(batch, state.parked, key):
                    state.count(batch, "parked", entry.counted_as, -1)
                state.mark_done(batch, key, entry.id, DONE_CANCELLED, entry.attempt)
                CANCELLED.inc()
                state.totals["cancelled"] += 1
                done += 1
        elif found:
            items = [(key, raw) for key, raw, _ in found]
            for d in await state.redeliver(batch, items, trigger="group-replay"):
                if d.error is None:
                    state.unparked(batch, d.entry, GROUP_REPLAYED, actor_of(body))
                    done += 1
                else:
                    failed += 1  # stays parked
        state.write_expiry(batch)
        if resume is not None:
            follow = {"action": action, "filter": flt.to_json(), "after": id_of(resume), "actor": actor_of(body)}
            batch.send(self.inbox_topic, None, KIND_GROUP + orjson.dumps(follow), partition=batch.partition)
        log.info(
            "group %s of parked %s in partition %s: %d done, %d failed%s",
            action,
            flt,
            batch.partition,
            done,
            failed,
            ", more to follow" if resume is not None else "",
        )
        return {
            "partition": batch.partition,
            "status": "done",
            "matched": len(found),
            "done": done,
            "failed": failed,
            "more": resume is not None,
        }


class ParkedRetention:
    """``STATEFLEET_PARKED_RETENTION_S``: each tick of a partition examines the next slice of its
    parked messages (:data:`RETENTION_SCAN_BUDGET` rows, going round the table) and removes those
    parked longer ago than the retention, as ``DELETE /parked/{id}`` does (history event
    ``expire``, no actor). A parked head of an ordered key is kept: the key's records wait behind
    it until an operator acts."""

    def __init__(self, settings: Settings, state: InboxState, parking: Parking, is_head: Callable[[InputBatch, Entry], bool]):
        self.retention_ms = int(settings.parked_retention_s * 1000)
        self.state = state
        self.parking = parking
        self.is_head = is_head
        #: Where each partition's sweep goes on (an id key; None: from the start).
        self.resume: dict[int, bytes | None] = {}
        self.expired_total = 0

    @property
    def enabled(self) -> bool:
        return self.retention_ms > 0

    def sweep(self, batch: InputBatch, now: int) -> int:
        """Remove the expired parked messages of the next slice of this partition; how many."""
        if not self.enabled:
            return 0
        partition = batch.partition
        flt = GroupFilter(parked_to=now - self.retention_ms)
        found, resume = scan_parked_matching(
            batch.view(self.state.parked),
            flt,
            after=self.resume.get(partition),
            limit=RETENTION_LIMIT,
            budget=RETENTION_SCAN_BUDGET,
        )
        self.resume[partition] = resume
        expired = 0
        for _, raw, _ in found:
            entry = decode_entry(raw)
            if self.is_head(batch, entry):
                continue
            self.parking.remove(batch, entry, EXPIRED, None)
            expired += 1
        if expired:
            self.state.write_expiry(batch)
            self.expired_total += expired
            log.info(
                "parked retention (%ss): removed %d parked messages of partition %s parked before %s",
                self.retention_ms / 1000,
                expired,
                partition,
                now - self.retention_ms,
            )
        return expired

    def forget_partitions(self) -> None:
        self.resume = {}
