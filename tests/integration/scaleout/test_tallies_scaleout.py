"""Three tallies instances on the real broker: any key from any instance, complete
lists across pages, and correct answers (or 503, never stale data) when one dies."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.accounts import generate
from tests.support.kafka import create_topics, produce
from tests.support.services import ServiceProcess, free_port, wait_for
from tools import web

pytestmark = pytest.mark.integration

SERVED_BY = "x-statefleet-served-by"


@pytest.fixture
def start_instances(service_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[[int], list[ServiceProcess]]]:
    procs: list[ServiceProcess] = []

    def start(n: int) -> list[ServiceProcess]:
        for i in range(n):
            env = {
                **service_env,
                "STATEFLEET_INSTANCE_ID": f"i{i}",
                "STATEFLEET_STANDBY_REPLICAS": "1",
                "STATEFLEET_SESSION_TIMEOUT_S": "10",
            }
            procs.append(ServiceProcess("tallies", env, tmp_path / f"tallies-i{i}.log", port=free_port()).start())
        for p in procs:
            p.wait_ready(120)
        return procs

    yield start
    for proc in procs:
        proc.kill()


def listing(url: str, limit: int) -> list[dict[str, Any]] | None:
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": limit, **({"cursor": cursor} if cursor else {})}
        resp = web.get(url + "/tallies", params=params, timeout=10)
        if resp.status_code == 503:
            return None
        body = resp.raise_for_status().json()
        items += body["items"]
        cursor = body["next_cursor"]
        if cursor is None:
            return items


def answers_everywhere(procs: list[ServiceProcess], expected: dict[str, dict[str, Any]]) -> bool:
    for proc in procs:
        for program, tally in expected.items():
            resp = web.get(f"{proc.url}/tallies/{program}", timeout=10)
            if resp.status_code != 200 or resp.json() != tally:
                return False
    return True


@pytest.fixture
def topics(prefix: str) -> dict[str, str]:
    names = {"events": f"{prefix}account-events", "logins": f"{prefix}logins"}
    create_topics([*names.values(), f"{prefix}program-tallies"], compacted=[f"{prefix}program-tallies"])
    return names


def test_any_instance_answers_any_key_and_survives_a_kill(start_instances, topics) -> None:  # type: ignore[no-untyped-def]
    history = generate(programs=16, accounts_per_program=10, seed=21)
    procs = start_instances(3)
    produce(topics["events"], history.events)
    produce(topics["logins"], history.logins)
    wait_for(lambda: answers_everywhere(procs, history.expected), timeout=90, message="every key from every instance")

    # Forwarding is visible: some answers come from another instance than the one asked.
    served = {web.get(f"{procs[0].url}/tallies/{p}", timeout=10).headers[SERVED_BY] for p in history.expected}
    assert len(served) > 1, f"all 16 programs served by one instance: {served}"

    for proc in procs:
        for limit in (3, 7, 100):
            items = listing(proc.url, limit)
            assert items is not None
            ids = [t["program_id"] for t in items]
            assert ids == sorted(set(ids)), "pages overlap or are out of order"
            assert {t["program_id"]: t for t in items} == history.expected

    # Kill one instance under load; more input keeps arriving while the group settles.
    more = generate(programs=16, accounts_per_program=12, seed=22)
    renamed = [(k.replace("program-", "more-"), v.replace(b"program-", b"more-")) for k, v in more.events]
    procs[1].kill()
    produce(topics["events"], renamed)
    expected = {
        **history.expected,
        **{
            p.replace("program-", "more-"): {**t, "program_id": p.replace("program-", "more-"), "lastLogin": None}
            for p, t in more.expected.items()
        },
    }
    survivors = [procs[0], procs[2]]

    # While the group rebalances, an answer is either correct or a 503 — never wrong.
    def correct_or_unavailable() -> bool:
        for proc in survivors:
            for program in list(history.expected)[:6]:
                resp = web.get(f"{proc.url}/tallies/{program}", timeout=10)
                assert resp.status_code in (200, 503), resp.text
                if resp.status_code == 200:
                    assert resp.json() == history.expected[program]
                else:
                    assert resp.headers.get("retry-after")
        return answers_everywhere(survivors, expected)

    wait_for(correct_or_unavailable, timeout=120, interval=0.5, message="survivors to answer every key")
    for proc in survivors:
        items = listing(proc.url, 5)
        assert items is not None and {t["program_id"]: t for t in items} == expected
