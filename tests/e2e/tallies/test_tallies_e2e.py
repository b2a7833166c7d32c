"""The tally service end to end on the real broker: exact tallies over HTTP and on the
compacted topic, dead letters for bad input, and no double counting after replays,
restarts, crashes or losing the local state."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from shared import dead_letters as dl
from tests.support.accounts import event, generate
from tests.support.kafka import BOOTSTRAP, produce, read_all, unconsumed
from tests.support.services import ServiceProcess, wait_for
from tools import web

pytestmark = pytest.mark.e2e


def all_tallies(proc: ServiceProcess, limit: int = 7, key: str = "program_id") -> dict[str, dict[str, Any]]:
    """Every tally through the paginated list (by its ``key`` field), checking pages do not overlap."""
    out: dict[str, dict[str, Any]] = {}
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        body = web.get(proc.url + "/tallies", params=params, timeout=5).raise_for_status().json()
        for item in body["items"]:
            assert item[key] not in out, "a program appeared on two pages"
            out[item[key]] = item
        cursor = body["next_cursor"]
        if cursor is None:
            return out


def wait_tallies(proc: ServiceProcess, expected: dict[str, dict[str, Any]], timeout: float = 60) -> None:
    wait_for(lambda: all_tallies(proc) == expected, timeout=timeout, message="tallies to match")


def wait_all_input_consumed(proc: ServiceProcess, timeout: float = 60) -> None:
    """Until the tallies' consumer group has committed every record of its inputs and of its
    internal topic: each one has been applied (a batch's offsets are committed after its rows)."""
    prefix = proc.env["STATEFLEET_TOPIC_PREFIX"]
    inputs = [f"{prefix}{name}" for name in ("account-events", "logins", "retry-tallies", "statefleet-tallies-by-program")]
    wait_for(
        lambda: unconsumed(f"{prefix}statefleet-tallies", inputs) == 0, timeout=timeout, message="every input record consumed"
    )


def assert_tallies_settle(proc: ServiceProcess, expected: dict[str, dict[str, Any]], timeout: float = 120) -> None:
    """Every tally over HTTP (from ``proc``, gathered from every owner) equals ``expected`` within
    ``timeout``, and still does a moment later."""

    def wrong() -> dict[str, tuple[Any, Any]]:
        try:
            got = all_tallies(proc, limit=100)
        except Exception as exc:  # a list gathered while partitions move may be refused (503)
            return {"(no answer)": (repr(exc), None)}
        return {p: (got.get(p), expected.get(p)) for p in set(got) | set(expected) if got.get(p) != expected.get(p)}

    with contextlib.suppress(TimeoutError):  # the assertion below says what is still wrong
        wait_for(lambda: not wrong(), timeout=timeout, interval=0.5, message="every tally right")
    wait_all_input_consumed(proc)  # anything still to come would be a violation
    diff = wrong()
    assert not diff, f"{len(diff)} of {len(expected)} tallies wrong: {sorted(diff.items())[:3]}"


def latest_published(topic: str, isolation_level: str = "read_uncommitted") -> dict[str, dict[str, Any]]:
    latest: dict[str, dict[str, Any]] = {}
    for rec in read_all(topic, isolation_level=isolation_level):
        assert rec.key is not None and rec.value is not None
        latest[rec.key.decode()] = orjson.loads(rec.value)
    return latest


def repeated_tallies(topic: str) -> list[tuple[str, dict[str, Any]]]:
    """The records of ``topic``, read committed, that repeat their program's previous record
    (each program's records are in one partition, read in order): none, under exactly_once."""
    last: dict[str, dict[str, Any]] = {}
    repeats: list[tuple[str, dict[str, Any]]] = []
    for rec in read_all(topic, isolation_level="read_committed"):
        assert rec.key is not None and rec.value is not None
        program, value = rec.key.decode(), orjson.loads(rec.value)
        if last.get(program) == value:
            repeats.append((program, value))
        last[program] = value
    return repeats


def test_exact_tallies_api_topic_and_dead_letters(start_tallies, tally_topics) -> None:  # type: ignore[no-untyped-def]
    history = generate(programs=12, accounts_per_program=15, seed=3)
    proc = start_tallies()
    produce(tally_topics["events"], history.events)
    produce(tally_topics["logins"], history.logins)
    produce(tally_topics["events"], [("bad-1", b"{not json"), ("bad-2", orjson.dumps({"type": "AccountCreated"}))])
    produce(tally_topics["logins"], [("bad-3", orjson.dumps({"account_id": "x", "program_id": "P", "ts": "soon"}))])

    wait_tallies(proc, history.expected)
    for program, tally in list(history.expected.items())[:3]:
        got = web.get(f"{proc.url}/tallies/{program}", timeout=5)
        assert got.status_code == 200 and got.json() == tally
    missing = web.get(f"{proc.url}/tallies/no-such-program", timeout=5)
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    assert web.get(f"{proc.url}/tallies", params={"limit": 0}, timeout=5).status_code == 422
    for cursor in ("%%", "bm90LWEtY3Vyc29y"):  # not base64; base64 of text this API never made
        bad = web.get(f"{proc.url}/tallies", params={"cursor": cursor}, timeout=5)
        assert bad.status_code == 400 and bad.json()["error"] == "invalid_cursor"

    wait_for(
        lambda: latest_published(tally_topics["tallies"]) == history.expected,
        timeout=30,
        message="program-tallies to hold the latest tallies",
    )

    letters = wait_for(
        lambda: (r := read_all(tally_topics["dead_letters"])) and len(r) >= 3 and r, timeout=30, message="three dead letters"
    )
    assert len(letters) == 3
    by_key = {r.key: dict(r.headers) for r in letters}
    assert set(by_key) == {b"bad-1", b"bad-2", b"bad-3"}
    assert by_key[b"bad-1"][dl.ERROR_CLASS] == b"DecodeError"
    assert by_key[b"bad-2"][dl.ERROR_CLASS] == b"InvalidInput"
    assert b"'ts' must be an integer" in by_key[b"bad-3"][dl.ERROR_MESSAGE]
    assert by_key[b"bad-3"][dl.ORIGINAL_TOPIC] == tally_topics["logins"].encode()
    assert by_key[b"bad-1"][dl.ATTEMPT] == b"1"
    assert web.get(proc.url + "/healthz", timeout=5).status_code == 200


def test_a_malformed_account_event_is_dead_lettered_and_never_counted(start_tallies, tally_topics) -> None:  # type: ignore[no-untyped-def]
    """The AccountCreated events the validator's readers dead-letter (no occurred_at; a
    300-character account id) are dead letters here too, and count in no tally."""
    program = "prog-malformed-events"
    untimed = {k: v for k, v in event("bad-untimed", program, "AccountCreated", 1).items() if k != "occurred_at"}
    produce(
        tally_topics["events"],
        [
            ("bad-untimed", orjson.dumps(untimed)),
            ("bad-long", orjson.dumps(event("L" * 300, program, "AccountCreated", 1))),
            ("fine", orjson.dumps(event("fine", program, "AccountCreated", 1))),
        ],
    )
    proc = start_tallies()

    def letters() -> dict[bytes | None, dict[str, bytes]] | None:
        found = {r.key: dict(r.headers) for r in read_all(tally_topics["dead_letters"])}
        return found if len(found) >= 2 else None

    by_key = wait_for(letters, timeout=30, message="two dead letters")
    assert set(by_key) == {b"bad-untimed", b"bad-long"}
    for headers in by_key.values():
        assert headers[dl.ERROR_CLASS] == b"InvalidInput"  # parked at once by the retry scheduler
        assert headers[dl.ORIGINAL_TOPIC] == tally_topics["events"].encode()
    assert b"'occurred_at' must be an integer" in by_key[b"bad-untimed"][dl.ERROR_MESSAGE]
    assert b"'account_id' is longer than 256 characters" in by_key[b"bad-long"][dl.ERROR_MESSAGE]
    # Both are read (and refused) already: the tally counts the well-formed account alone.
    wait_tallies(proc, {program: {"program_id": program, "numberActive": 1, "numberInactive": 0, "lastLogin": None}})


def test_program_ids_with_slashes_and_url_characters_read_back(start_tallies, tally_topics) -> None:  # type: ignore[no-untyped-def]
    programs = ["a/b", "/lead", "trail/", "x/y/z", "pct%2Fenc", "q?x=1#frag", "line\nbreak"]
    proc = start_tallies()
    produce(
        tally_topics["events"],
        [(f"acct-{i}", orjson.dumps(event(f"acct-{i}", program, "AccountCreated", 1))) for i, program in enumerate(programs)],
    )
    wait_for(lambda: len(all_tallies(proc)) == len(programs), timeout=30, message="every tally")
    for program in programs:
        for safe in ("/", ""):  # raw slashes and %2F
            got = web.get(f"{proc.url}/tallies/{quote(program, safe=safe)}", timeout=5)
            assert got.status_code == 200, (program, got.text)
            assert got.json() == {"program_id": program, "numberActive": 1, "numberInactive": 0, "lastLogin": None}


@pytest.mark.parametrize("bulk_restore", [True, False], ids=["bulk-restore", "faust-recovery"])
def test_replayed_input_and_restore_from_changelog_keep_tallies(  # type: ignore[no-untyped-def]
    start_tallies, tally_topics, tmp_path: Path, bulk_restore: bool
) -> None:
    history = generate(programs=6, accounts_per_program=20, seed=5)
    proc = start_tallies()
    produce(tally_topics["events"], history.events)
    produce(tally_topics["logins"], history.logins)
    wait_tallies(proc, history.expected)

    # The whole input again, as a producer retry or an upstream replay would send it.
    produce(tally_topics["events"], history.events)
    produce(tally_topics["logins"], history.logins)
    marker = ("marker-acct", orjson.dumps(event("marker-acct", "marker-program", "AccountCreated", 1)))
    produce(tally_topics["events"], [marker])
    expected = {
        **history.expected,
        "marker-program": {"program_id": "marker-program", "numberActive": 1, "numberInactive": 0, "lastLogin": None},
    }
    wait_tallies(proc, expected)

    # Restart with the data dir kept. The bulk restore takes any lag at all (min lag 1)
    # and logs what it reads: at most a short tail (a record the two handlers' concurrent
    # writes left past a partition's persisted offset), never the changelog.
    proc.stop()
    prefix = tally_topics["events"].removesuffix("account-events")

    def changelog_records() -> int:
        tables = ("memberships", "last-logins", "published-tallies")
        return sum(len(read_all(f"{prefix}statefleet-tallies-{t}-changelog")) for t in tables)

    warm = start_tallies(STATEFLEET_BULK_RESTORE="true", STATEFLEET_BULK_RESTORE_MIN_LAG="1")
    assert all_tallies(warm) == expected
    assert changelog_records() > 100 and records_restored_in_bulk(warm) <= 8

    # Lose the local RocksDB state entirely: the changelog must bring back the same tallies.
    warm.stop()
    shutil.rmtree(tmp_path / "data")
    # What the changelogs hold now is what a bulk restore reads (the restored instance's own
    # batches add next-offset rows after it: its publish ticks, which publish nothing here).
    logged = changelog_records()
    restored = start_tallies(STATEFLEET_BULK_RESTORE=str(bulk_restore).lower(), STATEFLEET_BULK_RESTORE_MIN_LAG="1")
    assert all_tallies(restored) == expected
    assert records_restored_in_bulk(restored) == (logged if bulk_restore else 0)


def records_restored_in_bulk(proc: ServiceProcess) -> int:
    """Changelog records an instance's bulk restores read, from its log."""
    return sum(int(n) for n in re.findall(r"bulk restore: (\d+) records into", proc.log_path.read_text()))


def test_sigkill_mid_stream_never_double_counts(start_tallies, tally_topics) -> None:  # type: ignore[no-untyped-def]
    history = generate(programs=10, accounts_per_program=300, seed=11)
    proc = start_tallies(STATEFLEET_CONSUMER_MAX_POLL_RECORDS="200")
    produce(tally_topics["logins"], history.logins)
    produce(tally_topics["events"], history.events)

    def some_applied() -> bool:
        body = web.get(proc.url + "/tallies", params={"limit": 100}, timeout=5).json()
        applied: int = sum(t["numberActive"] + t["numberInactive"] for t in body["items"])
        return applied > 0

    wait_for(some_applied, timeout=30, message="processing to start")
    proc.kill()
    restarted = start_tallies()
    wait_tallies(restarted, history.expected, timeout=90)


def test_input_skipped_at_the_end_of_a_partition_is_read_again(start_tallies, tally_topics) -> None:  # type: ignore[no-untyped-def]
    """The group's committed offset is moved past the last record of a partition while the
    worker is down, so Faust's stream starts after it and no later record shows the hole:
    the worker still finds it (its next-offset row is behind the consumer) and reads it."""
    history = generate(programs=4, accounts_per_program=5, seed=9)
    settings = {"STATEFLEET_STATIC_MEMBERSHIP": "false", "STATEFLEET_TRAILING_HOLE_CHECK_S": "0.5"}
    proc = start_tallies(**settings)
    produce(tally_topics["events"], history.events)
    produce(tally_topics["logins"], history.logins)
    wait_tallies(proc, history.expected)
    proc.stop()  # without static membership a clean stop leaves the group empty

    prefix = tally_topics["events"].removesuffix("account-events")
    marker = orjson.dumps(event("late-acct", "late-program", "AccountCreated", 1))

    async def skip_past(topic: str) -> tuple[int, int]:
        producer = AIOKafkaProducer(bootstrap_servers=BOOTSTRAP)
        await producer.start()
        try:
            sent = await (await producer.send(topic, marker, key=b"late-acct"))
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=BOOTSTRAP, group_id=f"{prefix}statefleet-tallies", enable_auto_commit=False)
        await consumer.start()
        try:
            tp = TopicPartition(topic, sent.partition)
            consumer.assign([tp])
            await consumer.commit({tp: sent.offset + 1})
        finally:
            await consumer.stop()
        return sent.partition, sent.offset

    partition, offset = asyncio.run(skip_past(tally_topics["events"]))
    restarted = start_tallies(**settings)
    expected = {
        **history.expected,
        "late-program": {"program_id": "late-program", "numberActive": 1, "numberInactive": 0, "lastLogin": None},
    }
    wait_tallies(restarted, expected, timeout=30)
    assert f"skipped {tally_topics['events']}[{partition}] offsets {offset}..{offset}" in restarted.log_path.read_text()


def input_lag(proc: ServiceProcess, topics: list[str]) -> dict[str, int | None]:
    """``GET /instance``'s input lag, per topic of ``topics`` (None where not known)."""
    lag = web.get(proc.url + "/instance", timeout=5).json()["lag"]
    return {topic: lag[topic]["total"] if topic in lag else None for topic in topics}


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_the_input_lag_is_zero_once_every_record_is_applied(start_tallies, tally_topics, guarantee: str) -> None:  # type: ignore[no-untyped-def]
    history = generate(programs=6, accounts_per_program=20, seed=5)
    proc = start_tallies(STATEFLEET_PROCESSING_GUARANTEE=guarantee, STATEFLEET_CONSUMER_MAX_POLL_RECORDS="50")
    inputs = [tally_topics["events"], tally_topics["logins"]]
    produce(tally_topics["events"], history.events)
    produce(tally_topics["logins"], history.logins)
    wait_tallies(proc, history.expected)
    # Every record applied: nothing behind any input partition (the lag is measured against the
    # high watermark of the consumer's last fetch, which an idle fetch keeps up to date).
    wait_for(lambda: input_lag(proc, inputs) == dict.fromkeys(inputs, 0), timeout=20, message="no input lag")
