"""Reads never wait for one instance: while a key's owner is SIGKILLed or restarting, every
program's tally is still answered, exactly, by any other instance from the freshest copy of
its partition, and each answer says which copy (``X-Statefleet-Source``) and how far behind
its changelog (``X-Statefleet-Lag-Records``)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.e2e.tallies.test_tallies_e2e import all_tallies, assert_tallies_settle
from tests.support.accounts import generate
from tests.support.kafka import produce
from tests.support.services import ServiceProcess, wait_for
from tools import web

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SOURCE = "x-statefleet-source"
LAG = "x-statefleet-lag-records"


def read_tally(http: httpx.Client, proc: ServiceProcess, program: str, **params: Any) -> httpx.Response:
    return http.get(f"{proc.url}/tallies/{quote(program, safe='')}", params=params)


def standbys_in_place(procs: list[ServiceProcess]) -> bool:
    """Every changelog partition has a standby copy on some instance (the assignment after the
    last join gave them out)."""
    standby: set[tuple[str, int]] = set()
    for proc in procs:
        body = web.get(proc.url + "/instance", timeout=5).json()
        if not body["ready"] or body["rebalancing"]:
            return False
        standby |= {(t, p) for t, parts in body["standby"].items() if t.endswith("memberships-changelog") for p in parts}
    return len(standby) == 8


class Reader:
    """Reads every program's tally without pause from the given instances, in turn, and keeps
    every answer that was not exactly right (status, body and headers)."""

    def __init__(self, procs: list[ServiceProcess], expected: dict[str, dict[str, Any]]) -> None:
        self.procs = procs
        self.expected = expected
        self.failed: list[str] = []
        self.sources: Counter[str] = Counter()
        self.answered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=10) as http:
            while not self._stop.is_set():
                for n, (program, tally) in enumerate(self.expected.items()):
                    proc = self.procs[n % len(self.procs)]
                    try:
                        resp = read_tally(http, proc, program)
                    except httpx.HTTPError as exc:
                        self.failed.append(f"{proc.url} {program}: {exc!r}")
                        continue
                    self.answered += 1
                    if resp.status_code != 200 or resp.json() != tally:
                        self.failed.append(f"{proc.url} {program}: {resp.status_code} {resp.text[:200]} {dict(resp.headers)}")
                    elif (
                        resp.headers.get(SOURCE) not in ("active", "standby", "restoring")
                        or not resp.headers.get(LAG, "").isdigit()
                    ):
                        self.failed.append(f"{proc.url} {program}: headers {dict(resp.headers)}")
                    else:
                        self.sources[resp.headers[SOURCE]] += 1

    def __enter__(self) -> Reader:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.fixture(params=[{}])
def fleet_env(request: pytest.FixtureRequest) -> dict[str, str]:
    env: dict[str, str] = request.param
    return env


@pytest.fixture
def settled_fleet(
    start_tallies: Any, tally_topics: dict[str, str], fleet_env: dict[str, str]
) -> tuple[dict[str, ServiceProcess], dict[str, Any]]:
    history = generate(programs=40, accounts_per_program=12, seed=17, logins_per_program=4)
    procs = {n: start_tallies(n, **fleet_env) for n in ("a", "b", "c")}
    produce(tally_topics["events"], history.events)
    produce(tally_topics["logins"], history.logins)
    assert_tallies_settle(procs["b"], history.expected)
    wait_for(lambda: standbys_in_place(list(procs.values())), timeout=60, message="a standby of every partition")
    return procs, history.expected


#: The dead owner's partitions stay unassigned (no peer watch, the default 45 s session timeout),
#: so the reads of them are answered from copies the whole time. Under exactly_once each
#: changelog ends with a commit marker, which an up-to-date copy must not count as lag.
@pytest.mark.parametrize(
    "fleet_env",
    [{"STATEFLEET_PEER_WATCH": "false"}, {"STATEFLEET_PEER_WATCH": "false", "STATEFLEET_PROCESSING_GUARANTEE": "exactly_once"}],
    indirect=True,
    ids=["at_least_once", "exactly_once"],
)
def test_owner_sigkilled_every_key_answered_from_a_copy(settled_fleet: tuple[dict[str, ServiceProcess], dict[str, Any]]) -> None:
    procs, expected = settled_fleet
    with httpx.Client(timeout=10) as http:
        owners = {p: read_tally(http, procs["b"], p).headers["x-statefleet-served-by"] for p in expected}
        victim = procs["a"]
        owned_by_victim = [p for p, url in owners.items() if url == victim.url]
        assert owned_by_victim, "instance a owns no program: the test would not test failover"
        for program in expected:  # the owner's own answers say they are the active copy, up to date
            resp = read_tally(http, procs[next(n for n, pr in procs.items() if pr.url == owners[program])], program)
            assert (resp.headers[SOURCE], resp.headers[LAG]) == ("active", "0")

        victim.kill()
        survivors = [procs["b"], procs["c"]]
        with Reader(survivors, expected) as reader:
            wait_for(lambda: reader.answered >= 4 * len(expected), timeout=60, message="four rounds of reads")
        assert not reader.failed, f"{len(reader.failed)} reads failed: {reader.failed[:5]}"
        assert reader.sources["standby"] > 0, f"no answer came from a copy: {reader.sources}"

        for program in owned_by_victim:  # an up-to-date copy satisfies max_lag=0
            for proc in survivors:
                resp = read_tally(http, proc, program, max_lag=0)
                assert resp.status_code == 200, resp.text
                assert resp.json() == expected[program]
                assert (resp.headers[SOURCE], resp.headers[LAG]) == ("standby", "0")
        for proc in survivors:  # lists gather the dead owner's partitions from their copies
            assert all_tallies(proc, limit=100) == expected
            listed = http.get(proc.url + "/tallies", params={"limit": 1000})
            assert (listed.headers[SOURCE], listed.headers[LAG]) == ("standby", "0")
        bad = read_tally(http, procs["b"], owned_by_victim[0], max_lag=-1)
        assert bad.status_code == 422 and bad.json()["error"] == "invalid_request"


def test_rolling_restart_fails_no_read(
    settled_fleet: tuple[dict[str, ServiceProcess], dict[str, Any]], start_tallies: Any, fleet_env: dict[str, str]
) -> None:
    procs, expected = settled_fleet
    for name in ("a", "b", "c"):
        others = [proc for n, proc in procs.items() if n != name]
        with Reader(others, expected) as reader:
            procs[name].stop()  # SIGTERM: the running batch finishes and commits
            procs[name] = start_tallies(name, **fleet_env)
            target = reader.answered + len(expected)
            wait_for(lambda t=target: reader.answered >= t, timeout=60, message="a round after the restart")
        assert not reader.failed, f"restarting {name}: {len(reader.failed)} reads failed: {reader.failed[:5]}"
    assert_tallies_settle(procs["a"], expected)


def test_scale_out_from_two_to_three_fails_no_read(start_tallies: Any, tally_topics: dict[str, str]) -> None:
    history = generate(programs=40, accounts_per_program=12, seed=23, logins_per_program=4)
    procs = [start_tallies(n) for n in ("a", "b")]
    produce(tally_topics["events"], history.events)
    produce(tally_topics["logins"], history.logins)
    assert_tallies_settle(procs[0], history.expected)
    with Reader(procs, history.expected) as reader:
        newcomer = start_tallies("c")  # joins: partitions move to it while the others are read
        wait_for(lambda: standbys_in_place([*procs, newcomer]), timeout=60, message="the group to settle with c")
        target = reader.answered + 2 * len(history.expected)
        wait_for(lambda: reader.answered >= target, timeout=60, message="two rounds after the join")
    assert not reader.failed, f"{len(reader.failed)} reads failed: {reader.failed[:5]}"
    assert all_tallies(newcomer, limit=100) == history.expected
