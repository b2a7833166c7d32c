"""The peers benchmark keeps working: statefleet, Kafka Streams and Quix Streams each turn
a small workload (with replayed account events) into exactly the expected tallies on the
real broker, and the check that says so can say otherwise."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import orjson
import pytest

from services.tallies.domain import Login, fold_program, parse_account_change, parse_login
from shared.accounts import AccountChange
from tests.support.kafka import create_topics, produce
from tools.bench.common import REPO
from tools.bench.peers import runner
from tools.bench.peers.workload import STATUS_AFTER, build, reference_tallies

SMOKE = runner.Options(events=3000, programs=20, rounds=1, replay_fraction=0.1, timeout_s=120.0)


def test_reference_agrees_with_the_service_fold() -> None:
    workload = build(4000, 25, replay_fraction=0.1)
    changes: dict[str, list[AccountChange]] = {}
    logins: dict[str, list[Login]] = {}
    for _, raw in workload.events:
        change = parse_account_change(orjson.loads(raw))
        changes.setdefault(change.program_id, []).append(change)
    for _, raw in workload.logins:
        login = parse_login(orjson.loads(raw))
        logins.setdefault(login.program_id, []).append(login)
    folded = {p: fold_program(p, changes.get(p, []), logins.get(p, [])).to_json() for p in set(changes) | set(logins)}
    assert folded == workload.expected


def test_replays_change_the_answer_of_a_fold_without_the_version_check() -> None:
    """The smoke workload's replays are not idle: applying every event as it comes, with no
    version check, gives other tallies, so a peer without the check fails the smoke run."""
    workload = build(SMOKE.events, SMOKE.programs, SMOKE.replay_fraction)
    assert workload.replays == 300
    naive: dict[str, str] = {}
    for _, raw in workload.events:
        event = orjson.loads(raw)
        naive[event["account_id"]] = STATUS_AFTER.get(event["type"], naive.get(event["account_id"], "unknown"))
    naive_active = sum(status == "active" for status in naive.values())
    assert naive_active != sum(t["numberActive"] for t in workload.expected.values())
    assert reference_tallies(workload.events, workload.logins) == workload.expected


def test_the_output_check_reports_a_wrong_and_a_foreign_tally(kafka_bootstrap: str, prefix: str) -> None:
    expected = {
        f"program-{i}": {"program_id": f"program-{i}", "numberActive": i, "numberInactive": 0, "lastLogin": None}
        for i in range(5)
    }
    topic = f"{prefix}program-tallies"
    create_topics([topic], partitions=runner.PARTITIONS)
    records = [(p.encode(), orjson.dumps(t)) for p, t in expected.items()]
    records[2] = (b"program-2", orjson.dumps({**expected["program-2"], "numberActive": 99}))
    produce(topic, records)
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watch = asyncio.run(runner.watch_output(topic, expected, idle, time.monotonic() + 3))
        assert watch.done_at is None
        assert watch.exact == 4
        assert watch.wrong[0][0] == "program-2"
        produce(topic, [(b"program-2", orjson.dumps(expected["program-2"]))])
        assert asyncio.run(runner.watch_output(topic, expected, idle, time.monotonic() + 10)).done_at is not None
        produce(topic, [(b"program-x", orjson.dumps(expected["program-0"]))])
        watch = asyncio.run(runner.watch_output(topic, expected, idle, time.monotonic() + 3))
        assert watch.done_at is None and watch.wrong[-1][0] == "program-x"
    finally:
        idle.kill()
        idle.wait()
        asyncio.run(runner.delete_topics(prefix))


@pytest.fixture(scope="module")
def peers_built() -> None:
    # `make test` builds them before pytest starts; this covers a pytest run on its own.
    subprocess.run(["make", "-s", "bench-peers-build"], cwd=REPO, check=True)


@pytest.mark.slow
def test_every_system_turns_the_same_input_into_exact_tallies(
    kafka_bootstrap: str, peers_built: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STATEFLEET_KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    runs = runner.run_all(SMOKE)
    by_system = {run.system: run for run in runs}
    assert sorted(by_system) == sorted(runner.SYSTEMS)
    for run in runs:
        assert run.records == SMOKE.events
        assert run.seconds is not None and run.seconds > 0, run
        assert run.peak_rss_bytes > 10 * 2**20, run
        if run.system != "aiokafka":
            assert (run.exact, run.programs) == (20, 20), run
    text = runner.table(runner.summarize(runs, SMOKE.systems))
    assert text.count("| 20/20 |") == 3, text
