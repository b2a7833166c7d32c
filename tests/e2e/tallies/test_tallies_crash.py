"""SIGKILL the tallies worker mid-stream four times (twice keeping its local state, twice
losing it so that it restores from the changelogs alone, the last time included), with
input on all three input topics arriving in bursts (one before each restart, so every
restart finds a backlog while it recovers, and one more once the last restart is up), and
check that the tallies are then exactly the ones the generated histories imply, over
HTTP and on ``program-tallies``. With exactly_once, ``program-tallies`` read committed must
also hold no tally twice in a row for a program: neither the kills nor the restarts after
them repeat one.

A record the worker skipped would show as an account change that never counts (an
undercount that never heals); a restore from a changelog behind the committed input
offsets, as lost updates; a record applied twice could only come from a broken version
check. Exact tallies rule out all three. (Whether a given run meets a skip depends on
timing; when it does, the worker logs "the stream skipped …" and reads the records back.)
"""

from __future__ import annotations

import contextlib
import re
import shutil
import time
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest

from shared import dead_letters as dl
from tests.e2e.tallies.test_tallies_e2e import all_tallies, latest_published, repeated_tallies, wait_all_input_consumed
from tests.support.accounts import generate
from tests.support.kafka import create_topics, produce
from tests.support.services import ServiceProcess, wait_for
from tools import web

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROGRAMS = 40
ACCOUNTS_PER_PROGRAM = 500
LOGINS_PER_PROGRAM = 50
#: Before each kill: wait for the restarted worker to apply this many input records
#: (None: kill one second after it is ready), and whether to delete its data dir.
KILLS = ((3000, False), (3000, True), (None, False), (3000, True))


def applied(proc: ServiceProcess, service: str = "tallies") -> int:
    """Input records the second hop of this worker process (of engine ``service``) has applied so far."""
    text = web.get(proc.url + "/metrics", timeout=5).text
    m = re.search(rf'statefleet_messages_processed_total\{{service="{service}",stream="by-program"\}} ([0-9.e+]+)', text)
    return int(float(m.group(1))) if m else 0


def via_retry(key: str) -> bool:
    """About one account (and login) in eight arrives through the service's retry topic."""
    return zlib.crc32(key.encode()) % 8 == 0


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_sigkill_mid_stream_keeps_exact_tallies(
    start_tallies: Any, tally_topics: dict[str, str], service_env: dict[str, str], prefix: str, guarantee: str
) -> None:
    history = generate(PROGRAMS, ACCOUNTS_PER_PROGRAM, seed=17, logins_per_program=LOGINS_PER_PROGRAM)
    retry_topic = f"{prefix}retry-tallies"
    create_topics([retry_topic])
    # One stream of input: the events in their generated order (each account's events in
    # version order), with logins spread among them. An account's events all take the
    # same route, so each account's order holds on whichever topic carries them.
    stream: list[tuple[str, str, bytes]] = []
    step = max(1, len(history.events) // len(history.logins))
    logins = iter(history.logins)
    for i, (key, value) in enumerate(history.events):
        stream.append(("events", key, value))
        if i % step == 0 and (login := next(logins, None)) is not None:
            stream.append(("logins", *login))
    stream.extend(("logins", key, value) for key, value in logins)

    def send(records: list[tuple[str, str, bytes]]) -> None:
        for kind in ("events", "logins"):
            direct = [(k, v) for t, k, v in records if t == kind and not via_retry(k)]
            retried = [(k, v) for t, k, v in records if t == kind and via_retry(k)]
            if direct:
                produce(tally_topics[kind], direct)
            if retried:
                headers = [(dl.ORIGINAL_TOPIC, tally_topics[kind].encode()), (dl.ATTEMPT, b"1")]
                produce(retry_topic, retried, headers=headers)

    # One burst at the start, one after each kill (sent before the restart), and a last one
    # once the last restart is up: input keeps coming, as it does in production.
    parts = len(KILLS) + 2
    bursts = [stream[i * len(stream) // parts : (i + 1) * len(stream) // parts] for i in range(parts)]
    proc: ServiceProcess = start_tallies("k", STATEFLEET_PROCESSING_GUARANTEE=guarantee)
    send(bursts[0])
    for (progress, wipe), burst in zip(KILLS, bursts[1:-1], strict=True):
        if progress is not None:
            wait_for(lambda p=proc, n=progress: applied(p) >= n, timeout=90, interval=0.05, message="the worker to apply input")
        else:  # a kill at a moment, not after a step: a second on, whether it applied anything or not
            time.sleep(1.0)
        proc.kill()
        if wipe:
            shutil.rmtree(Path(service_env["STATEFLEET_DATA_DIR"]) / "tallies" / "k")
        send(burst)
        proc = start_tallies("k", STATEFLEET_PROCESSING_GUARANTEE=guarantee)
    send(bursts[-1])

    expected = history.expected

    def wrong() -> dict[str, tuple[Any, Any]]:
        got = all_tallies(proc, limit=100)
        return {p: (got.get(p), expected.get(p)) for p in set(got) | set(expected) if got.get(p) != expected.get(p)}

    with contextlib.suppress(TimeoutError):  # the assertion below says what is still wrong
        wait_for(lambda: not wrong(), timeout=120, interval=0.5, message="every tally right")
    wait_all_input_consumed(proc)  # anything still to come would be a violation
    diff = wrong()
    missing = {
        field: sum(e[field] - (g or {}).get(field, 0) for g, e in diff.values() if e)
        for field in ("numberActive", "numberInactive")
    }
    assert not diff, (
        f"{len(diff)} of {len(expected)} tallies wrong (expected minus actual: {missing}): {sorted(diff.items())[:3]}"
    )
    wait_for(
        lambda: latest_published(tally_topics["tallies"]) == expected,
        timeout=60,
        message="program-tallies to hold the exact tallies",
    )
    if guarantee == "exactly_once":
        assert latest_published(tally_topics["tallies"], isolation_level="read_committed") == expected
        repeats = repeated_tallies(tally_topics["tallies"])
        assert repeats == [], f"{len(repeats)} tallies published twice in a row, e.g. {repeats[:3]}"
    deletes = sum(1 for _, v in history.events if orjson.loads(v)["type"] == "AccountDeleted")
    print(
        f"{len(stream)} input records ({len(history.events)} events, {deletes} deletes, "
        f"{len(history.logins)} logins), {sum(via_retry(k) for _, k, _ in stream)} via {retry_topic}"
    )
