"""SIGKILL the tallies worker at each step of a batch's commit, not just anywhere.

The engine commits a batch in three steps (its records sent and acknowledged, then the
changelog rows, then the local tables with the input's next offset); ``STATEFLEET_CRASH_AT``
kills the worker with SIGKILL right after the n-th batch reaches a step. For each step the
worker is killed twice while it works through a backlog (once keeping its local state,
once losing it, so it restores from the changelogs alone), then runs to the end, and is
killed and restarted once more: the tallies must be exactly the ones the generated
histories imply. A batch whose commit was cut short and that was then skipped would show
as an undercount; one applied twice, as an overcount.

With exactly_once the same runs must also leave the tallies' internal by-program topic,
read committed, holding each account change exactly once: a batch cut short at any step
left nothing visible, and none was committed twice. And ``program-tallies``, read
committed, must hold no tally twice in a row for a program (each is published in the
transaction of the batch that also records it as published, so neither a kill nor the
restart after it repeats one), ending with the exact tallies.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from pathlib import Path

import pytest

from services.tallies.state import PUBLISH_TICK, PackedInputs
from tests.e2e.tallies.test_tallies_e2e import assert_tallies_settle, latest_published, repeated_tallies, wait_all_input_consumed
from tests.support.accounts import generate
from tests.support.kafka import produce, read_all
from tests.support.services import ServiceProcess, free_port, run_until_killed, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
@pytest.mark.parametrize("step", ["handled", "sent", "logged"])
def test_sigkill_at_each_commit_step_keeps_exact_tallies(
    step: str, guarantee: str, tally_topics: dict[str, str], service_env: dict[str, str], tmp_path: Path
) -> None:
    history = generate(programs=30, accounts_per_program=120, seed=29, logins_per_program=20)
    half = len(history.events) // 2
    produce(tally_topics["events"], history.events[:half])
    produce(tally_topics["logins"], history.logins)
    env = {
        **service_env,
        "STATEFLEET_INSTANCE_ID": "c",
        "STATEFLEET_CONSUMER_MAX_POLL_RECORDS": "200",
        "STATEFLEET_PROCESSING_GUARANTEE": guarantee,
    }
    port = free_port()
    # Small fetches make many batches; the 3rd batch to reach the step dies there.
    run_until_killed("tallies", env, tmp_path / "tallies-1.log", port, f"{step}:3")
    produce(tally_topics["events"], history.events[half:])
    run_until_killed("tallies", env, tmp_path / "tallies-2.log", port, f"{step}:5")
    shutil.rmtree(Path(service_env["STATEFLEET_DATA_DIR"]) / "tallies" / "c")
    run_until_killed("tallies", env, tmp_path / "tallies-3.log", port, f"{step}:4")

    proc = ServiceProcess("tallies", env, tmp_path / "tallies-4.log", port=port).start().wait_ready()
    try:
        expected = history.expected
        assert_tallies_settle(proc, expected, timeout=90)
        wait_for(
            lambda: latest_published(tally_topics["tallies"]) == expected,
            timeout=60,
            message="program-tallies to hold the exact tallies",
        )
        # Killed once more with every tally published: the rebuild after the restart compares
        # each program with its published tally, and publishes none of them again.
        proc.kill()
        proc = ServiceProcess("tallies", env, tmp_path / "tallies-5.log", port=port).start().wait_ready()
        time.sleep(10 * float(env["STATEFLEET_TALLY_PUBLISH_INTERVAL_S"]))  # a republish would be out by now
        wait_all_input_consumed(proc)
        assert_tallies_settle(proc, expected, timeout=30)
        if guarantee == "exactly_once":
            prefix = service_env["STATEFLEET_TOPIC_PREFIX"]
            changes = Counter(
                (change.entity, change.version)
                for r in read_all(f"{prefix}statefleet-tallies-by-program", isolation_level="read_committed")
                if r.value != PUBLISH_TICK
                for inputs in PackedInputs.decode(r.value).programs.values()
                for change in inputs.changes
            )
            repeated = {change: n for change, n in changes.items() if n > 1}
            assert repeated == {}, f"{len(repeated)} account changes committed twice, e.g. {list(repeated)[:5]}"
            assert len(changes) == len(history.events), "every account change committed once"
            assert latest_published(tally_topics["tallies"], isolation_level="read_committed") == expected
            repeats = repeated_tallies(tally_topics["tallies"])
            assert repeats == [], f"{len(repeats)} tallies published twice in a row, e.g. {repeats[:3]}"
    finally:
        proc.kill()
