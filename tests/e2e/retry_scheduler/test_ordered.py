"""Ordered retries end to end: a user's consumer process on shared.retry_client and the retry
scheduler process, on the real broker, keep each key's records in order through failures,
retries, a parked head's replay and a skip, with the consumer SIGKILLed once while keys are
blocked with records held behind their heads. Other keys go on meanwhile.

Processing is at least once: a record may be processed again after the kill. What must hold,
per key: every record but the skipped one is processed, none before every earlier record
of its key (but the skipped one) has been processed at least once, and a record processed again
is followed by every later one of its key processed again (never an older value applied last).
A record the consumer reads again that it processed before its key was blocked is not processed
again at all (docs/dead-letter-protocol.md, "Ordered retries")."""

from __future__ import annotations

import itertools
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from shared import dead_letters as dl
from shared.engine import partition_for
from shared.ordered_retries import HELD_BEHIND
from tests.integration.retry_scheduler.helpers import TOKEN, scheduler_env, start_scheduler
from tests.support.environment import service_environment
from tests.support.kafka import Record, committed_offsets, create_topics, produce, read_all
from tests.support.services import ServiceProcess, wait_for
from tools import web

pytestmark = pytest.mark.e2e

#: Records of each key per wave (four waves).
WAVE = 8
#: The handler's time per record: a wave's records take a while, so the SIGKILL during wave 3
#: usually finds records read and not committed yet (the output then shows some processed twice).
WORK_MS = 15
#: Keys whose records never fail: they must go on while other keys are blocked.
STEADY = ("steady-1", "steady-2")
#: Its record RETRIED_SEQ fails its first 2 attempts, then succeeds on a redelivery after backoff.
RETRIED, RETRIED_SEQ = "retried", 2
#: Its record PARKED_SEQ fails until the test creates HEAL: it is parked at the scheduler's 4th
#: attempt, then replayed by an operator.
PARKED, PARKED_SEQ, HEAL = "parked", 3, "heal-parked"
#: Its record SKIPPED_SEQ always fails: parked, then skipped by an operator.
SKIPPED, SKIPPED_SEQ = "skipped", 4
KEYS = (*STEADY, RETRIED, PARKED, SKIPPED)
FAILS = {
    (RETRIED, RETRIED_SEQ): "first:2",
    (RETRIED, 3 * WAVE + 1): "first:1",  # once more after the consumer's restart
    (PARKED, PARKED_SEQ): f"until:{HEAL}",
    (SKIPPED, SKIPPED_SEQ): "always",
}
#: The scheduler's attempts before it parks (tests.integration.retry_scheduler.helpers).
MAX_ATTEMPTS = 4


@dataclass
class SchedulerAndConsumer:
    """The scheduler and the user's consumer of one test, and what the test asks of them."""

    prefix: str
    scheduler: ServiceProcess
    consumer_env: dict[str, str]
    consumer_args: tuple[str, ...]
    log_dir: Path

    @property
    def origin(self) -> str:
        return f"{self.prefix}orders"

    @property
    def retry_topic(self) -> str:
        return f"{self.prefix}retry-orders"

    @property
    def output(self) -> str:
        return f"{self.prefix}processed"

    @property
    def group(self) -> str:
        return f"{self.prefix}users"

    def start_consumer(self) -> ServiceProcess:
        log = self.log_dir / f"ordered-consumer-{uuid.uuid4().hex[:4]}.log"
        return ServiceProcess("tests.support.ordered_consumer", self.consumer_env, log, args=self.consumer_args).start()

    def lane(self, key: str) -> dict[str, Any] | None:
        """The scheduler's view of a blocked key (GET /ordered-keys), or None when it is free."""
        response = web.get(self.scheduler.url + "/ordered-keys", params={"origin_topic": self.origin, "key": key}, timeout=10)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return dict(response.json())

    def lane_of(self, key: str) -> dict[str, Any]:
        lane = self.lane(key)
        assert lane is not None, f"{key} is not blocked"
        return lane

    def processed_all(self, keys: tuple[str, ...], end: int) -> bool:
        """Whether each of ``keys`` had its records up to ``end`` processed (once at least)."""
        processed = self.processed()
        return all(seqs_of(processed, key) >= set(range(end)) for key in keys)

    def parked_with_held(self, key: str, held: int) -> bool:
        lane = self.lane(key) or {}
        return lane.get("head_status") == "parked" and lane.get("held") == held

    def lane_command(self, action: str, key: str) -> httpx.Response:
        return web.post(
            self.scheduler.url + f"/ordered-keys/{action}",
            params={"origin_topic": self.origin, "key": key},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=30,
        )

    def stats(self) -> dict[str, Any]:
        return dict(web.get(self.scheduler.url + "/retries/stats", timeout=10).json())

    def processed(self) -> list[tuple[str, int, int]]:
        """(key, seq, failed attempts before) of every record processed so far, in the order processed."""
        out = []
        for r in read_all(self.output):
            body = orjson.loads(r.body)
            out.append((body["key"], body["seq"], body["attempt"]))
        return out


@pytest.fixture
def scheduler_and_consumer(kafka_bootstrap: str, prefix: str, tmp_path: Path) -> Iterator[SchedulerAndConsumer]:
    create_topics([prefix + n for n in ("dead-letters", "retry", "parking-lot", "retry-acks", "orders", "retry-orders")])
    create_topics([f"{prefix}retry-blocked-keys"], compacted=[f"{prefix}retry-blocked-keys"])
    create_topics([f"{prefix}processed"], partitions=1)  # one partition: its order is the order of processing
    env = scheduler_env(kafka_bootstrap, prefix, tmp_path / "data", retry_ordered_topics="orders")
    scheduler = start_scheduler(env, tmp_path)
    (tmp_path / "control").mkdir()
    consumer_env = service_environment(kafka_bootstrap, prefix, tmp_path / "consumer-data")
    args = (
        *("--topic", f"{prefix}orders", "--retry-topic", f"{prefix}retry-orders", "--group", f"{prefix}users"),
        *("--output", f"{prefix}processed", "--control-dir", str(tmp_path / "control"), "--work-ms", str(WORK_MS)),
    )
    try:
        yield SchedulerAndConsumer(prefix, scheduler, consumer_env, args, tmp_path)
    finally:
        scheduler.kill()


def produce_wave(scheduler_and_consumer: SchedulerAndConsumer, seqs: range) -> None:
    """Every key's records ``seqs``, the keys interleaved."""
    records = []
    for seq in seqs:
        for key in KEYS:
            body: dict[str, Any] = {"key": key, "seq": seq}
            if (key, seq) in FAILS:
                body["fails"] = FAILS[key, seq]
            records.append((key.encode(), orjson.dumps(body)))
    produce(scheduler_and_consumer.origin, records)


def seqs_of(processed: list[tuple[str, int, int]], key: str) -> set[int]:
    return {seq for k, seq, _ in processed if k == key}


def out_of_order(processed: list[tuple[str, int, int]], skipped: tuple[str, int]) -> list[str]:
    """Every record processed before an earlier record of its key (but ``skipped``) had been processed once."""
    seen: dict[str, set[int]] = defaultdict(set)
    wrong = []
    for key, seq, _ in processed:
        missing = [s for s in range(seq) if (key, s) != skipped and s not in seen[key]]
        if missing:
            wrong.append(f"{key}#{seq} before {missing}")
        seen[key].add(seq)
    return wrong


def held_behind(records: list[Record], key: str) -> dict[str, int]:
    """Per head ``dlq.id``, how many of ``key``'s redeliveries waited behind it."""
    counts: dict[str, int] = defaultdict(int)
    for r in records:
        behind = dict(r.headers).get(HELD_BEHIND)
        if r.key == key.encode() and behind:
            counts[behind.decode()] += 1
    return counts


def test_a_keys_records_come_out_in_order_through_failures_a_replay_a_skip_and_a_sigkill(
    scheduler_and_consumer: SchedulerAndConsumer,
) -> None:
    skipped = (SKIPPED, SKIPPED_SEQ)
    free_keys = (*STEADY, RETRIED)
    consumer = scheduler_and_consumer.start_consumer()
    try:
        # Wave 1: RETRIED's head fails twice and succeeds after backoff, its later records held
        # behind it meanwhile; PARKED's and SKIPPED's heads run out of attempts and are parked,
        # each with the rest of the wave held behind it.
        produce_wave(scheduler_and_consumer, range(WAVE))
        wait_for(
            lambda: scheduler_and_consumer.processed_all(free_keys, WAVE), timeout=45, message="wave 1 of the free keys processed"
        )
        assert out_of_order(scheduler_and_consumer.processed(), skipped) == []
        for key, seq in ((PARKED, PARKED_SEQ), (SKIPPED, SKIPPED_SEQ)):
            wait_for(
                lambda key=key, seq=seq: scheduler_and_consumer.parked_with_held(key, WAVE - seq - 1),
                timeout=30,
                message=f"{key}'s head parked with the rest of wave 1 held",
            )

        # Wave 2: the free keys go on; the blocked keys' records are held, none processed.
        produce_wave(scheduler_and_consumer, range(WAVE, 2 * WAVE))
        wait_for(
            lambda: scheduler_and_consumer.processed_all(free_keys, 2 * WAVE),
            timeout=45,
            message="wave 2 of the free keys processed",
        )
        assert out_of_order(scheduler_and_consumer.processed(), skipped) == []
        for key, seq in ((PARKED, PARKED_SEQ), (SKIPPED, SKIPPED_SEQ)):
            wait_for(
                lambda key=key, seq=seq: scheduler_and_consumer.parked_with_held(key, 2 * WAVE - seq - 1),
                timeout=30,
                message=f"{key}'s wave 2 held behind its parked head",
            )
            assert seqs_of(scheduler_and_consumer.processed(), key) == set(range(seq))

        # PARKED's cause is fixed and an operator replays its head: its held records follow, one
        # at a time. Meanwhile wave 3 comes, and the consumer is SIGKILLed while it processes it
        # (SKIPPED is blocked with records held all along); wave 4 arrives while it is down, and
        # it restarts in the same group.
        parked_head = scheduler_and_consumer.lane_of(PARKED)["head"]
        (scheduler_and_consumer.log_dir / "control" / HEAL).touch()
        replayed = scheduler_and_consumer.lane_command("replay-head", PARKED)
        assert replayed.status_code == 200 and replayed.json()["status"] == "redelivered", replayed.text
        wait_for(
            lambda: seqs_of(scheduler_and_consumer.processed(), PARKED) >= set(range(PARKED_SEQ + 2)),
            timeout=30,
            message="the replayed head and the first record behind it processed",
        )
        produce_wave(scheduler_and_consumer, range(2 * WAVE, 3 * WAVE))
        wait_for(
            lambda: any(seq >= 2 * WAVE for _, seq, _ in scheduler_and_consumer.processed()),
            timeout=30,
            message="wave 3 under way",
        )
        consumer.kill()
        produce_wave(scheduler_and_consumer, range(3 * WAVE, 4 * WAVE))
        consumer = scheduler_and_consumer.start_consumer()
        wait_for(
            lambda: scheduler_and_consumer.processed_all((*free_keys, PARKED), 4 * WAVE),
            timeout=60,
            message="every record of the free keys and of the replayed one processed after the restart",
        )
        wait_for(
            lambda: scheduler_and_consumer.parked_with_held(SKIPPED, 4 * WAVE - SKIPPED_SEQ - 1),
            timeout=30,
            message="SKIPPED's waves 3 and 4 held behind its parked head too",
        )
        assert seqs_of(scheduler_and_consumer.processed(), SKIPPED) == set(range(SKIPPED_SEQ))

        # An operator skips SKIPPED's head: never processed, the rest follow.
        skipped_head = scheduler_and_consumer.lane_of(SKIPPED)["head"]
        skip = scheduler_and_consumer.lane_command("skip-head", SKIPPED)
        assert skip.status_code == 200, skip.text
        assert skip.json()["status"] == "skipped" and skip.json()["skipped"] == skipped_head

        expected = {k: set(range(4 * WAVE)) - ({SKIPPED_SEQ} if k == SKIPPED else set()) for k in KEYS}
        processed = wait_for(
            lambda: (p := scheduler_and_consumer.processed()) and all(seqs_of(p, k) == expected[k] for k in KEYS) and p,
            timeout=60,
            message="every record but the skipped one processed",
        )
        stats = wait_for(
            lambda: (s := scheduler_and_consumer.stats())["blocked_keys"] == 0 and s["held"] == 0 and s,
            timeout=30,
            message="no key blocked any more",
        )
    finally:
        consumer.kill()

    assert out_of_order(processed, skipped) == []
    assert skipped not in {(k, s) for k, s, _ in processed}
    for key in KEYS:  # the records processed again after the SIGKILL too
        calls = [seq for k, seq, _ in processed if k == key]
        assert calls_out_of_order(calls, sorted(expected[key])) == [], key
    assert (stats["scheduled"], stats["parked"]) == (0, 0)
    assert all(scheduler_and_consumer.lane(key) is None for key in KEYS)
    # The retried heads succeeded on their third and second attempts (an earlier one fails
    # however often it is read); the parked one when replayed after its 4th (an earlier
    # redelivery read again after the kill would succeed too, being read after the fix).
    for (key, seq), fails in FAILS.items():
        if fails.startswith("first:"):
            assert {a for k, s, a in processed if (k, s) == (key, seq)} == {int(fails.removeprefix("first:"))}
    assert MAX_ATTEMPTS in {a for k, s, a in processed if (k, s) == (PARKED, PARKED_SEQ)}
    # The records behind each head waited for it in the scheduler: redelivered naming it.
    redelivered = read_all(scheduler_and_consumer.retry_topic)
    assert held_behind(redelivered, PARKED)[parked_head] >= 2 * WAVE - PARKED_SEQ - 1
    assert held_behind(redelivered, SKIPPED)[skipped_head] >= 4 * WAVE - SKIPPED_SEQ - 1
    [retried_head] = {dict(r.headers)[dl.ID].decode() for r in redelivered if orjson.loads(r.body) == retried_body()}
    assert held_behind(redelivered, RETRIED)[retried_head] >= 1
    duplicates = len(processed) - sum(len(seqs) for seqs in expected.values())
    print(f"{len(processed)} records processed, {duplicates} of them again after the SIGKILL")


def retried_body() -> dict[str, Any]:
    return {"key": RETRIED, "seq": RETRIED_SEQ, "fails": FAILS[RETRIED, RETRIED_SEQ]}


#: The key of the SIGKILL between processing and commit: its records 0 to CRASH_SEQ - 1 are
#: processed, CRASH_SEQ fails once (the key's head), the rest are held behind it.
CRASHED, CRASH_SEQ, CRASHED_RECORDS = "crashed", 5, 8
#: The control file that lets the handler of the last record fetched return.
RELEASE = "release-last"
#: The origin topic's partitions (the fixture's topics have create_topics' default).
ORIGIN_PARTITIONS = 8


def calls_out_of_order(calls: list[int], records: list[int]) -> list[str]:
    """What keeps a key's handler calls (seqs, in the order processed) from being in order, first
    processing and repeats alike, where ``records`` are the key's records to process, in their
    order: each call is the key's first record, the one after the call before it, or one
    processed already (a repeat goes back, and on in order from there); the last call is the
    key's last record. So no record is processed behind a later one unless that later one is
    processed again after it: 0 1 2 0 1 2 is in order, 0 1 2 3 1 2 4 is not."""
    place = {seq: i for i, seq in enumerate(records)}
    wrong: list[str] = []
    previous: int | None = None  # the call before, of the records to process
    for i, seq in enumerate(calls):
        if seq not in place:
            wrong.append(f"#{seq} is not to be processed")
            continue
        before = -1 if previous is None else place[previous]
        if place[seq] > before + 1 or (place[seq] <= before and seq not in calls[:i]):
            wrong.append(f"#{seq} after #{previous}")
        previous = seq
    if calls and calls[-1] != records[-1]:
        wrong.append(f"the last call is #{calls[-1]}, not #{records[-1]}")
    return wrong


def test_calls_out_of_order_finds_an_older_record_processed_behind_a_newer_one() -> None:
    assert calls_out_of_order([0, 1, 2, 3], [0, 1, 2, 3]) == []
    assert calls_out_of_order([0, 1, 2, 0, 1, 2, 3], [0, 1, 2, 3]) == []  # read again from an earlier offset
    assert calls_out_of_order([0, 1, 2, 3, 1, 2, 4], [0, 1, 2, 3, 4]) == ["#4 after #2"]  # what issue 46 saw
    assert calls_out_of_order([0, 2, 1], [0, 1, 2]) == ["#2 after #0", "#1 after #2", "the last call is #1, not #2"]
    assert calls_out_of_order([0, 2, 3], [0, 2, 3]) == []  # 1 skipped by an operator
    assert calls_out_of_order([0, 1, 2], [0, 2]) == ["#1 is not to be processed"]


def test_records_processed_before_their_key_was_blocked_are_not_processed_again_behind_later_ones_after_a_sigkill(
    scheduler_and_consumer: SchedulerAndConsumer,
) -> None:
    """The consumer processes CRASHED's first records, fails on CRASH_SEQ (the scheduler makes it
    the key's head) and defers the rest, and is SIGKILLed before it commits any of them; its
    successor reads them all again. Those processed before the key was blocked, and the head,
    are in hand: skipped, never handed to the handler behind the records after them. A key that
    is not blocked, read again, is processed again in its order."""
    same_partition = (f"steady-{i}" for i in itertools.count())
    steady = next(k for k in same_partition if partition_for(k, ORIGIN_PARTITIONS) == partition_for(CRASHED, ORIGIN_PARTITIONS))

    def record(key: str, seq: int, **extra: str) -> tuple[bytes, bytes]:
        return key.encode(), orjson.dumps({"key": key, "seq": seq, **extra})

    crashed = [record(CRASHED, seq, **({"fails": "first:1"} if seq == CRASH_SEQ else {})) for seq in range(CRASHED_RECORDS)]
    # One partition, produced before the consumer starts: fetched together, and the last one's
    # handler waits for RELEASE, so none of them is committed until then.
    produce(
        scheduler_and_consumer.origin,
        [crashed[0], record(steady, 0), *crashed[1:3], record(steady, 1), *crashed[3:], record(steady, 2, waits=RELEASE)],
    )
    [partition] = {r.partition for r in read_all(scheduler_and_consumer.origin)}
    consumer = scheduler_and_consumer.start_consumer()
    try:
        wait_for(
            lambda: (
                (lane := scheduler_and_consumer.lane(CRASHED)) is not None and lane["held"] == CRASHED_RECORDS - CRASH_SEQ - 1
            ),
            timeout=45,
            message=f"{CRASHED}#{CRASH_SEQ} failed, its key's head, with the records after it held behind it",
        )
        processed = scheduler_and_consumer.processed()
        assert seqs_of(processed, CRASHED) == set(range(CRASH_SEQ)) and seqs_of(processed, steady) == {0, 1}
        assert (
            committed_offsets(scheduler_and_consumer.group, scheduler_and_consumer.origin, ORIGIN_PARTITIONS)[partition] is None
        )  # processed, not committed
        consumer.kill()
        (scheduler_and_consumer.log_dir / "control" / RELEASE).touch()
        consumer = scheduler_and_consumer.start_consumer()
        wait_for(
            lambda: (
                seqs_of(scheduler_and_consumer.processed(), CRASHED) == set(range(CRASHED_RECORDS))
                and scheduler_and_consumer.lane(CRASHED) is None
            ),
            timeout=60,
            message=f"every record of {CRASHED} processed and the key free",
        )
        wait_for(
            lambda: 2 in seqs_of(scheduler_and_consumer.processed(), steady),
            timeout=30,
            message=f"{steady}'s last record processed",
        )
    finally:
        consumer.kill()

    processed = scheduler_and_consumer.processed()
    calls = {key: [seq for k, seq, _ in processed if k == key] for key in (CRASHED, steady)}
    assert calls_out_of_order(calls[CRASHED], list(range(CRASHED_RECORDS))) == []
    assert calls_out_of_order(calls[steady], [0, 1, 2]) == []
    # The records of the blocked key read again were skipped, the head's included (it was
    # redelivered, and processed on its second attempt); the free key's were processed again.
    assert calls[CRASHED] == list(range(CRASHED_RECORDS))
    assert [a for k, s, a in processed if (k, s) == (CRASHED, CRASH_SEQ)] == [1]
    assert calls[steady] == [0, 1, 0, 1, 2]
