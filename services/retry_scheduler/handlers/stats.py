"""What the HTTP API reads of this instance's partitions: one id's entry, the counts by
origin topic and error class (each partition's ``!counts`` row, loaded after every
recovery), the oldest due time, and the gauges of stored messages."""

from __future__ import annotations

import logging
import time
from typing import Any

from services.retry_scheduler.entries import Entry, Replayed, decode_entry, decode_history
from services.retry_scheduler.handlers.inbox_state import InboxState
from services.retry_scheduler.handlers.ticks import Ticks
from services.retry_scheduler.metrics import STORED
from services.retry_scheduler.scans import LaneCounts, count_lanes, first_due_key
from services.retry_scheduler.state import (
    COUNTS_KEY,
    Done,
    decode_index,
    decode_lane,
    held_key,
    history_key,
    id_key,
    is_held_key,
    lane_row_key,
)
from shared.engine import Engine, partition_for

log = logging.getLogger(__name__)


class Stats:
    def __init__(self, engine: Engine, state: InboxState, ticks: Ticks) -> None:
        self.engine = engine
        self.state = state
        self.ticks = ticks
        engine.on_recovered(state.schedule, self.on_recovered)

    async def on_recovered(self) -> None:
        state = self.state
        started = time.perf_counter()
        owned = self.owned()
        state.low_water = {}
        state.next_due = {}
        state.send_failures = {}
        self.ticks.forget_partitions()
        counts = state.counts
        counts.forget(owned)
        uncounted = set()
        for p in owned:
            raw = state.index.get(p, COUNTS_KEY)
            try:
                if raw is not None:
                    counts.load(p, raw)
                    continue
            except ValueError as exc:
                log.warning("partition %d: unreadable counts row, counting its rows instead: %s", p, exc)
            uncounted.add(p)
        # Rows written before the counts row existed: counted once here, the row follows with the next change.
        rows = counts.rebuild({p: state.schedule.items(p) for p in uncounted}, {p: state.parked.items(p) for p in uncounted})
        self.update_gauges()
        totals = counts.totals(owned)
        log.info(
            "recovered the counts of %d partitions (%d scheduled, %d parked; %d partitions counted from %d rows) in %.2fs",
            len(owned),
            totals["scheduled"],
            totals["parked"],
            len(uncounted),
            rows,
            time.perf_counter() - started,
        )

    def owned(self) -> set[int]:
        return self.state.schedule.owned_partitions()

    def update_gauges(self) -> None:
        totals = self.state.counts.totals(self.owned())
        STORED.labels("schedule").set(totals["scheduled"])
        STORED.labels("parked").set(totals["parked"])

    def index_entry(self, dlq_id: str, partition: int | None = None) -> Entry | Done | None:
        """For HTTP reads: the scheduled entry of an id, its done marker, or nothing, in
        ``partition`` (by default the id's own; a letter of an ordered topic is in its key's)."""
        p = self.state.partition_of(dlq_id) if partition is None else partition
        raw_index = self.state.index.get(p, id_key(dlq_id))
        if raw_index is None:
            return None
        index = decode_index(raw_index)
        if isinstance(index, Done):
            return index
        raw = self.state.schedule.get(p, index)
        return decode_entry(raw) if raw is not None else None

    def scheduled_entry(self, dlq_id: str, partition: int | None = None) -> Entry | None:
        found = self.index_entry(dlq_id, partition)
        return found if isinstance(found, Entry) else None

    def parked_entry(self, dlq_id: str, partition: int | None = None) -> Entry | None:
        p = self.state.partition_of(dlq_id) if partition is None else partition
        raw = self.state.parked.get(p, id_key(dlq_id))
        return decode_entry(raw) if raw is not None else None

    def last_event(self, dlq_id: str, partition: int) -> Replayed | None:
        """The latest event of the history an id keeps while it is away (replayed, deleted, expired), or None."""
        raw = self.state.index.get(partition, history_key(dlq_id))
        if raw is None:
            return None
        try:
            history = decode_history(raw)
        except ValueError:
            return None
        return history[-1] if history else None

    def held_entry(self, dlq_id: str, partition: int) -> Entry | None:
        """A record held behind its key's head (ordered retries), as it will be redelivered."""
        raw_index = self.state.index.get(partition, id_key(dlq_id))
        if raw_index is None or not is_held_key(raw_index):
            return None
        raw = self.state.index.get(partition, raw_index)
        return decode_entry(raw) if raw is not None else None

    def knows(self, dlq_id: str, partition: int) -> bool:
        """Whether this instance's copy of ``partition`` holds anything of the id: scheduled,
        held, parked, or a done marker."""
        key = id_key(dlq_id)
        return self.state.index.get(partition, key) is not None or self.state.parked.get(partition, key) is not None

    def head_status(self, partition: int, head: str) -> str:
        """For HTTP reads: ``scheduled``, ``parked`` or ``away`` (redelivered, not acknowledged yet),
        read from the lane's ``partition`` (a head is kept there, not in its id's partition)."""
        state = self.state
        head_index = state.index.get(partition, id_key(head))
        scheduled = decode_index(head_index) if head_index is not None else None
        if isinstance(scheduled, bytes) and state.schedule.get(partition, scheduled) is not None:
            return "scheduled"
        if state.parked.get(partition, id_key(head)) is not None:
            return "parked"
        return "away"

    def lane_view(self, lane: bytes, held_listed: int) -> dict[str, Any] | None:
        """For HTTP reads: an ordered lane's head, its state, and its held records (the first
        ``held_listed`` ids); ``None`` when the key is not blocked."""
        state = self.state
        partition = partition_for(lane, self.engine.settings.topic_partitions)
        raw = state.index.get(partition, lane_row_key(lane))
        if raw is None:
            return None
        row = decode_lane(raw)
        held_ids = []
        for sequence in range(row.next_held, min(row.end_held, row.next_held + held_listed)):
            held_raw = state.index.get(partition, held_key(lane, sequence))
            if held_raw is not None:
                held_ids.append(decode_entry(held_raw).id)
        return {"head": row.head, "head_status": self.head_status(partition, row.head), "held": row.held, "held_ids": held_ids}

    def lane_counts(self, partitions: set[int]) -> LaneCounts:
        """Blocked keys of ordered topics and their held records, in these partitions."""
        total = LaneCounts()
        for p in partitions:
            counts = count_lanes(self.state.index.view(p))
            total.blocked_keys += counts.blocked_keys
            total.held += counts.held
        return total

    def oldest_due(self, partitions: set[int]) -> int | None:
        oldest: int | None = None
        for p in partitions:
            key = first_due_key(self.state.schedule.view(p), self.state.low_water.get(p, b""))
            if key is not None:
                due = int.from_bytes(key[:8], "big")
                oldest = due if oldest is None else min(oldest, due)
        return oldest
