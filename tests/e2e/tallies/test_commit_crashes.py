"""SIGKILL the tallies worker at each step of a batch's commit, not just anywhere.

The engine commits a batch in three steps (its records sent and acknowledged, then the
changelog rows, then the local tables with the input's next offset); ``STATEFLEET_CRASH_AT``
kills the worker with SIGKILL right after the n-th batch reaches a step. For each step the
worker is killed twice while it works through a backlog (once keeping its local state,
once losing it, so it restores from the changelogs alone), then runs to the end: the
tallies must be exactly the ones the generated histories imply. A batch whose commit was
cut short and that was then skipped would show as an undercount; one applied twice, as
an overcount.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.tallies.test_tallies_e2e import all_tallies, latest_published
from tests.support.accounts import generate
from tests.support.kafka import produce
from tests.support.services import ServiceProcess, free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def run_until_killed(env: dict[str, str], log: Path, port: int, crash_at: str) -> None:
    proc = ServiceProcess("tallies", {**env, "STATEFLEET_CRASH_AT": crash_at}, log, port=port).start()
    assert proc.proc is not None
    try:
        code = proc.proc.wait(120)
    finally:
        proc.kill()
    assert code == -9, f"the worker was to kill itself at {crash_at} (exit {code}); log:\n{proc.log_tail()}"
    assert f"STATEFLEET_CRASH_AT={crash_at.split(':')[0]}: killing this worker now" in log.read_text(errors="replace")


@pytest.mark.parametrize("step", ["handled", "sent", "logged"])
def test_sigkill_at_each_commit_step_keeps_exact_tallies(
    step: str, tally_topics: dict[str, str], service_env: dict[str, str], tmp_path: Path,
) -> None:
    history = generate(programs=30, accounts_per_program=120, seed=29, logins_per_program=20)
    half = len(history.events) // 2
    produce(tally_topics["events"], history.events[:half])
    produce(tally_topics["logins"], history.logins)
    env = {**service_env, "STATEFLEET_INSTANCE_ID": "c", "STATEFLEET_CONSUMER_MAX_POLL_RECORDS": "200"}
    port = free_port()
    # Small fetches make many batches; the 3rd batch to reach the step dies there.
    run_until_killed(env, tmp_path / "tallies-1.log", port, f"{step}:3")
    produce(tally_topics["events"], history.events[half:])
    run_until_killed(env, tmp_path / "tallies-2.log", port, f"{step}:5")
    shutil.rmtree(Path(service_env["STATEFLEET_DATA_DIR"]) / "tallies" / "c")
    run_until_killed(env, tmp_path / "tallies-3.log", port, f"{step}:4")

    proc = ServiceProcess("tallies", env, tmp_path / "tallies-4.log", port=port).start().wait_ready()
    try:
        expected = history.expected

        def wrong() -> dict[str, tuple[Any, Any]]:
            got = all_tallies(proc, limit=100)
            return {p: (got.get(p), expected.get(p)) for p in set(got) | set(expected) if got.get(p) != expected.get(p)}

        deadline = time.monotonic() + 90
        while wrong() and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1.0)  # anything still to come would be a violation; give it a moment to show
        diff = wrong()
        assert not diff, f"{len(diff)} of {len(expected)} tallies wrong after crashes at {step!r}: {sorted(diff.items())[:3]}"
        wait_for(lambda: latest_published(tally_topics["tallies"]) == expected, timeout=60,
                 message="program-tallies to hold the exact tallies")
    finally:
        proc.kill()
