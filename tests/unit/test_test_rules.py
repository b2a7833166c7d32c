"""Rules of the tests themselves, checked over the source of tests/:

- no sleep orders events or waits for something: a test waits on the condition itself, with
  ``tests.support.services.wait_for`` (or ``wait_for_async``), which polls it up to a deadline
  and says what it waited for when that passes. A sleep is kept only where time passing is
  what the test exercises, listed below with the reason;
- every topic prefix comes from ``tests.support.environment`` (``new_topic_prefix``,
  ``owned_topic_prefix`` and the ``prefix`` / ``module_prefix`` fixtures), and every service
  environment from its ``service_environment`` (or the ``service_env`` fixture built on it).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

SLEEP = re.compile(r"\b(?:time|asyncio)\.sleep\(|\bfrom (?:time|asyncio) import .*\bsleep\b")
#: A topic prefix made by hand: random hex in an f-string that ends with the prefix's dot.
HAND_MADE_PREFIX = re.compile(r"(?:uuid\.uuid4\(\)\.hex(?:\[[^]]*\])?|token_hex\([^)]*\))\}\.\"")
#: A service environment made by hand: its topic prefix as a key of a dict literal.
HAND_MADE_ENV = re.compile(r'"STATEFLEET_TOPIC_PREFIX":')

#: Where the one recipe of each lives.
RECIPES = {"support/environment.py"}


@dataclass(frozen=True)
class Allowed:
    """``times`` lines of file ``path`` (under tests/) that read ``line`` (stripped), and why."""

    path: str
    line: str
    why: str
    times: int = 1


#: Sleeps that are the thing tested or the machinery of a wait, not an order of events.
JUSTIFIED_SLEEPS = [
    Allowed("support/services.py", "time.sleep(0.25)", "wait_ready's pause between two looks at /readyz"),
    Allowed("support/services.py", "time.sleep(interval)", "wait_for's pause between two looks"),
    Allowed("support/services.py", "await asyncio.sleep(interval)", "wait_for_async's pause between two looks"),
    Allowed(
        "support/forkserver.py",
        "time.sleep(min(timeout if timeout is not None else 0.1, 0.1))",
        "a forked child's wait(timeout): a child of the fork server, not of the test, polled for its exit",
    ),
    Allowed("support/forkserver.py", "time.sleep(0.05)", "the fork server's start, polled for its socket"),
    Allowed("support/ordered_consumer.py", "await asyncio.sleep(self.work_s)", "the user's handler at work: a paced load"),
    Allowed("unit/support/child_probe.py", "time.sleep(60)", "a child that stays alive until it is killed"),
    Allowed(
        "unit/shared/engine/test_instance_lock.py",
        "time.sleep(float(sys.argv[2]))",
        "a process that holds the lock for a given time",
    ),
    Allowed("unit/shared/engine/test_membership.py", "await asyncio.sleep(5)", "a peer that reads and never answers"),
    Allowed(
        "unit/shared/engine/test_consumer_membership.py",
        "await asyncio.sleep(0.01)",
        "a confirmation's round trip takes time, so that callers overlap",
    ),
    Allowed(
        "unit/tools/test_background.py",
        "pid = background.start_at_lowest_priority("
        """["timeit", "-n1", "-r1", "import time; print('ran'); time.sleep(2)"], log)""",
        "a background build that runs for a while",
    ),
    Allowed(
        "unit/tools/test_kafka_broker.py",
        """child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])""",
        "a stand-in broker process that stays alive until it is killed",
    ),
    Allowed(
        "unit/tools/test_kafka_broker.py",
        """child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])""",
        "stand-in broker nodes that stay alive until they are stopped",
    ),
    Allowed(
        "unit/tools/test_fleet.py",
        """child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])""",
        "a stand-in service process that stays alive until it is killed",
    ),
    Allowed(
        "integration/bench/test_peers.py",
        """idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])""",
        "an idle process whose memory is measured",
    ),
    Allowed(
        "unit/console/test_console.py",
        "await asyncio.sleep(0.05)",
        "a rate is counted over time passing between two polls (the monitor reads the wall clock)",
    ),
    Allowed(
        "e2e/validator/test_fenced_commits.py",
        "await asyncio.sleep(self.every_s)",
        "the fencer's pace: a stale epoch every so often while traffic flows",
    ),
    Allowed("e2e/validator/test_fenced_commits.py", "time.sleep(0.1)", "steady traffic: a paced load"),
    Allowed("e2e/validator/test_rebalance.py", "time.sleep(0.15)", "commands arriving across rebalances: a paced load"),
    Allowed("e2e/validator/test_validator_crash.py", "time.sleep(0.2)", "steady traffic across kills: a paced load"),
    Allowed(
        "e2e/validator/test_validator_api.py",
        "time.sleep(pause_s)",
        "a connection left idle past the client's keep-alive: the idle time is the test",
    ),
    Allowed(
        "e2e/tallies/test_rebalance.py",
        "time.sleep(0.35)  # paces the input, so that it spans the membership changes",
        "input arriving across rebalances: a paced load",
    ),
    Allowed("e2e/tallies/test_failover.py", "time.sleep(self.pause_s)", "the feeder's pace: a paced load"),
    Allowed(
        "e2e/tallies/test_failover.py",
        "time.sleep(max(0.0, STALL_S - (time.monotonic() - stopped_at)))",
        "the stall itself: a process stopped for a given time",
    ),
    Allowed(
        "e2e/tallies/test_tallies_crash.py",
        "time.sleep(1.0)",
        "one kill lands at a moment rather than after a step: the moment is the test",
    ),
    Allowed(
        "e2e/tallies/test_commit_crashes.py",
        """time.sleep(10 * float(env["STATEFLEET_TALLY_PUBLISH_INTERVAL_S"]))  # a republish would be out by now""",
        "that nothing is published again is seen only after the time it would take",
    ),
    Allowed(
        "e2e/retry_scheduler/test_crash.py",
        "time.sleep(random.uniform(0.0, 1.5))",
        "a kill at a random moment: the moment is the test",
    ),
    Allowed(
        "e2e/retry_scheduler/test_commit_crashes.py",
        "time.sleep(DELAY_MS / 1000)  # all due: each commit from here on is a tick's redeliveries",
        "the letters' due time passing on the scheduler's real clock",
    ),
    Allowed(
        "kube/test_chart_in_cluster.py",
        "time.sleep(8)  # a few scrapes, so that rate() and increase() have two samples",
        "Prometheus scrapes on its own interval: time passing is what gives it samples",
    ),
    Allowed("kube/cluster.py", "time.sleep(0.02)", "the reader's pace: reads spread over the time a failure lasts"),
    Allowed("kube/test_chart_in_cluster.py", "time.sleep(2)", "reads before the pod's kill, so the reads span it"),
    Allowed("kube/test_chart_in_cluster.py", "time.sleep(3)", "reads after the pod is back, so the reads span its return"),
    Allowed("kube/test_chart_in_cluster.py", "time.sleep(0.5)", "the watcher's sampling interval of the pods' readiness"),
]


def lines_matching(pattern: re.Pattern[str]) -> Counter[tuple[str, str]]:
    """(path under tests/, stripped line) of every line of tests/ that ``pattern`` finds, counted;
    this file and the recipes' own file left out."""
    found: Counter[tuple[str, str]] = Counter()
    for path in sorted(TESTS.rglob("*.py")):
        name = path.relative_to(TESTS).as_posix()
        if path == Path(__file__).resolve() or name in RECIPES:
            continue
        for line in path.read_text().splitlines():
            if pattern.search(line):
                found[(name, line.strip())] += 1
    return found


def allowed(*lists: list[Allowed]) -> Counter[tuple[str, str]]:
    counted: Counter[tuple[str, str]] = Counter()
    for entry in (e for entries in lists for e in entries):
        counted[(entry.path, entry.line)] += entry.times
    return counted


def test_no_sleep_orders_events_or_waits_for_something() -> None:
    found, listed = lines_matching(SLEEP), allowed(JUSTIFIED_SLEEPS)
    new = found - listed
    assert not new, (
        "a sleep that orders events or waits for something: wait on the condition with "
        "tests.support.services.wait_for instead (or, if time passing is the thing tested, list it "
        f"in JUSTIFIED_SLEEPS with the reason): {sorted(new)}"
    )
    assert not listed - found, f"listed sleeps no longer in tests/: remove them from the lists: {sorted(listed - found)}"


def test_topic_prefixes_and_service_environments_come_from_the_helpers() -> None:
    found = lines_matching(HAND_MADE_PREFIX) + lines_matching(HAND_MADE_ENV)
    assert not found, (
        "a topic prefix or a service environment made by hand: use tests.support.environment "
        f"(new_topic_prefix, owned_topic_prefix, the prefix fixtures, service_environment, settings_env): {sorted(found)}"
    )


def test_the_checks_find_what_they_look_for() -> None:
    """The patterns above, on lines of the kinds they are to find and to leave alone."""
    assert SLEEP.search("        time.sleep(0.5)") and SLEEP.search("await asyncio.sleep(0)")
    assert SLEEP.search("from time import monotonic, sleep")
    assert not SLEEP.search("async def no_sleep(seconds: float) -> None:")
    assert HAND_MADE_PREFIX.search('prefix = f"t{uuid.uuid4().hex[:10]}."')
    assert HAND_MADE_PREFIX.search('"STATEFLEET_TOPIC_PREFIX": f"x{secrets.token_hex(4)}.",')
    assert not HAND_MADE_PREFIX.search('a = f"acct-{uuid.uuid4().hex[:8]}"')
    assert not HAND_MADE_PREFIX.search('log = tmp / f"consumer-{uuid.uuid4().hex[:4]}.log"')
    assert HAND_MADE_ENV.search('        "STATEFLEET_TOPIC_PREFIX": prefix,')
    assert not HAND_MADE_ENV.search('prefix = proc.env["STATEFLEET_TOPIC_PREFIX"]')
