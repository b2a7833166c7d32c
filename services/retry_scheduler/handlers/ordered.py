"""Ordered retries: while a key of an ordered topic has a dead letter scheduled or parked
(its *head*), later records of that key wait behind it, in order (see
:mod:`shared.ordered_retries` for the wire format, and docs/retry_scheduler.md).

Every dead letter of a lane (origin topic, original key) comes to the inbox partition of
the lane key, so one handler sees a lane's letters, acknowledgements and commands in order.
Per lane the ``index`` table keeps a :class:`~services.retry_scheduler.state.Lane` row (the
head, and the numbers of its held records) and the held records themselves
(:func:`~services.retry_scheduler.state.held_key`). The head is scheduled, parked or away
(redelivered, not yet acknowledged): that is read from the tables the head's id is in, never
kept twice. A held record has no backoff of its own: it is released (redelivered at once,
and made the head) only when the head before it was acknowledged or skipped.
"""

from __future__ import annotations

import logging
import struct
from base64 import b64decode, b64encode
from dataclasses import replace
from typing import Any, Literal, get_args

import orjson

from services.retry_scheduler.domain import merge_headers
from services.retry_scheduler.entries import Decided, Entry, decode_decided, decode_entry, encode_entry
from services.retry_scheduler.handlers.inbox_state import InboxState, now_ms
from services.retry_scheduler.handlers.kinds import KIND_ACK, KIND_LANE, KIND_ORDERED
from services.retry_scheduler.handlers.parking import Parking
from services.retry_scheduler.metrics import CANCELLED, DUPLICATES, ORDERED
from services.retry_scheduler.state import (
    DONE_CANCELLED,
    DONE_REDELIVERED,
    Done,
    Lane,
    decode_index,
    decode_lane,
    encode_lane,
    held_key,
    id_key,
    is_held_key,
    lane_row_key,
)
from shared.dead_letters import ATTEMPT
from shared.engine import InputBatch
from shared.ordered_retries import DEFERRED_ATTEMPT, HEAD_OFFSET, HEAD_PARTITION, HELD_BEHIND, LAST_TAKEN, header, lane_key
from shared.settings import Settings
from shared.topics import TopicNames

log = logging.getLogger(__name__)

#: What an operator may do with a lane (POST /ordered-keys/{action}).
LaneAction = Literal["replay-head", "skip-head", "park-key"]
LANE_ACTIONS: tuple[str, ...] = get_args(LaneAction)
PARKED_WITH_KEY = "its key was parked by an operator (ordered retries)"
#: Most held records one park-key record parks; the rest follow in a record of its own, so the
#: partition's other work is not held up (as a group action of the parked).
PARK_CHUNK = 500

_LANE_LENGTH = struct.Struct(">I")


# -- the rules of a deferred record -----------------------------------------------------------------


def is_deferred(headers: list[tuple[str, bytes]]) -> bool:
    """A record its consumer did not process because its key was blocked (it has not failed)."""
    return header(headers, HELD_BEHIND) is not None


def deferred_entry(entry: Entry) -> Entry:
    """A deferred record's entry: attempt 0 (carried in its header too), so that its first
    real failure, attempt 1, is newer than it and not dropped as a copy."""
    headers = merge_headers(list(entry.headers), [(ATTEMPT, str(DEFERRED_ATTEMPT).encode())])
    return replace(entry, attempt=DEFERRED_ATTEMPT, headers=tuple(headers))


def headed_by(entry: Entry, next_held: int = 0, end_held: int = 0) -> Lane:
    """A lane row whose head is ``entry``, with where it was read on its origin topic."""
    return Lane(entry.id, next_held, end_held, head_partition=entry.origin_partition, head_offset=entry.origin_offset)


def held_behind(entry: Entry, head: str) -> Entry:
    """A held record as it is stored and later redelivered: naming the head it waited behind."""
    headers = merge_headers([(k, v) for k, v in entry.headers if k != HELD_BEHIND], [(HELD_BEHIND, head.encode())])
    return replace(entry, headers=tuple(headers))


# -- inbox records ------------------------------------------------------------------------------------


def _with_lane(kind: bytes, lane: bytes, rest: bytes) -> bytes:
    return b"".join((kind, _LANE_LENGTH.pack(len(lane)), lane, rest))


def _split_lane(raw: bytes) -> tuple[bytes, bytes]:
    """(lane, rest) of an inbox record's value after its kind byte."""
    (n,) = _LANE_LENGTH.unpack_from(raw)
    at = _LANE_LENGTH.size
    if len(raw) < at + n:
        raise ValueError("truncated lane")
    return raw[at : at + n], raw[at + n :]


def ordered_letter_record(lane: bytes, deferred: bool, decided: bytes) -> bytes:
    """The inbox value of a dead letter of an ordered topic (``decided``: encode_decided's bytes)."""
    return _with_lane(KIND_ORDERED, lane, (b"\x01" if deferred else b"\x00") + decided)


def decode_ordered_letter(raw: bytes) -> tuple[bytes, bool, Decided]:
    lane, rest = _split_lane(raw)
    if not rest:
        raise ValueError("truncated ordered letter")
    return lane, rest[:1] == b"\x01", decode_decided(rest[1:])


def lane_command_body(lane: bytes, action: str, actor: str | None = None) -> dict[str, Any]:
    """The JSON body of a :data:`~services.retry_scheduler.handlers.kinds.KIND_LANE` record; ``actor``: who asked."""
    body: dict[str, Any] = {"lane": b64encode(lane).decode(), "action": action}
    if actor is not None:
        body["actor"] = actor
    return body


def lane_of_command(body: dict[str, Any]) -> bytes:
    return b64decode(body["lane"], validate=True)


def ack_record(lane: bytes, dlq_id: str) -> bytes:
    return _with_lane(KIND_ACK, lane, dlq_id.encode())


def decode_ack(raw: bytes) -> tuple[bytes, str]:
    lane, rest = _split_lane(raw)
    return lane, rest.decode()


# -- the lanes ----------------------------------------------------------------------------------------


class OrderedLanes:
    def __init__(self, settings: Settings, topics: TopicNames, state: InboxState, parking: Parking) -> None:
        self.state = state
        self.parking = parking
        self.max_held = settings.retry_ordered_max_held
        self.blocked_keys_topic = topics.retry_blocked_keys

    def lane(self, batch: InputBatch, lane: bytes) -> Lane | None:
        raw = batch.read(self.state.index, lane_row_key(lane))
        return decode_lane(raw) if raw is not None else None

    def lane_headed_by(self, batch: InputBatch, entry: Entry) -> bytes | None:
        """The lane whose head ``entry`` is, or ``None`` (not of an ordered topic, or not a head)."""
        if entry.key is None:
            return None
        lane = lane_key(entry.origin_topic, entry.key)
        current = self.lane(batch, lane)
        return lane if current is not None and current.head == entry.id else None

    def head_status(self, batch: InputBatch, head: str) -> str:
        """``scheduled``, ``parked`` or ``away`` (redelivered, its outcome not known yet)."""
        if isinstance(self.state.index_state(batch, id_key(head)), tuple):
            return "scheduled"
        if batch.read(self.state.parked, id_key(head)) is not None:
            return "parked"
        return "away"

    # -- dead letters -------------------------------------------------------------------------------

    async def ingest(self, batch: InputBatch, lane: bytes, deferred: bool, letter: Decided) -> None:
        """A dead letter of an ordered topic: the head's next attempt, a new head, or held."""
        state = self.state
        current = self.lane(batch, lane)
        raw_index = batch.read(state.index, id_key(letter.id))
        if raw_index is not None and is_held_key(raw_index):
            DUPLICATES.labels("held").inc()  # already held behind the head
            log.info("dropped a dead letter of dlq.id=%s attempt=%s: held behind its key's head", letter.id, letter.attempt)
            self._taken_in(batch, lane, current, letter.id)
            return
        if current is not None and current.head == letter.id:
            await state.store_decided(batch, letter)  # the head's next attempt (or a copy of one)
            self._taken_in(batch, lane, current, letter.id)
            return
        if raw_index is not None and self._done_at_or_after(raw_index, letter.id, letter.attempt):
            self._taken_in(batch, lane, current, letter.id)
            return
        if current is None:
            if deferred and not letter.parked:  # nothing to wait for: it is the head, redelivered at once
                self._write_lane(batch, lane, headed_by(decode_entry(letter.stored)), last_taken=letter.id)
                await self._deliver_now(batch, letter.id, letter.stored, letter.counted_as)
            elif await state.store_decided(batch, letter):
                self._write_lane(batch, lane, headed_by(decode_entry(letter.stored)), last_taken=letter.id)
            else:  # a copy of an attempt already stored
                self._taken_in(batch, lane, None, letter.id)
            return
        entry = decode_entry(letter.stored)
        if current.held >= self.max_held:
            reason = f"{current.held} records of its key already held behind {current.head} (ordered retries cap)"
            await state.park(batch, entry.parked(now_ms(), reason, entry.max_attempts))
            self._publish(batch, lane, current, last_taken=letter.id)
            ORDERED.labels("parked-over-cap").inc()
            return
        hk = held_key(lane, current.end_held)
        batch.write(state.index, hk, encode_entry(held_behind(entry, current.head)))
        batch.write(state.index, id_key(letter.id), hk)
        self._write_lane(batch, lane, replace(current, end_held=current.end_held + 1), last_taken=letter.id)
        ORDERED.labels("held").inc()

    @staticmethod
    def _done_at_or_after(raw_index: bytes, dlq_id: str, attempt: int) -> bool:
        """A copy of an attempt already redelivered, cancelled or replayed, of a letter no longer
        its key's head (acknowledged or skipped): dropped, never made head again."""
        done = decode_index(raw_index)
        if isinstance(done, Done) and attempt <= done.attempt:
            DUPLICATES.labels(done.what).inc()
            log.info(
                "dropped a dead letter of dlq.id=%s attempt=%s: attempt %s was %s and it heads its key no more",
                dlq_id,
                attempt,
                done.attempt,
                done.what,
            )
            return True
        return False

    # -- acknowledgements and release ---------------------------------------------------------------

    async def ack(self, batch: InputBatch, lane: bytes, dlq_id: str) -> None:
        """The consumer processed ``dlq_id``: if it is the lane's head and away, release the next."""
        current = self.lane(batch, lane)
        if current is None or current.parking or current.head != dlq_id or self.head_status(batch, dlq_id) != "away":
            ORDERED.labels("ack-ignored").inc()  # a late copy, or the head failed again meanwhile
            return
        await self.release_next(batch, lane, current)

    async def release_next(self, batch: InputBatch, lane: bytes, current: Lane) -> str | None:
        """Make the next held record the head and redeliver it at once; free the lane when none
        is left. The new head's id, or ``None``."""
        state = self.state
        for sequence in range(current.next_held, current.end_held):
            hk = held_key(lane, sequence)
            raw = batch.read(state.index, hk)
            if raw is None:
                continue
            batch.write(state.index, hk, None)
            entry = decode_entry(raw)
            self._write_lane(batch, lane, headed_by(entry, sequence + 1, current.end_held), last_taken=None)
            if entry.parked_at is not None:  # its fate was the parking lot (out of attempts): a parked head
                batch.write(state.index, id_key(entry.id), None)
                await state.park(batch, entry.parked(now_ms(), entry.parked_reason or "", entry.max_attempts))
            else:
                await self._deliver_now(batch, entry.id, raw, entry.counted_as)
            ORDERED.labels("released").inc()
            return entry.id
        batch.write(state.index, lane_row_key(lane), None)
        batch.send(self.blocked_keys_topic, lane, None)
        return None

    async def _deliver_now(self, batch: InputBatch, dlq_id: str, stored: bytes, counted_as: tuple[str, str]) -> None:
        """Redeliver a new head at once; if the send fails, schedule it now, for the ticks to try
        again (and to park it after repeated failures, as any entry)."""
        state = self.state
        [d] = await state.redeliver(batch, [(id_key(dlq_id), stored)], trigger="ordered")
        if d.error is None:
            state.mark_done(batch, id_key(dlq_id), dlq_id, DONE_REDELIVERED, d.entry.attempt, d.entry.fingerprints)
            state.keep_history(batch, d.entry)
            state.write_expiry(batch)
        else:
            state.schedule_at(batch, now_ms(), dlq_id, stored, counted_as)

    # -- blocked keys -------------------------------------------------------------------------------

    def _write_lane(self, batch: InputBatch, lane: bytes, row: Lane, *, last_taken: str | None) -> None:
        batch.write(self.state.index, lane_row_key(lane), encode_lane(row))
        self._publish(batch, lane, row, last_taken=last_taken)

    def _taken_in(self, batch: InputBatch, lane: bytes, current: Lane | None, dlq_id: str) -> None:
        """Tell the letter's writer it was taken in, though it changed nothing (the head's next
        attempt, or a copy): a writer keeps the key blocked until it has seen its last letter taken in."""
        if current is not None:
            self._publish(batch, lane, current, last_taken=dlq_id)
        else:
            batch.send(self.blocked_keys_topic, lane, None, headers=[(LAST_TAKEN, dlq_id.encode())])

    def _publish(self, batch: InputBatch, lane: bytes, row: Lane, *, last_taken: str | None) -> None:
        """The lane's head on the compacted blocked-keys topic (sent with this batch's commit),
        with where the head was read: a consumer re-reading that partition skips the records up
        to there, in hand already (``docs/dead-letter-protocol.md``, "Ordered retries")."""
        headers = [(LAST_TAKEN, last_taken.encode())] if last_taken is not None else []
        if row.head_partition is not None and row.head_offset is not None:
            headers += [(HEAD_PARTITION, str(row.head_partition).encode()), (HEAD_OFFSET, str(row.head_offset).encode())]
        batch.send(self.blocked_keys_topic, lane, row.head.encode(), headers=headers)

    # -- operators ----------------------------------------------------------------------------------

    async def command(self, batch: InputBatch, lane: bytes, action: str, actor: str | None = None) -> dict[str, Any]:
        """Replay the parked head, skip the head (releasing the next), or park the whole key; ``actor``
        (who asked) goes into the replayed head's history and the log."""
        if action not in LANE_ACTIONS:
            raise ValueError(f"unknown lane action {action!r}")
        current = self.lane(batch, lane)
        if current is None:
            return {"status": "not_found"}
        status = self.head_status(batch, current.head)
        if current.parking and action != "park-key":
            return {"status": "parking", "head": current.head}
        if action == "replay-head":
            if status != "parked":
                return {"status": "not_parked", "head": current.head, "head_status": status}
            return {**await self.parking.unpark(batch, current.head, actor), "head": current.head}
        if action == "skip-head":
            self._drop_head(batch, current.head, status)
            new_head = await self.release_next(batch, lane, current)
            log.info("skipped head %s of an ordered key by %s; new head %s", current.head, actor, new_head)
            return {"status": "skipped", "skipped": current.head, "head": new_head}
        return await self._park_key(batch, lane, current, status)

    def _drop_head(self, batch: InputBatch, head: str, status: str) -> None:
        """Cancel a scheduled or parked head (it is never redelivered); an away head is let go."""
        state = self.state
        idk = id_key(head)
        if status == "scheduled":
            current = state.index_state(batch, idk)
            assert isinstance(current, tuple)
            key, _, entry = current
            state.finish(batch, key, entry, done=DONE_CANCELLED)
        elif status == "parked":
            raw = batch.read(state.parked, idk)
            assert raw is not None
            entry = decode_entry(raw)
            state.delete(batch, state.parked, idk)
            state.count(batch, "parked", entry.counted_as, -1)
            state.mark_done(batch, idk, head, DONE_CANCELLED, entry.attempt)
        else:
            return
        state.write_expiry(batch)
        CANCELLED.inc()
        state.totals["cancelled"] += 1

    async def _park_key(self, batch: InputBatch, lane: bytes, current: Lane, status: str) -> dict[str, Any]:
        """Park a scheduled head and every held record (at most :data:`PARK_CHUNK` per inbox
        record, the rest in records of its own); then the key is free. Records taken in
        meanwhile are held, then parked with the rest."""
        state = self.state
        now = now_ms()
        parked = 0
        if status == "scheduled":
            scheduled = state.index_state(batch, id_key(current.head))
            assert isinstance(scheduled, tuple)
            key, _, entry = scheduled
            state.finish(batch, key, entry, done=None)
            await state.park(batch, entry.parked(now, PARKED_WITH_KEY, entry.max_attempts))
            parked += 1
        stop = min(current.end_held, current.next_held + PARK_CHUNK)
        for sequence in range(current.next_held, stop):
            hk = held_key(lane, sequence)
            raw = batch.read(state.index, hk)
            if raw is None:
                continue
            entry = decode_entry(raw)
            batch.write(state.index, hk, None)
            batch.write(state.index, id_key(entry.id), None)
            await state.park(batch, entry.parked(now, PARKED_WITH_KEY, entry.max_attempts))
            parked += 1
        if stop < current.end_held:
            batch.write(state.index, lane_row_key(lane), encode_lane(replace(current, next_held=stop, parking=True)))
            follow = orjson.dumps(lane_command_body(lane, "park-key"))
            batch.send(batch.topic, lane, KIND_LANE + follow, partition=batch.partition)
            return {"status": "parked", "head": current.head, "parked": parked, "continuing": True}
        batch.write(state.index, lane_row_key(lane), None)
        batch.send(self.blocked_keys_topic, lane, None)
        log.info("parked an ordered key: %d records (head %s was %s)", parked, current.head, status)
        return {"status": "parked", "head": current.head, "parked": parked, "continuing": False}
