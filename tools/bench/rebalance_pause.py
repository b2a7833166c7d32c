"""Processing pauses on the tallies service while an instance joins: the longest time any
partition goes without processing during a scale-out from 3 to 4, with warm-up copies on
and off.

    python -m tools.bench rebalance_pause --accounts 1000000

Method: for each setting of ``STATEFLEET_WARMUPS`` (on, then off; each with its own topics),
``--accounts`` accounts (one AccountCreated each, over ``--programs`` programs) are loaded
into three instances at default settings (1 standby replica, peer watch on), and the group
is left to settle. Then, for every one of the 8 partitions, a marker event goes out every
:data:`MARKER_EVERY_S` for a new account and a program that both hash to that partition,
so each marker is handled by that partition at both hops. A reader of the memberships
table's changelog (read_committed) notes when each marker's row arrives: its latency is
how long that partition's processing was held up when the marker was sent. After
``--steady-s`` of markers a fourth instance starts, and the markers go on until every
instance is ready, the four own every partition, no warm-up copy is pending, and
``--steady-s`` more have passed. Figures: the worst marker latency of the steady phase
(the baseline, same run) and of the join, per partition and overall, and how many
rebalances the join took (the assignment log lines of the group leader).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from shared.engine import partition_for
from shared.engine.clients import TopicSpec, ensure_topics_async
from shared.settings import Settings
from tools.bench import results
from tools.bench.common import Instance, bootstrap, machine, produce_bulk
from tools.bench.failover import PARTITIONS, free_port, view, wait_settled
from tools.bench.scaleout import REPO, accounts, wait_loaded

MARKER_EVERY_S = 0.05
SEP = b"\x00"


class Markers:
    """Marker events per partition and the moment each one's changelog row arrived."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.events_topic = f"{prefix}account-events"
        self.changelog = f"{prefix}statefleet-tallies-memberships-changelog"
        self.programs = {
            p: next(name for n in range(100_000) if partition_for(name := f"pause-program-{p}-{n}", PARTITIONS) == p)
            for p in range(PARTITIONS)
        }
        self.sent: dict[bytes, tuple[int, float]] = {}
        self.seen: dict[bytes, float] = {}
        self.sending = True
        self._serial = 0

    def _account(self, partition: int) -> str:
        while True:
            self._serial += 1
            account = f"pause-{self._serial}"
            if partition_for(account, PARTITIONS) == partition:
                return account

    async def send(self) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap(), acks=1, linger_ms=0)
        await producer.start()
        try:
            while self.sending:
                started = time.perf_counter()
                for p, program in self.programs.items():
                    account = self._account(p)
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
                    await producer.send(self.events_topic, orjson.dumps(event), key=account.encode())
                    self.sent[program.encode() + SEP + account.encode()] = (p, time.perf_counter())
                await asyncio.sleep(max(0.0, started + MARKER_EVERY_S - time.perf_counter()))
            await producer.flush()
        finally:
            await producer.stop()

    async def read(self, until: asyncio.Event) -> None:
        consumer = AIOKafkaConsumer(
            self.changelog,
            bootstrap_servers=bootstrap(),
            auto_offset_reset="latest",
            isolation_level="read_committed",
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            await consumer.seek_to_end()
            while not until.is_set():
                batches = await consumer.getmany(timeout_ms=50)
                now = time.perf_counter()
                for records in batches.values():
                    for record in records:
                        if record.key in self.sent and record.key not in self.seen:
                            self.seen[record.key] = now
        finally:
            await consumer.stop()

    def worst(self, since: float, until: float) -> tuple[float, dict[int, float], int]:
        """(worst latency, worst per partition, markers not seen) of markers sent in [since, until)."""
        per: dict[int, float] = defaultdict(float)
        missing = 0
        for key, (p, sent_at) in self.sent.items():
            if not since <= sent_at < until:
                continue
            seen = self.seen.get(key)
            if seen is None:
                missing += 1
                continue
            per[p] = max(per[p], seen - sent_at)
        return (max(per.values()) if per else float("nan")), dict(per), missing


def settled_with_warmups_done(instances: list[Instance], topic: str) -> bool:
    try:
        views = [view(i.url) for i in instances]
    except httpx.HTTPError:
        return False
    owned = [set(v["active"].get(topic, [])) for v in views]
    return (
        all(v["ready"] and not v["rebalancing"] and not v.get("warmup") for v in views)
        and all(owned)
        and set().union(*owned) == set(range(PARTITIONS))
    )


GENERATION = re.compile(rb"generation id (\d+)")


def generations(paths: list[Path], offsets: dict[Path, int]) -> int:
    """Distinct group generations the instances' logs show after ``offsets``: one per rebalance."""
    seen: set[bytes] = set()
    for path in paths:
        with open(path, "rb") as f:
            f.seek(offsets.get(path, 0))
            seen.update(m.group(1) for line in f if (m := GENERATION.search(line)))
    return len(seen)


async def run_join(root: Path, warmups: bool, args: argparse.Namespace) -> dict[str, Any]:
    prefix = f"pause{uuid.uuid4().hex[:8]}."
    topic = f"{prefix}account-events"
    settings = Settings(kafka_bootstrap_servers=bootstrap(), topic_prefix=prefix)
    await ensure_topics_async(settings, [TopicSpec(topic, PARTITIONS), TopicSpec(f"{prefix}logins", PARTITIONS)])
    await produce_bulk(topic, accounts(args.accounts, args.programs))
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "STATEFLEET_TOPIC_PREFIX": prefix,
        "STATEFLEET_KAFKA_BOOTSTRAP_SERVERS": bootstrap(),
        "STATEFLEET_LOG_LEVEL": "INFO",
        "STATEFLEET_WARMUPS": "true" if warmups else "false",
    }
    env.pop("STATEFLEET_SESSION_TIMEOUT_S", None)
    folder = root / ("warmups-on" if warmups else "warmups-off")
    folder.mkdir(parents=True, exist_ok=True)
    instances = [Instance(name, free_port(), folder / name, env) for name in "abcd"]
    three, newcomer = instances[:3], instances[3]
    markers = Markers(prefix)
    stop_reading = asyncio.Event()
    try:
        for instance in three:
            instance.start()
        for instance in three:
            await asyncio.to_thread(instance.wait_ready)
        await asyncio.to_thread(wait_loaded, three[0].url, [f"program-{i}" for i in range(args.programs)], args.accounts)
        await asyncio.to_thread(wait_settled, three, topic)
        await asyncio.to_thread(_wait, lambda: settled_with_warmups_done(three, topic), 300)
        reader = asyncio.create_task(markers.read(stop_reading))
        await asyncio.sleep(1.0)  # the reader at the changelog's end before the first marker
        sender = asyncio.create_task(markers.send())
        steady_from = time.perf_counter()
        await asyncio.sleep(args.steady_s)
        logs = [folder / f"{i.name}.log" for i in instances[:3]]
        offsets = {path: path.stat().st_size for path in logs}
        join_from = time.perf_counter()
        newcomer.start()
        print(f"[bench]   warm-ups {'on' if warmups else 'off'}: d started", flush=True)
        await asyncio.to_thread(newcomer.wait_ready)
        await asyncio.to_thread(_wait, lambda: settled_with_warmups_done(instances, topic), 600)
        settled_at = time.perf_counter()
        await asyncio.sleep(args.steady_s)
        join_until = time.perf_counter()
        markers.sending = False
        await sender
        await asyncio.to_thread(_wait, lambda: len(markers.seen) >= len(markers.sent), 60, quietly=True)
        stop_reading.set()
        await reader
        steady_worst, _, steady_missing = markers.worst(steady_from, join_from)
        join_worst, per_partition, join_missing = markers.worst(join_from, join_until)
        rebalances = generations([*logs, folder / "d.log"], offsets)
        return {
            "warmups": warmups,
            "steady_worst_s": steady_worst,
            "join_worst_s": join_worst,
            "per_partition": per_partition,
            "missing": steady_missing + join_missing,
            "settled_s": settled_at - join_from,
            "rebalances": rebalances,
            "markers": len(markers.sent),
        }
    finally:
        markers.sending = False
        stop_reading.set()
        for instance in instances:
            if instance.proc is not None and instance.proc.poll() is None:
                instance.stop(kill=True)


def _wait(condition: Any, timeout_s: float, quietly: bool = False) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.25)
    if not quietly:
        raise TimeoutError("the group did not settle")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench rebalance_pause")
    parser.add_argument("--accounts", type=int, default=1_000_000)
    parser.add_argument("--programs", type=int, default=1000)
    parser.add_argument("--steady-s", type=float, default=5.0)
    parser.add_argument("--only", choices=("on", "off"), default=None, help="run one setting of STATEFLEET_WARMUPS")
    parser.add_argument("--keep", type=Path, default=None, help="run in this dir and keep the instances' logs and data")
    args, _ = parser.parse_known_args(argv)
    print(
        f"[bench] machine: {machine()}; {args.accounts:,} accounts, scale-out 3 -> 4, markers every "
        f"{MARKER_EVERY_S * 1000:.0f} ms on each of {PARTITIONS} partitions; load {_load()}",
        flush=True,
    )
    settings = [True, False] if args.only is None else [args.only == "on"]
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        for warmups in settings:
            result = asyncio.run(run_join(root, warmups, args))
            per = ", ".join(f"{p}: {s:.2f}" for p, s in sorted(result["per_partition"].items()))
            print(
                f"[bench] warm-ups {'on ' if warmups else 'off'}: longest processing pause during the join "
                f"{result['join_worst_s']:.2f}s (steady before it: {result['steady_worst_s']:.2f}s); "
                f"group settled {result['settled_s']:.1f}s after d started; rebalances seen {result['rebalances']}; "
                f"markers {result['markers']:,}, not seen {result['missing']}; load {_load()}",
                flush=True,
            )
            print(f"[bench]   worst per partition (s): {per}", flush=True)
            results.record(
                f"rebalance_pause.warmups_{'on' if warmups else 'off'}",
                result["join_worst_s"],
                "s",
                note=f"{args.accounts:,} accounts; steady before it {result['steady_worst_s']:.2f} s",
            )
            if result["per_partition"]:
                print(
                    f"[bench]   median of the per-partition worst: {statistics.median(result['per_partition'].values()):.2f}s",
                    flush=True,
                )


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])
