"""Hop 1: ``route`` reads ``dead-letters`` and keys each one by its ``dlq.id``.

Anyone may write to ``dead-letters``, with any key and missing headers, on any number of
partitions. ``route`` reads the ``dlq.*`` headers with the contract's defaults, decides the
message's fate (its due time, or the parking lot) and forwards the entry to store to the
internal ``…-inbox`` topic partitioned by ``dlq.id``, already encoded, so the second hop
stores it without decoding it: a batch's letters for one inbox partition as one record (a
pack, :func:`~services.retry_scheduler.entries.pack_decided`), a dead letter of an ordered
topic on its own, keyed by its lane. It keeps no state: the engine commits its input only
after the forwarded records are acknowledged, and a record read twice is forwarded twice,
which the second hop recognises by ``dlq.id`` and attempt.
"""

from __future__ import annotations

import logging

from services.retry_scheduler.domain import (
    Park,
    PolicyBook,
    PolicyError,
    PolicySections,
    Schedule,
    build_policy_book,
    decide,
    parse_policy_document,
)
from services.retry_scheduler.entries import (
    Decided,
    Entry,
    clamped_numbers,
    decided_from_letter,
    encode_decided,
    entry_from_letter,
    pack_decided,
)
from services.retry_scheduler.handlers.inbox_state import now_ms
from services.retry_scheduler.handlers.kinds import KIND_DECIDED_PACK
from services.retry_scheduler.handlers.ordered import deferred_entry, is_deferred, ordered_letter_record
from services.retry_scheduler.metrics import OTHER, PARKED
from shared import dead_letters
from shared.engine import Engine, InputBatch, partition_for
from shared.engine import Record as InRecord
from shared.ordered_retries import is_ordered, lane_key, ordered_topics
from shared.settings import Settings
from shared.topics import TopicNames
from shared.yaml_files import load_yaml_file

log = logging.getLogger(__name__)


def read_policy_file(path: str) -> PolicySections | None:
    """The policy file's sections (``STATEFLEET_RETRY_POLICY_FILE``, YAML), or None when no file is set.

    Raises :class:`PolicyError` saying what is wrong: unreadable, not YAML, or a bad rule."""
    if not path:
        return None
    source = f"retry policy file {path}"
    raw = load_yaml_file(path, source, PolicyError)
    return parse_policy_document(raw, source)


class Routing:
    def __init__(self, engine: Engine, settings: Settings, topics: TopicNames, inbox_topic: str) -> None:
        self.settings = settings
        self.topics = topics
        self.inbox_topic = inbox_topic
        self.policies: PolicyBook = build_policy_book(
            max_attempts=settings.retry_max_attempts,
            base_delay_ms=settings.retry_base_delay_ms,
            max_delay_ms=settings.retry_max_delay_ms,
            jitter=settings.retry_jitter,
            overrides=settings.retry_policy_overrides,
            topic_prefix=settings.topic_prefix,
            file_sections=read_policy_file(settings.retry_policy_file),
        )
        # Redelivering to these would feed the message straight back into the scheduler.
        self.looping_topics = frozenset({topics.dead_letters, inbox_topic})
        self.ordered_topics = ordered_topics(settings.retry_ordered_topics)
        engine.handler(topics.dead_letters, name="dead-letters", offsets=None, sends=(inbox_topic, topics.parking_lot))(
            self.route
        )

    async def route(self, batch: InputBatch) -> None:
        received_at = now_ms()
        partitions = self.settings.topic_partitions
        #: Per inbox partition, the batch's unordered letters in order, sent as packs at the end.
        packs: dict[int, list[bytes]] = {}
        for record in batch.records:
            try:
                raw_headers = dead_letters.header_items(record.headers)
                letter = dead_letters.parse_items(
                    record.key,
                    record.value,
                    raw_headers,
                    topic=record.topic,
                    partition=record.partition,
                    offset=record.offset,
                    timestamp_ms=record.timestamp or None,
                    default_retry_topic=self.topics.retry,
                )
                if not letter.retry_topic_given:  # Spring, Connect, Streams or no headers: the policy says where
                    policy = self.policies.policy_for(letter.original_topic, letter.error_class)
                    letter.retry_topic = policy.retry_topic(letter.original_topic, letter.retry_topic)
                lane = self.lane_of(letter.original_topic, letter.key)
                if lane is None:
                    decided = encode_decided(self.decide_letter(letter, raw_headers, received_at))
                else:
                    entry = entry_from_letter(letter, raw_headers, received_at)
                    encoded = self._ordered(lane, entry, is_deferred(raw_headers), received_at)
            except Exception as exc:  # never expected: parsing is lenient; keep the message anyway
                log.exception("unreadable dead letter at %s[%s]@%s", record.topic, record.partition, record.offset)
                self._park_unreadable(batch, record, exc)
                continue
            if lane is None:
                packs.setdefault(partition_for(letter.id, partitions), []).append(decided)
            else:  # every letter of a lane in one partition, whatever its id
                batch.send(self.inbox_topic, letter.id.encode(), encoded, partition=partition_for(lane, partitions))
        for partition, letters in packs.items():
            for pack in pack_decided(letters):
                batch.send(self.inbox_topic, None, KIND_DECIDED_PACK + pack, partition=partition)

    def lane_of(self, origin_topic: str, key: bytes | None) -> bytes | None:
        """The lane of a dead letter of an ordered topic; ``None`` in unordered mode."""
        if key is None or not is_ordered(self.ordered_topics, origin_topic, key, self.settings.topic_prefix):
            return None
        return lane_key(origin_topic, key)

    def _ordered(self, lane: bytes, entry: Entry, deferred: bool, now: int) -> bytes:
        """The inbox record of an ordered topic's dead letter. A deferred record has no backoff of
        its own: it waits for its head, or, with none, is redelivered at once."""
        if deferred:
            entry = deferred_entry(entry)
        entry = self.decide_fate(entry, now)
        if deferred and entry.parked_at is None:
            entry = entry.scheduled(now, entry.max_attempts)
        return ordered_letter_record(lane, deferred, encode_decided(Decided.of(entry)))

    def _park_unreadable(self, batch: InputBatch, record: InRecord, exc: Exception) -> None:
        """Publish a dead letter that cannot be read to the parking lot as it came, with the reason."""
        headers = [*dead_letters.header_items(record.headers), ("dlq.parked.reason", f"unreadable: {exc}"[:2000].encode())]
        value = record.value if record.key is not None or record.value is not None else b""
        batch.send(self.topics.parking_lot, record.key, value, headers=headers)
        PARKED.labels(OTHER).inc()  # its origin could not be read

    def decide_fate(self, entry: Entry, now: int) -> Entry:
        """``entry`` scheduled for its next delivery, or parked when that cannot or must not be."""
        decision = self._decision(entry, entry.attempt, entry.origin_topic, entry.failed_at, now)
        if isinstance(decision, Park):
            return entry.parked(now, decision.reason, decision.policy.max_attempts)
        return entry.scheduled(decision.due_at, decision.policy.max_attempts)

    def decide_letter(self, letter: dead_letters.DeadLetter, raw_headers: list[tuple[str, bytes]], received_at: int) -> Decided:
        """A dead letter just read, decided as :meth:`decide_fate` decides its entry (parked at ``received_at``)."""
        numbers = clamped_numbers(letter)
        decision = self._decision(letter, numbers[0], letter.original_topic, numbers[4], received_at)
        max_attempts = decision.policy.max_attempts
        if isinstance(decision, Park):
            return decided_from_letter(letter, raw_headers, numbers, received_at, 0, max_attempts, decision.reason)
        return decided_from_letter(letter, raw_headers, numbers, received_at, decision.due_at, max_attempts)

    def _decision(
        self, entry: Entry | dead_letters.DeadLetter, attempt: int, origin_topic: str, failed_at: int, now: int
    ) -> Schedule | Park:
        """The policy's decision for an attempt of a dead letter or of its entry (with the entry's numbers)."""
        return decide(
            self.policies,
            dlq_id=entry.id,
            attempt=attempt,
            origin_topic=origin_topic,
            error_class=entry.error_class,
            failed_at=failed_at,
            retry_topic=entry.retry_topic,
            now_ms=now,
            forbidden_retry_topics=self.looping_topics,
            has_key_or_value=entry.key is not None or entry.value is not None,
        )
