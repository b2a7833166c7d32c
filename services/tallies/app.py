"""The tallies service: Faust app, tables and agents.

Two hops, because inputs are keyed by account and tallies by program:

1. ``route_inputs`` reads ``account-events``, ``logins`` and the service's retry topic,
   validates each record (bad ones become dead letters, with the original topic,
   partition and offset), and forwards them keyed by program_id to the internal
   ``…-by-program`` topic.
   One record per program per batch (:class:`ProgramInputs`).
2. ``apply_inputs`` reads that topic. Per program partition it holds the memberships
   table (the state) and the last-logins table, and updates the derived counts.

Changed programs are marked dirty and published to ``program-tallies`` by a timer
(at most once per interval per program, not once per input event). After every
rebalance, counts are rebuilt from the restored memberships and every owned program
is republished, so nothing a crash interrupted stays unpublished.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from services.tallies import DEFAULT_PORT, SERVICE
from services.tallies.domain import (
    AccountChange,
    InvalidInput,
    Login,
    Tally,
    apply_change,
    latest_login,
    parse_account_change,
    parse_login,
)
from services.tallies.state import (
    ProgramCounts,
    decode_membership,
    encode_membership,
    membership_key,
)
from shared import codecs, dead_letters
from shared.dead_letter_sink import DeadLetterSink
from shared.faust_app import app_id, changelog_topic_specs, create_app
from shared.faust_internals import active_partitions, event_context, partition_items
from shared.metrics import BATCH_SECONDS, MESSAGES_PROCESSED
from shared.partitioning import partition_for
from shared.settings import Settings
from shared.topic_admin import TopicSpec
from shared.topics import TopicNames, topic_names

log = logging.getLogger(__name__)

#: Most account changes packed into one record of the by-program topic.
MAX_CHANGES_PER_RECORD = 500


@dataclass
class ProgramInputs:
    """One program's inputs from one batch, sent as one record: account changes in
    arrival order, and the largest login ts. Packing spares the second hop a message per
    input event; applying it is the same per-change version check, so a replayed record
    changes nothing."""

    changes: list[AccountChange] = field(default_factory=list)
    last_login: int | None = None

    def encode(self) -> bytes:
        return codecs.dumps({"c": [[c.account_id, c.type, c.version] for c in self.changes], "l": self.last_login})

    @staticmethod
    def decode(program_id: str, raw: bytes) -> ProgramInputs:
        obj = codecs.loads_object(raw)
        changes = [AccountChange(account_id=a, program_id=program_id, type=t, version=v) for a, t, v in obj["c"]]
        return ProgramInputs(changes=changes, last_login=obj["l"])

    def __len__(self) -> int:
        return len(self.changes) + (self.last_login is not None)


def pack_by_program(items: list[AccountChange | Login]) -> list[tuple[str, ProgramInputs]]:
    """Group a batch's inputs by program, keeping each account's changes in order."""
    packed: dict[str, list[ProgramInputs]] = {}
    for item in items:
        parts = packed.setdefault(item.program_id, [ProgramInputs()])
        if isinstance(item, Login):
            parts[-1].last_login = latest_login(parts[-1].last_login, item.ts)
            continue
        if len(parts[-1].changes) >= MAX_CHANGES_PER_RECORD:
            parts.append(ProgramInputs())
        parts[-1].changes.append(item)
    return [(program, part) for program, parts in packed.items() for part in parts]


def parse_input(topic: str, value: bytes | None, headers: Any, topics: TopicNames) -> AccountChange | Login:
    """Validate one input record; the topic (or, for a retry, its original topic) says what it is."""
    origin = topic
    if topic == topics.service_retry(SERVICE):
        origin = dead_letters.headers_dict(dead_letters.header_items(headers)).get(dead_letters.ORIGINAL_TOPIC, "")
    obj = codecs.loads_object(value)
    if origin == topics.logins:
        item: AccountChange | Login = parse_login(obj)
    elif origin == topics.account_events:
        item = parse_account_change(obj)
    else:
        raise InvalidInput(f"cannot tell what a record from topic {origin!r} is")
    if "\x00" in item.program_id:
        raise InvalidInput("'program_id' must not contain NUL")
    return item


class TalliesService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topics = topic_names(settings)
        self.app = app = create_app(SERVICE, settings, DEFAULT_PORT)
        partitions = settings.topic_partitions
        self.by_program_topic_name = f"{app_id(SERVICE, settings)}-by-program"

        self.inputs = app.topic(
            self.topics.account_events, self.topics.logins, self.topics.service_retry(SERVICE),
            key_type=bytes, value_type=bytes,
        )
        self.by_program = app.topic(
            self.by_program_topic_name, partitions=partitions, internal=True, key_type=bytes, value_type=bytes,
        )
        self.memberships = app.Table(
            "memberships", partitions=partitions, key_type=bytes, value_type=bytes,
        )
        self.last_logins = app.Table(
            "last-logins", partitions=partitions, key_type=bytes, value_type=bytes,
        )
        self.counts = ProgramCounts()
        self.dirty: set[str] = set()
        self.dead_letters = DeadLetterSink(
            app, SERVICE, self.topics.dead_letters, retry_topic=self.topics.service_retry(SERVICE),
        )
        self.published = 0

        app.agent(self.inputs, name=f"{SERVICE}.route_inputs")(self.route_inputs)
        app.agent(self.by_program, name=f"{SERVICE}.apply_inputs")(self.apply_inputs)
        app.timer(settings.tally_publish_interval_s, name=f"{SERVICE}.publish")(self.publish_dirty)
        self.memberships.on_recover(self.rebuild_counts)

    def topic_specs(self) -> list[TopicSpec]:
        n = self.settings.topic_partitions
        return [
            TopicSpec(self.topics.account_events, n),
            TopicSpec(self.topics.logins, n),
            TopicSpec(self.topics.service_retry(SERVICE), n),
            TopicSpec(self.topics.dead_letters, n),
            TopicSpec(self.topics.program_tallies, n, compacted=True),
            TopicSpec(self.by_program_topic_name, n),
            *changelog_topic_specs(self.app, self.settings),
        ]

    # -- hop 1: validate and key by program ---------------------------------------------

    async def route_inputs(self, stream: Any) -> None:
        async for events in stream.take_events(self.settings.batch_size, self.settings.batch_within_s):
            started = time.perf_counter()
            items: list[AccountChange | Login] = []
            for event in events:
                msg = event.message
                try:
                    items.append(parse_input(msg.topic, msg.value, msg.headers, self.topics))
                except (codecs.DecodeError, InvalidInput) as exc:
                    await self.dead_letters.send(event, exc)
            for program_id, inputs in pack_by_program(items):
                await self.app.producer.send(
                    self.by_program_topic_name, program_id.encode(), inputs.encode(),
                    partition=None, timestamp=None, headers=None,
                )
            MESSAGES_PROCESSED.labels(SERVICE, "inputs").inc(len(events))
            BATCH_SECONDS.labels(SERVICE, "inputs").observe(time.perf_counter() - started)

    # -- hop 2: apply per program -----------------------------------------------------------

    async def apply_inputs(self, stream: Any) -> None:
        async for events in stream.take_events(self.settings.batch_size, self.settings.batch_within_s):
            started = time.perf_counter()
            applied = 0
            for event in events:
                program_id = event.message.key.decode()
                inputs = ProgramInputs.decode(program_id, event.message.value)
                with event_context(event):
                    for change in inputs.changes:
                        self.apply_change(event.message.partition, change)
                    if inputs.last_login is not None:
                        self.apply_login(program_id, inputs.last_login)
                applied += len(inputs)
            MESSAGES_PROCESSED.labels(SERVICE, "by-program").inc(applied)
            BATCH_SECONDS.labels(SERVICE, "by-program").observe(time.perf_counter() - started)

    def apply_change(self, partition: int, change: AccountChange) -> None:
        key = membership_key(change.program_id, change.account_id)
        raw = self.memberships.get(key)
        current = decode_membership(raw) if raw is not None else None
        updated = apply_change(current, change)
        if updated is None:
            return  # a replay: this version is already applied
        self.memberships[key] = encode_membership(updated)
        self.counts.move(partition, change.program_id, current.status if current else None, updated.status)
        self.dirty.add(change.program_id)

    def apply_login(self, program_id: str, ts: int) -> None:
        key = program_id.encode()
        raw = self.last_logins.get(key)
        if raw is not None and int(raw) >= ts:
            return
        self.last_logins[key] = str(ts).encode()
        self.dirty.add(program_id)

    # -- recovery and publishing --------------------------------------------------------------

    async def rebuild_counts(self) -> None:
        started = time.perf_counter()
        owned = active_partitions(self.app, self.memberships)
        rows = self.counts.rebuild({p: partition_items(self.memberships, p) for p in owned})
        self.dirty.update(self.local_programs())
        log.info(
            "rebuilt counts from %d memberships in %d partitions (%.2fs); %d programs to republish",
            rows, len(owned), time.perf_counter() - started, len(self.dirty),
        )

    def tally(self, program_id: str) -> Tally | None:
        partition = self._partition(program_id)
        counts = self.counts.get(partition, program_id)
        raw_login = self.last_logins.get(program_id.encode())
        if counts is None and raw_login is None:
            return None
        active, inactive = counts if counts is not None else (0, 0)
        return Tally(
            program_id=program_id, numberActive=active, numberInactive=inactive,
            lastLogin=int(raw_login) if raw_login is not None else None,
        )

    def local_programs(self) -> set[str]:
        programs = {program for _, program in self.counts.programs()}
        for p in active_partitions(self.app, self.last_logins):
            programs.update(key.decode() for key, _ in partition_items(self.last_logins, p))
        return programs

    def _partition(self, program_id: str) -> int:
        return partition_for(program_id, self.settings.topic_partitions)

    async def publish_dirty(self) -> None:
        if not self.dirty or self.app.rebalancing:
            return
        programs, self.dirty = self.dirty, set()
        owned = active_partitions(self.app, self.memberships)
        for program_id in sorted(programs):
            if self._partition(program_id) not in owned:
                continue
            tally = self.tally(program_id)
            if tally is None:
                continue
            await self.app.producer.send(
                self.topics.program_tallies, program_id.encode(), codecs.dumps(tally.to_json()),
                partition=None, timestamp=None, headers=None,
            )
            self.published += 1
