"""Failover at the default session timeout (45 s): three tallies instances share the input as
it arrives, and one of them is SIGKILLed, stopped for 20 s (SIGSTOP), or restarted with
SIGTERM. The peer watch (``shared/engine/_membership.py``) has the coordinator drop a dead
member at once, so its partitions are processed again within seconds; a stopped member
loses nothing and counts nothing twice, whether or not it is removed; and a member that
announced its restart is not removed at all. Every case ends with exact tallies."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import threading
import time
from typing import Any

import httpx
import orjson
import pytest
from aiokafka.protocol.group import LeaveGroupRequest

from services.tallies.state import SEPARATOR, decode_membership
from shared.engine import partition_for
from shared.engine._admin import _Admin
from shared.engine._membership import member_url
from tests.e2e.tallies.test_tallies_e2e import all_tallies, assert_tallies_settle, latest_published
from tests.support.accounts import History, event, generate
from tests.support.kafka import BOOTSTRAP, produce, read_all
from tests.support.services import ServiceProcess, wait_for
from tools import web

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: Small fetches, so that many batches run; the session timeout stays at its default (45 s).
FLEET_ENV = {"STATEFLEET_CONSUMER_MAX_POLL_RECORDS": "300"}
PARTITIONS = 8
#: The SIGKILLed instance's partitions must be processed again well before the session timeout.
FAILOVER_LIMIT_S = 15.0
STALL_S = 20.0
REMOVED = "removed its member"


def metric(proc: ServiceProcess, name: str) -> float:
    text = web.get(proc.url + "/metrics", timeout=5).text
    m = re.search(rf'^{name}\{{service="tallies"\}} ([0-9.e+]+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def remove_member(group: str, url: str) -> int:
    """What a peer does for a gone one: the group's members with ``url`` removed by member id."""

    async def run() -> int:
        admin = _Admin(bootstrap_servers=BOOTSTRAP)
        await admin.start()
        try:
            node = await admin.find_coordinator(group)
            [described] = await admin.describe_consumer_groups([group], group_coordinator_id=node)
            ids = [m[0] for g in described.groups for m in g[5] if member_url(m[3]) == url]
            for member_id in ids:
                response = await admin.send_to_broker(LeaveGroupRequest(group, member_id), node)
                assert response.error_code == 0
            return len(ids)
        finally:
            await admin.close()

    return asyncio.run(run())


def membership_rows_gone_back(changelog: str) -> list[tuple[int, int, bytes, int, int]]:
    """The membership rows of ``changelog`` whose version is older than that of an earlier row of
    the same key, as (partition, offset, key, version, newest version before it)."""
    newest: dict[tuple[int, bytes], int] = {}
    gone_back = []
    for record in read_all(changelog):
        if record.key is None or record.value is None or record.key.startswith(SEPARATOR):
            continue  # a deletion, or an engine row (next offsets)
        version = decode_membership(record.value).version
        before = newest.get((record.partition, record.key), -1)
        if version < before:
            gone_back.append((record.partition, record.offset, record.key, version, before))
        newest[(record.partition, record.key)] = max(before, version)
    return gone_back


def process_state(pid: int) -> str:
    """The process's state letter from /proc (``T``: stopped by a signal)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def instance_view(proc: ServiceProcess) -> dict[str, Any]:
    body: dict[str, Any] = web.get(proc.url + "/instance", timeout=5).raise_for_status().json()
    return body


def start_fleet(start_tallies: Any, events_topic: str, env: dict[str, dict[str, str]] | None = None) -> dict[str, ServiceProcess]:
    """Three instances, once each holds a share of the input and all agree on who is in the group
    (``env``: more variables per instance name)."""
    fleet = {name: start_tallies(name, **FLEET_ENV, **(env or {}).get(name, {})) for name in ("a", "b", "c")}
    urls = sorted(p.url for p in fleet.values())

    def settled() -> bool:
        views = [instance_view(p) for p in fleet.values()]
        owned = [set(v["active"].get(events_topic, [])) for v in views]
        return (
            all(v["peers"] == urls and not v["rebalancing"] and v["ready"] for v in views)
            and all(owned)
            and set().union(*owned) == set(range(PARTITIONS))
        )

    wait_for(settled, timeout=90, interval=0.5, message="three instances to share the input")
    return fleet


class Feeder(threading.Thread):
    """The history's records in chunks, a few a second, as input keeps arriving in production."""

    def __init__(self, history: History, topics: dict[str, str], chunk: int = 300, pause_s: float = 0.3) -> None:
        super().__init__(daemon=True)
        stream = [("events", k, v) for k, v in history.events] + [("logins", k, v) for k, v in history.logins]
        stream.sort(key=lambda r: hash(r[1]) % 7)  # logins among the events; each account's events keep their order
        self.stream, self.topics, self.chunk, self.pause_s = stream, topics, chunk, pause_s
        self.sent = 0  # records sent so far

    def run(self) -> None:
        for n in range(0, len(self.stream), self.chunk):
            part = self.stream[n : n + self.chunk]
            for kind in ("events", "logins"):
                records = [(k, v) for t, k, v in part if t == kind]
                if records:
                    produce(self.topics[kind], records)
            self.sent = n + len(part)
            time.sleep(self.pause_s)

    def wait_under_way(self, chunks: int = 6) -> None:
        """Until ``chunks`` chunks are sent (about two seconds of input): what comes next lands mid-stream."""
        wanted = min(chunks * self.chunk, len(self.stream))
        wait_for(lambda: self.sent >= wanted, timeout=60, interval=0.05, message=f"{chunks} chunks of input sent")


class Prober(threading.Thread):
    """Reads the history's programs without pause from ``procs`` while input flows, and keeps every
    read that was not answered (an error status other than 404, or no answer at all): the values
    move as input arrives, so only that each read is answered is checked here."""

    def __init__(self, procs: list[ServiceProcess], programs: list[str]) -> None:
        super().__init__(daemon=True)
        self.procs, self.programs = procs, programs
        self.failed: list[str] = []
        self.answered = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=10) as http:
            n = 0
            while not self.stopping.is_set():
                proc, program = self.procs[n % len(self.procs)], self.programs[n % len(self.programs)]
                n += 1
                try:
                    got = http.get(f"{proc.url}/tallies/{program}")
                except httpx.HTTPError as exc:
                    self.failed.append(f"{proc.url} {program}: {exc!r}")
                    continue
                if got.status_code not in (200, 404):  # 404: no account of it has arrived yet
                    self.failed.append(f"{proc.url} {program}: {got.status_code} {got.text[:200]}")
                else:
                    self.answered += 1

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


def history_for_feeding() -> History:
    return generate(programs=30, accounts_per_program=120, seed=23, logins_per_program=20)


class Markers:
    """Marker events for a program and accounts that only ``partitions`` carry, at both hops
    (account events by account, the tally by program): a tally for it can only come from them."""

    def __init__(self, partitions: set[int], events_topic: str) -> None:
        self.program = next(p for n in range(10_000) if partition_for(p := f"marker-{n}", PARTITIONS) in partitions)
        self.accounts = (a for n in range(100_000) if partition_for(a := f"marker-acct-{n}", PARTITIONS) in partitions)
        self.events_topic = events_topic
        self.sent = 0

    def processed_again_after(self, since: float, reader: ServiceProcess, limit_s: float, logs: str) -> float:
        """Seconds from ``since`` until ``reader`` answers the marker program's tally with a count,
        sending a marker every 0.1 s meanwhile; fails past ``limit_s``."""

        def answered() -> float | None:
            elapsed = time.monotonic() - since
            assert elapsed < limit_s, f"the partitions were not processed again within {limit_s}s; logs:\n{logs}"
            if self.sent <= elapsed * 10:  # a new marker event every 0.1 s
                account = next(self.accounts)
                produce(self.events_topic, [(account, orjson.dumps(event(account, self.program, "AccountCreated", 1)))])
                self.sent += 1
            try:
                got = web.get(f"{reader.url}/tallies/{self.program}", timeout=1)
            except httpx.HTTPError:
                return None
            if got.status_code == 200 and got.json()["numberActive"] >= 1:
                return time.monotonic() - since
            return None

        return float(wait_for(answered, timeout=limit_s + 5, interval=0.02, message="the marker program's tally"))

    def expected(self) -> dict[str, dict[str, Any]]:
        return {self.program: {"program_id": self.program, "numberActive": self.sent, "numberInactive": 0, "lastLogin": None}}


def test_a_killed_instances_partitions_are_processed_again_within_seconds(
    start_tallies: Any, tally_topics: dict[str, str]
) -> None:
    history = history_for_feeding()
    fleet = start_fleet(start_tallies, tally_topics["events"])
    victim, survivors = fleet["c"], [fleet["a"], fleet["b"]]
    markers = Markers(set(instance_view(victim)["active"][tally_topics["events"]]), tally_topics["events"])

    feeder = Feeder(history, tally_topics)
    feeder.start()
    feeder.wait_under_way()  # the kill lands mid-stream
    victim.kill()
    killed_at = time.monotonic()
    first_processed_s = markers.processed_again_after(
        killed_at, survivors[0], FAILOVER_LIMIT_S, f"{survivors[0].log_tail()}\n{survivors[1].log_tail()}"
    )
    print(f"\nfailover: the killed instance's partitions processed again {first_processed_s:.2f}s after SIGKILL")

    feeder.join(120)
    assert not feeder.is_alive()
    expected = {**history.expected, **markers.expected()}
    assert_tallies_settle(survivors[0], expected)
    assert all_tallies(survivors[1], limit=100) == expected
    wait_for(
        lambda: latest_published(tally_topics["tallies"]) == expected,
        timeout=60,
        message="program-tallies to hold the exact tallies",
    )
    # The survivor with the lower URL removed the victim's member; the other one did not need to.
    removals = [p.log_path.read_text(errors="replace").count(REMOVED) for p in survivors]
    assert sum(removals) >= 1 and max(removals) == 1, removals  # a backup acts only if the first has not
    assert sum(metric(p, "statefleet_peer_failovers_total") for p in survivors) == sum(removals)
    print(f"failover: members removed per survivor {removals}")


#: The restart grace of the scale-in test: shorter than the default (20 s) to keep the test short.
SCALE_IN_GRACE_S = 4.0


def test_a_stopped_instance_that_does_not_come_back_is_removed_after_the_restart_grace(
    start_tallies: Any, tally_topics: dict[str, str]
) -> None:
    """Scale-in: an instance stopped with SIGTERM announces a restart, and its peers leave its
    member alone for the restart grace; when it has not come back by then, its partitions move to
    the survivors, long before the 45 s session timeout would have moved them."""
    history = history_for_feeding()
    grace = {"STATEFLEET_RESTART_GRACE_S": str(SCALE_IN_GRACE_S)}
    fleet = start_fleet(start_tallies, tally_topics["events"], env={name: grace for name in ("a", "b", "c")})
    leaving, survivors = fleet["c"], [fleet["a"], fleet["b"]]
    markers = Markers(set(instance_view(leaving)["active"][tally_topics["events"]]), tally_topics["events"])
    feeder = Feeder(history, tally_topics)
    feeder.start()
    feeder.wait_under_way()
    stopped_at = time.monotonic()
    leaving.stop()
    assert "peers this instance is restarting" in leaving.log_path.read_text(errors="replace")
    processed_s = markers.processed_again_after(
        stopped_at, survivors[0], SCALE_IN_GRACE_S + FAILOVER_LIMIT_S, f"{survivors[0].log_tail()}\n{survivors[1].log_tail()}"
    )
    print(
        f"\nscale-in: the stopped instance's partitions processed again {processed_s:.2f}s after SIGTERM "
        f"(restart grace {SCALE_IN_GRACE_S:g}s)"
    )
    assert processed_s >= SCALE_IN_GRACE_S - 0.5  # spared for the grace, as a restart would be

    feeder.join(120)
    assert not feeder.is_alive()
    expected = {**history.expected, **markers.expected()}
    assert_tallies_settle(survivors[0], expected)
    assert all_tallies(survivors[1], limit=100) == expected
    removals = [p.log_path.read_text(errors="replace").count(REMOVED) for p in survivors]
    assert sum(removals) >= 1 and max(removals) == 1, removals
    assert sum(metric(p, "statefleet_peer_restarts_announced_total") for p in survivors) == 2


@pytest.mark.parametrize(
    "removed,mid_commit",
    [
        (False, False),
        # Removed while stopped: it rejoins and restores what the others wrote meanwhile, right as
        # the reads below begin. Until its recovery is done it answers no list as the owner, its
        # in-memory counts answer nothing, and its copy is as fresh as its least restored table
        # (a tally reads memberships and last-logins); then it must be ready again.
        (True, False),
        # Stopped (by itself, STATEFLEET_STOP_AT) in the middle of a batch's commit, its outputs
        # acknowledged and its rows not yet sent to the changelog, then removed: the next owner
        # takes the partition over and writes the same rows and more; the stopped batch's rows,
        # computed before, must not land after those (a restore of the changelog, here when the
        # partition is handed back, would take them as the latest).
        (True, True),
    ],
    ids=["kept", "removed-while-stopped", "removed-mid-commit"],
)
def test_an_instance_stopped_for_20s_loses_nothing_and_counts_nothing_twice(
    start_tallies: Any, tally_topics: dict[str, str], prefix: str, removed: bool, mid_commit: bool
) -> None:
    """Stopped, the instance still accepts connections (the kernel does), so its peers do not
    count it gone and its member stays. The other cases remove the member while it is stopped,
    as a peer that judged it gone would: it comes back fenced, with batches it fetched (or was
    committing) before the stop, writes none of them (``BatchConsumer``: no batch from a member
    the group may have dropped), rejoins, restores what the others wrote meanwhile, and answers
    from up-to-date state only."""
    history = history_for_feeding()
    stop_env = {"b": {"STATEFLEET_STOP_AT": "tallies.by-program:sent:2"}} if mid_commit else None
    fleet = start_fleet(start_tallies, tally_topics["events"], env=stop_env)
    stalled = fleet["b"]
    assert stalled.proc is not None
    feeder = Feeder(history, tally_topics, pause_s=0.6)  # input keeps flowing through the stall (~15 s)
    feeder.start()
    # Queries go on through the stall, to the two others: a read the stopped owner would answer
    # is answered from a copy once the owner has not answered in time.
    prober = Prober([fleet["a"], fleet["c"]], sorted(history.expected))
    prober.start()
    if mid_commit:
        pid = stalled.proc.pid
        wait_for(
            lambda: process_state(pid) == "T",
            timeout=30,
            interval=0.05,
            message="the instance to stop itself in the middle of a commit",
        )
    else:
        feeder.wait_under_way(3)
        stalled.proc.send_signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        if removed:
            assert remove_member(f"{prefix}statefleet-tallies", stalled.url) == 1
        # The stall itself: the process does nothing meanwhile, by design.
        time.sleep(max(0.0, STALL_S - (time.monotonic() - stopped_at)))
    finally:
        stalled.proc.send_signal(signal.SIGCONT)
    feeder.join(120)
    assert not feeder.is_alive()
    prober.stop()
    assert not prober.failed, f"{len(prober.failed)} of {prober.answered + len(prober.failed)} reads failed: {prober.failed[:5]}"
    assert prober.answered > 0

    expected = history.expected
    for proc in fleet.values():
        assert_tallies_settle(proc, expected)
    wait_for(
        lambda: latest_published(tally_topics["tallies"]) == expected,
        timeout=60,
        message="program-tallies to hold the exact tallies",
    )
    # A row of a batch cut off by the stop, sent after the next owner's rows, would show as a
    # membership going back to an older version: a restore (of any instance) would take it.
    assert not membership_rows_gone_back(f"{prefix}statefleet-tallies-memberships-changelog")
    removals = sum(p.log_path.read_text(errors="replace").count(REMOVED) for p in fleet.values())
    assert removals == 0  # a stopped process is slow, not gone: its peers never remove it
    # Reads above may be answered from copies: the stopped instance must also be back at work,
    # its recovery done and its partitions processed again.
    assert_all_ready(fleet)
    print(
        f"\nstall ({'removed by the test' if removed else 'kept'}{', mid-commit' if mid_commit else ''}): "
        f"exact after {STALL_S:.0f}s stopped"
    )


def assert_all_ready(fleet: dict[str, ServiceProcess], timeout: float = 60) -> None:
    """Every instance ready (its table recovery done, no rebalance under way); otherwise the
    ones that are not write their threads' and tasks' stacks to their logs (SIGUSR1)."""

    def ready(proc: ServiceProcess) -> bool:
        view = instance_view(proc)
        return bool(view["ready"]) and not view["rebalancing"]

    def unready() -> list[ServiceProcess]:
        return [p for p in fleet.values() if not ready(p)]

    with contextlib.suppress(TimeoutError):  # the stuck ones are named below, with their stacks
        wait_for(lambda: not unready(), timeout=timeout, interval=0.5, message="every instance ready")
    stuck = unready()
    for proc in stuck:
        assert proc.proc is not None
        proc.proc.send_signal(signal.SIGUSR1)
    for proc in stuck:
        # The dump ends with the consumer thread's tasks (print_thread_loop_tasks, shared/engine/_faust.py).
        with contextlib.suppress(TimeoutError):  # the assertion below shows the log as it is
            wait_for(lambda p=proc: "consumer thread" in p.log_tail(200_000).lower(), timeout=10, message="the stacks")
    assert not stuck, "not ready again:\n" + "\n".join(p.log_tail(20_000) for p in stuck)


def rebalances(proc: ServiceProcess) -> int:
    """Assignments this instance has received (one per rebalance it took part in)."""
    return proc.log_path.read_text(errors="replace").count("Executing _on_partitions_assigned")


def test_a_batch_longer_than_the_session_timeout_starves_no_heartbeat(start_tallies: Any, tally_topics: dict[str, str]) -> None:
    """One instance's event loop is kept busy on the CPU for 12 s in a batch, with a session
    timeout of 6 s: its heartbeats go on from the consumer thread, its peers' probes connect
    (slow, not gone), so no member is removed and no rebalance happens; tallies stay exact."""
    history = history_for_feeding()
    short = {"STATEFLEET_SESSION_TIMEOUT_S": "6"}
    fleet = start_fleet(
        start_tallies, tally_topics["events"], env={"a": short, "b": {**short, "STATEFLEET_BLOCK_AT": "20:12"}, "c": short}
    )
    feeder = Feeder(history, tally_topics, pause_s=0.6)
    feeder.start()
    blocked = fleet["b"]
    wait_for(
        lambda: "blocking this worker's event loop" in blocked.log_path.read_text(errors="replace"),
        timeout=30,
        interval=0.1,
        message="the batch that blocks",
    )
    before = {name: rebalances(p) for name, p in fleet.items()}
    wait_for(
        lambda: "STATEFLEET_BLOCK_AT: unblocked" in blocked.log_path.read_text(errors="replace"),
        timeout=60,
        interval=0.2,
        message="the blocked batch to end",
    )
    feeder.join(120)
    assert not feeder.is_alive()

    expected = history.expected
    for proc in fleet.values():
        assert_tallies_settle(proc, expected)
    assert {name: rebalances(p) for name, p in fleet.items()} == before
    for proc in fleet.values():
        assert REMOVED not in proc.log_path.read_text(errors="replace")


def test_a_restart_on_sigterm_removes_no_member(start_tallies: Any, tally_topics: dict[str, str]) -> None:
    history = history_for_feeding()
    fleet = start_fleet(start_tallies, tally_topics["events"])
    survivors = [fleet["a"], fleet["b"]]
    feeder = Feeder(history, tally_topics)
    feeder.start()
    feeder.wait_under_way()
    stopped_at = time.monotonic()
    fleet["c"].stop()
    assert "peers this instance is restarting" in fleet["c"].log_path.read_text(errors="replace")
    # The survivors keep probing its closed port meanwhile: past the time a peer counts as gone.
    wait_for(lambda: time.monotonic() - stopped_at > 3.0, timeout=10, message="the restart to wait past the gone time")
    fleet["c"] = start_tallies("c", **FLEET_ENV)
    print(f"\nrestart: back and ready {time.monotonic() - stopped_at:.1f}s after SIGTERM")
    feeder.join(120)
    assert not feeder.is_alive()

    expected = history.expected
    for proc in fleet.values():
        assert_tallies_settle(proc, expected)
    for proc in survivors:
        assert metric(proc, "statefleet_peer_restarts_announced_total") == 1
        assert metric(proc, "statefleet_peer_failovers_total") == 0
        assert REMOVED not in proc.log_path.read_text(errors="replace")
