"""Commands from the HTTP API, as a request and an answer through the inbox.

The API sends a command (replay or cancel a scheduled message, replay a parked one, or a
group action on the parked) to the inbox partition that owns it, and waits; the inbox
handler applies it in order with the partition's other work and answers once the
changes are committed. No answer in time means the partition moved meanwhile: the
command is still applied, by the new owner.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import orjson

from services.retry_scheduler.entries import Replayed, decode_entry
from services.retry_scheduler.handlers.inbox_state import InboxState, now_ms
from services.retry_scheduler.handlers.kinds import (
    KIND_CANCEL,
    KIND_DELETE_PARKED,
    KIND_GROUP,
    KIND_LANE,
    KIND_REPLAY,
    KIND_UNPARK,
)
from services.retry_scheduler.handlers.ordered import OrderedLanes, lane_command_body, lane_of_command
from services.retry_scheduler.handlers.parking import DELETED, Parking, actor_of
from services.retry_scheduler.metrics import CANCELLED
from services.retry_scheduler.scans import GroupFilter
from services.retry_scheduler.state import DONE_CANCELLED, DONE_REDELIVERED, Done, id_key
from shared.engine import Engine, InputBatch, partition_for

log = logging.getLogger(__name__)

# History action (Replayed.action) of a scheduled message replayed before its due time.
REPLAYED_NOW = "replay"


class HttpCommands:
    def __init__(self, engine: Engine, state: InboxState, parking: Parking, ordered: OrderedLanes, inbox_topic: str) -> None:
        self.engine = engine
        self.state = state
        self.parking = parking
        self.ordered = ordered
        self.inbox_topic = inbox_topic
        self.waiters: dict[str, asyncio.Future[dict[str, Any]]] = {}

    # -- the API's side ------------------------------------------------------------------------------

    async def request(
        self, kind: bytes, dlq_id: str, partition: int, timeout_s: float, actor: str | None = None
    ) -> dict[str, Any]:
        """Send a command on ``dlq_id`` to its partition and wait for the handler's answer;
        ``actor`` (who asked) goes into the message's history.

        ``{"status": "accepted"}`` when the answer does not come within ``timeout_s`` (the
        partition moved meanwhile): the command is still applied, by the new owner.
        """
        body: dict[str, Any] = {"id": dlq_id} if actor is None else {"id": dlq_id, "actor": actor}
        return await self._ask(dlq_id.encode(), kind, body, partition, timeout_s, {"id": dlq_id, "status": "accepted"})

    async def request_group(
        self, partition: int, action: str, flt: GroupFilter, timeout_s: float, actor: str | None = None
    ) -> dict[str, Any]:
        """Send a group command to ``partition`` and wait for the handler's answer (as :meth:`request`)."""
        return await self._ask(
            None,
            KIND_GROUP,
            {"action": action, "filter": flt.to_json(), "actor": actor},
            partition,
            timeout_s,
            {"partition": partition, "status": "accepted"},
        )

    async def request_lane(self, lane: bytes, action: str, timeout_s: float, actor: str | None = None) -> dict[str, Any]:
        """Send a command on an ordered lane to the lane's partition and wait for the handler's answer (as :meth:`request`)."""
        partition = partition_for(lane, self.engine.settings.topic_partitions)
        body = lane_command_body(lane, action, actor)
        return await self._ask(lane, KIND_LANE, body, partition, timeout_s, {"status": "accepted"})

    async def _ask(
        self, key: bytes | None, kind: bytes, body: dict[str, Any], partition: int, timeout_s: float, accepted: dict[str, Any]
    ) -> dict[str, Any]:
        req = uuid.uuid4().hex
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiters[req] = waiter
        try:
            await self.engine.send(self.inbox_topic, key, kind + orjson.dumps({**body, "req": req}), partition=partition)
            return await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        except TimeoutError:
            return accepted
        finally:
            self.waiters.pop(req, None)

    # -- the inbox handler's side --------------------------------------------------------------------

    async def command(self, batch: InputBatch, kind: bytes, body: dict[str, Any]) -> None:
        dlq_id = body["id"]
        if not isinstance(dlq_id, str):
            raise ValueError("command without a string id")
        actor = actor_of(body)
        if kind == KIND_UNPARK:
            result = await self.parking.unpark(batch, dlq_id, actor)
        elif kind == KIND_DELETE_PARKED:
            result = await self._delete_parked(batch, dlq_id, actor)
        else:
            result = await self._replay_or_cancel(batch, kind, dlq_id, actor)
        self._answer(batch, body, result)

    async def group_command(self, batch: InputBatch, body: dict[str, Any]) -> None:
        self._answer(batch, body, await self.parking.group_action(batch, body))

    async def lane_command(self, batch: InputBatch, body: dict[str, Any]) -> None:
        self._answer(batch, body, await self.ordered.command(batch, lane_of_command(body), str(body["action"]), actor_of(body)))

    async def _delete_parked(self, batch: InputBatch, dlq_id: str, actor: str | None) -> dict[str, Any]:
        raw = batch.read(self.state.parked, id_key(dlq_id))
        if raw is None:
            return {"id": dlq_id, "status": "not_found"}
        entry = decode_entry(raw)
        lane = self.ordered.lane_headed_by(batch, entry)
        if lane is not None:
            # A parked head of a key: the records held behind it go on, as skip-head does.
            await self.ordered.command(batch, lane, "skip-head")
            log.info("deleted parked dlq.id=%s attempt=%s (the head of its key) by %s", dlq_id, entry.attempt, actor)
            return {"id": dlq_id, "status": "deleted", "attempt": entry.attempt}
        self.parking.remove(batch, entry, DELETED, actor)
        self.state.write_expiry(batch)
        return {"id": dlq_id, "status": "deleted", "attempt": entry.attempt}

    async def _replay_or_cancel(self, batch: InputBatch, kind: bytes, dlq_id: str, actor: str | None) -> dict[str, Any]:
        state = self.state
        current = state.index_state(batch, id_key(dlq_id))
        if current is None or isinstance(current, Done) or kind not in (KIND_REPLAY, KIND_CANCEL):
            return {"id": dlq_id, "status": "not_found"}
        key, raw, entry = current
        lane = self.ordered.lane_headed_by(batch, entry) if kind == KIND_CANCEL else None
        if lane is not None:
            # A key's head cancelled: the records held behind it must not wait for an
            # acknowledgement that will never come, so the next is released, as skip-head does.
            await self.ordered.command(batch, lane, "skip-head")
            return {"id": dlq_id, "status": "cancelled", "attempt": entry.attempt}
        if kind == KIND_CANCEL:
            state.finish(batch, key, entry, done=DONE_CANCELLED)
            state.write_expiry(batch)
            CANCELLED.inc()
            state.totals["cancelled"] += 1
            log.info("cancelled dlq.id=%s attempt=%s", dlq_id, entry.attempt)
            return {"id": dlq_id, "status": "cancelled", "attempt": entry.attempt}
        [d] = await state.redeliver(batch, [(key, raw)], trigger="replay")
        if d.error is not None:
            return {"id": dlq_id, "status": "failed", "detail": d.error}
        replayed = entry.with_history(Replayed(now_ms(), REPLAYED_NOW, entry.attempt, actor))
        state.finish(batch, key, replayed, done=DONE_REDELIVERED)
        state.write_expiry(batch)
        return {"id": dlq_id, "status": "redelivered", "attempt": entry.attempt, "topic": entry.retry_topic}

    def _answer(self, batch: InputBatch, body: dict[str, Any], result: dict[str, Any]) -> None:
        """Answer the waiting HTTP request, if it waits here, once the command's changes are committed."""
        waiter = self.waiters.get(str(body.get("req", "")))

        def answer() -> None:
            if waiter is not None and not waiter.done():
                waiter.set_result(result)

        batch.after_commit(answer)
