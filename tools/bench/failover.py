"""Failover benchmark on the tallies service: how soon a SIGKILLed instance's partitions are
processed again, at the default session timeout (45 s), with the peer watch on.

    python -m tools.bench failover --accounts 100000 --rounds 3

Method: ``--accounts`` accounts (one AccountCreated each, over ``--programs`` programs)
are loaded; three instances (1 standby replica each, the default) share them. Each round
kills one instance (SIGKILL; the instances take turns) and from that moment produces a
marker event every 20 ms for a program and accounts that hash to the victim's input
partitions at both hops (account events by account, tallies by program), so only the
victim's partitions can count them. Two figures per round: the time from the kill until
a survivor answers that program's tally with a count (the first record processed on the
victim's partitions), polled every 20 ms; and until every program the victim owned has
answered 200 from a survivor (16 concurrent clients, polling only programs not yet
answered; a figure is late by up to one pass over them). The victim is
then started again (data dir kept) and the group left to settle before the next round.
``--no-watch`` runs the same with ``STATEFLEET_PEER_WATCH=false`` (the session timeout
decides; one round is enough to see it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
from aiokafka import AIOKafkaProducer

from shared.engine import partition_for
from shared.engine.clients import TopicSpec, ensure_topics_async
from shared.settings import Settings
from tools import web
from tools.bench import results
from tools.bench.common import Instance, bootstrap, machine, produce_bulk
from tools.bench.scaleout import REPO, accounts, wait_loaded, wait_served

PARTITIONS = 8
MARKER_EVERY_S = 0.02
GIVE_UP_S = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def view(url: str) -> dict[str, Any]:
    body: dict[str, Any] = web.get(url + "/instance", timeout=5).raise_for_status().json()
    return body


def wait_settled(instances: list[Instance], topic: str, timeout_s: float = 180) -> None:
    """Until every instance is ready, names all of them as peers and together they own every input partition."""
    urls = sorted(i.url for i in instances)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            views = [view(i.url) for i in instances]
        except httpx.HTTPError:
            views = []
        owned = [set(v["active"].get(topic, [])) for v in views]
        if (
            views
            and all(v["peers"] == urls and v["ready"] and not v["rebalancing"] for v in views)
            and all(owned)
            and set().union(*owned) == set(range(PARTITIONS))
        ):
            return
        time.sleep(0.5)
    raise TimeoutError("the three instances did not settle")


async def first_processed(
    producer: AIOKafkaProducer, topic: str, survivor: str, program: str, partitions: set[int], round_no: int, killed_at: float
) -> float:
    """Seconds from ``killed_at`` until ``survivor`` answers ``program``'s tally with a count, while a
    marker event for it goes to the victim's partitions every :data:`MARKER_EVERY_S`."""
    candidates = (a for n in range(1_000_000) if partition_for(a := f"marker-{round_no}-{n}", PARTITIONS) in partitions)
    next_marker = killed_at
    async with httpx.AsyncClient(timeout=1) as http:
        while time.perf_counter() - killed_at < GIVE_UP_S:
            now = time.perf_counter()
            if now >= next_marker:
                account = next(candidates)
                event = {
                    "event_id": account,
                    "command_id": account,
                    "type": "AccountCreated",
                    "account_id": account,
                    "program_id": program,
                    "version": 1,
                    "occurred_at": 1,
                    "data": {},
                }
                await producer.send_and_wait(topic, orjson.dumps(event), key=account.encode())
                next_marker = now + MARKER_EVERY_S
            try:
                got = await http.get(f"{survivor}/tallies/{program}")
                if got.status_code == 200 and got.json()["numberActive"] >= 1:
                    return time.perf_counter() - killed_at
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.02)
    raise TimeoutError(f"the victim's partitions were not processed again within {GIVE_UP_S:.0f}s")


async def run_round(
    instances: list[Instance], victim: Instance, topic: str, programs: list[str], round_no: int
) -> tuple[float, float]:
    survivor = next(i for i in instances if i is not victim)
    mine = set(view(victim.url)["active"][topic])
    program = next(p for n in range(100_000) if partition_for(p := f"marker-program-{round_no}-{n}", PARTITIONS) in mine)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap(), acks=1, linger_ms=0)
    await producer.start()
    try:
        victim.stop(kill=True)
        killed_at = time.perf_counter()
        processed = await first_processed(producer, topic, survivor.url, program, mine, round_no, killed_at)
    finally:
        await producer.stop()
    # Only the victim's programs were unanswerable; polling the others would time the poller.
    await wait_served(survivor.url, [p for p in programs if partition_for(p, PARTITIONS) in mine])
    return processed, time.perf_counter() - killed_at


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench failover")
    parser.add_argument("--accounts", type=int, default=100_000)
    parser.add_argument("--programs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-watch", action="store_true", help="STATEFLEET_PEER_WATCH=false (the session timeout decides)")
    parser.add_argument("--keep", type=Path, default=None, help="run in this dir and keep the instances' logs and data")
    parser.add_argument("--gone-after", type=float, default=None, help="STATEFLEET_PEER_GONE_AFTER_S (default: the setting's)")
    parser.add_argument(
        "--refused-gone-after", type=float, default=None, help="STATEFLEET_PEER_REFUSED_GONE_AFTER_S (default: the setting's)"
    )
    args, _ = parser.parse_known_args(argv)
    prefix = f"bench{uuid.uuid4().hex[:8]}."
    watch = "false" if args.no_watch else "true"
    print(
        f"[bench] machine: {machine()}; prefix {prefix}; {args.accounts:,} accounts, 3 instances, "
        f"peer watch {watch}"
        f"{'' if args.no_watch else f' (gone after {args.gone_after or Settings().peer_gone_after_s:g}s, '}"
        f"{'' if args.no_watch else f'refused {args.refused_gone_after or Settings().peer_refused_gone_after_s:g}s)'}, "
        "default session timeout",
        flush=True,
    )
    settings = Settings(kafka_bootstrap_servers=bootstrap(), topic_prefix=prefix)
    topic = f"{prefix}account-events"
    asyncio.run(ensure_topics_async(settings, [TopicSpec(topic, PARTITIONS), TopicSpec(f"{prefix}logins", PARTITIONS)]))
    asyncio.run(produce_bulk(topic, accounts(args.accounts, args.programs)))
    programs = [f"program-{i}" for i in range(args.programs)]
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "STATEFLEET_TOPIC_PREFIX": prefix,
        "STATEFLEET_KAFKA_BOOTSTRAP_SERVERS": bootstrap(),
        "STATEFLEET_LOG_LEVEL": "INFO",
        "STATEFLEET_PEER_WATCH": watch,
    }
    if args.gone_after is not None:
        env["STATEFLEET_PEER_GONE_AFTER_S"] = str(args.gone_after)
    if args.refused_gone_after is not None:
        env["STATEFLEET_PEER_REFUSED_GONE_AFTER_S"] = str(args.refused_gone_after)
    env.pop("STATEFLEET_SESSION_TIMEOUT_S", None)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        instances = [Instance(name, free_port(), root / name, env) for name in "abc"]
        try:
            for instance in instances:
                instance.start()
            for instance in instances:
                instance.wait_ready()
            wait_loaded(instances[0].url, programs, args.accounts)
            wait_settled(instances, topic)
            processed: list[float] = []
            served: list[float] = []
            for round_no in range(args.rounds):
                victim = instances[(round_no + 2) % len(instances)]
                log_sizes = {i.name: (root / f"{i.name}.log").stat().st_size for i in instances}
                first, every = asyncio.run(run_round(instances, victim, topic, programs, round_no))
                processed.append(first)
                served.append(every)
                print(
                    f"[bench] round {round_no + 1}: killed {victim.name}; its partitions processed again "
                    f"{first:.2f}s after SIGKILL; each of its programs answered {every:.2f}s after",
                    flush=True,
                )
                for other in instances:
                    if other is not victim and (line := last_removal(root / f"{other.name}.log", log_sizes[other.name])):
                        print(f"[bench]   {other.name}: {line}", flush=True)
                victim.start()
                victim.wait_ready()
                wait_settled(instances, topic)
            print(
                f"[bench] failover over {args.rounds} rounds: first record on the victim's partitions "
                f"median {statistics.median(processed):.2f}s (min {min(processed):.2f}, max {max(processed):.2f}); "
                f"each of the victim's programs answered median {statistics.median(served):.2f}s",
                flush=True,
            )
            rounds = f"median of {args.rounds} rounds, {args.accounts:,} accounts"
            results.record("failover.first_record", statistics.median(processed), "s", note=rounds)
            results.record("failover.programs_answered", statistics.median(served), "s", note=rounds)
        finally:
            for instance in instances:
                if instance.proc is not None and instance.proc.poll() is None:
                    instance.stop(kill=True)


def last_removal(log: Path, since: int) -> str | None:
    """The last 'peer … gone after N failed probes over Ss; removed its member …' a survivor logged
    after byte ``since`` of its log."""
    found = None
    with open(log, "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    for line in text.splitlines():
        if "removed its member" in line:
            found = line.split(": ", 1)[-1]
    return found
