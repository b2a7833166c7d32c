"""The tallies service: Faust app, tables and agents.

Two hops, because inputs are keyed by account and tallies by program:

1. ``route_inputs`` reads ``account-events``, ``logins`` and the service's retry topic,
   validates each record (bad ones become dead letters, with the original topic,
   partition and offset), and forwards a compact record keyed by program_id to the
   internal ``…-by-program`` topic.
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
from typing import Any

from services.tallies import DEFAULT_PORT, SERVICE
from services.tallies.domain import (
    AccountChange,
    InvalidInput,
    Login,
    Tally,
    apply_change,
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

KIND_CHANGE = "c"
KIND_LOGIN = "l"


def encode_routed(item: AccountChange | Login) -> bytes:
    if isinstance(item, AccountChange):
        return codecs.dumps({"k": KIND_CHANGE, "a": item.account_id, "p": item.program_id, "t": item.type, "v": item.version})
    return codecs.dumps({"k": KIND_LOGIN, "a": item.account_id, "p": item.program_id, "ts": item.ts})


def decode_routed(raw: bytes) -> AccountChange | Login:
    obj = codecs.loads_object(raw)
    if obj["k"] == KIND_CHANGE:
        return AccountChange(account_id=obj["a"], program_id=obj["p"], type=obj["t"], version=obj["v"])
    return Login(account_id=obj["a"], program_id=obj["p"], ts=obj["ts"])


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
            for event in events:
                msg = event.message
                try:
                    item = parse_input(msg.topic, msg.value, msg.headers, self.topics)
                except (codecs.DecodeError, InvalidInput) as exc:
                    await self.dead_letters.send(event, exc)
                    continue
                await self.app.producer.send(
                    self.by_program_topic_name, item.program_id.encode(), encode_routed(item),
                    partition=None, timestamp=None, headers=None,
                )
            MESSAGES_PROCESSED.labels(SERVICE, "inputs").inc(len(events))
            BATCH_SECONDS.labels(SERVICE, "inputs").observe(time.perf_counter() - started)

    # -- hop 2: apply per program -----------------------------------------------------------

    async def apply_inputs(self, stream: Any) -> None:
        async for events in stream.take_events(self.settings.batch_size, self.settings.batch_within_s):
            started = time.perf_counter()
            for event in events:
                item = decode_routed(event.message.value)
                with event_context(event):
                    if isinstance(item, AccountChange):
                        self.apply_change(event.message.partition, item)
                    else:
                        self.apply_login(item)
            MESSAGES_PROCESSED.labels(SERVICE, "by-program").inc(len(events))
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

    def apply_login(self, login: Login) -> None:
        key = login.program_id.encode()
        raw = self.last_logins.get(key)
        if raw is not None and int(raw) >= login.ts:
            return
        self.last_logins[key] = str(login.ts).encode()
        self.dirty.add(login.program_id)

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
