"""Reads under failure on the tallies service: failed answers and read latency while an
instance is SIGKILLed, while every instance is restarted in turn, and while a fourth joins.

    python -m tools.bench availability --accounts 100000 --programs 1000

Method: ``--accounts`` accounts (one AccountCreated each, over ``--programs`` programs) are
loaded into three instances at default settings (1 standby replica, 45 s session timeout,
peer watch as configured). ``--clients`` concurrent clients then read random programs'
tallies without pause, each from a random instance among those not being stopped (as a
Kubernetes Service routes only to ready pods), and check every answer: 200, the exact
count, and the ``X-Statefleet-Source`` header. Phases, each with its own figures: steady
(``--phase-s``), SIGKILL of one instance (reads go on for ``--phase-s``; the instance is
then started again with its data dir), a rolling restart (SIGTERM, start again, wait for
readiness, for each instance in turn), and a scale-out from 3 to 4 (the new instance
joins and is read from once ready). A failed answer is any that is not 200 with the exact
count, or no answer within 10 s; a request in flight to the very instance being stopped is
counted apart (it dies with its server's connections).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from shared.engine.clients import TopicSpec, ensure_topics_async
from shared.settings import Settings
from tools.bench import results
from tools.bench.common import Instance, bootstrap, machine, produce_bulk
from tools.bench.scaleout import REPO, accounts, pct, wait_loaded

PORT_BASE = 18301


#: The figure id of each measured phase in the results file.
PHASE_FIGURES = {
    "steady, 3 instances": "steady",
    "SIGKILL of one of 3": "sigkill",
    "rolling restart of 3": "rolling_restart",
    "scale-out 3 to 4": "scale_out",
}


@dataclass
class Phase:
    name: str
    latencies_ms: list[float] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    sources: Counter[str] = field(default_factory=Counter)
    #: Requests in flight to an instance at the moment it was SIGKILLed or stopped (its own
    #: connections die with it; no other instance could have answered them).
    cut_off: int = 0

    def line(self) -> str:
        reads = len(self.latencies_ms) + len(self.failed)
        lat = (
            f"p50 {pct(self.latencies_ms, 50):.1f} ms, p99 {pct(self.latencies_ms, 99):.1f} ms"
            if self.latencies_ms
            else "no answers"
        )
        sources = ", ".join(f"{k} {v:,}" for k, v in sorted(self.sources.items()))
        cut = f" ({self.cut_off} in flight to the stopped instance cut off)" if self.cut_off else ""
        return f"{self.name}: {reads:,} reads, {len(self.failed):,} failed{cut}; {lat}; sources: {sources}"


class Readers:
    """Clients reading random programs from the instances in :attr:`live` until stopped."""

    def __init__(self, expected: dict[str, int], clients: int) -> None:
        self.expected = expected
        self.programs = list(expected)
        self.clients = clients
        self.live: list[str] = []
        self.phase = Phase("setup")
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def _client(self, seed: int) -> None:
        rng = random.Random(seed)
        async with httpx.AsyncClient(timeout=10) as http:
            while not self._stop.is_set():
                if not self.live:
                    await asyncio.sleep(0.01)
                    continue
                url, program = rng.choice(self.live), rng.choice(self.programs)
                phase = self.phase
                started = time.perf_counter()
                try:
                    resp = await http.get(f"{url}/tallies/{program}")
                except httpx.HTTPError as exc:
                    if url in self.live:
                        phase.failed.append(f"{url} {program}: {exc!r}")
                    else:
                        self.phase.cut_off += 1
                    continue
                elapsed_ms = (time.perf_counter() - started) * 1000
                if resp.status_code != 200 or resp.json().get("numberActive") != self.expected[program]:
                    phase.failed.append(f"{url} {program}: {resp.status_code} {resp.text[:160]}")
                    continue
                phase.latencies_ms.append(elapsed_ms)
                phase.sources[resp.headers.get("x-statefleet-source", "(none)")] += 1

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._client(i)) for i in range(self.clients)]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    def begin(self, name: str) -> Phase:
        self.phase = Phase(name)
        return self.phase


async def run(args: argparse.Namespace) -> list[Phase]:
    prefix = f"bench{uuid.uuid4().hex[:8]}."
    print(
        f"[bench] machine: {machine()}; prefix {prefix}; {args.accounts:,} accounts, {args.programs:,} programs, "
        f"{args.clients} clients",
        flush=True,
    )
    settings = Settings(kafka_bootstrap_servers=bootstrap(), topic_prefix=prefix)
    topic = f"{prefix}account-events"
    await ensure_topics_async(settings, [TopicSpec(topic, 8), TopicSpec(f"{prefix}logins", 8)])
    await produce_bulk(topic, accounts(args.accounts, args.programs))
    expected = {f"program-{i}": len(range(i, args.accounts, args.programs)) for i in range(args.programs)}
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "STATEFLEET_TOPIC_PREFIX": prefix,
        "STATEFLEET_KAFKA_BOOTSTRAP_SERVERS": bootstrap(),
        "STATEFLEET_LOG_LEVEL": "INFO",
    }
    phases: list[Phase] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        fleet = [Instance(name, PORT_BASE + i, root / name, env) for i, name in enumerate("abcd")]
        instances = fleet[:3]
        try:
            for inst in instances:
                inst.start()
            for inst in instances:
                await asyncio.to_thread(inst.wait_ready)
            await asyncio.to_thread(wait_loaded, instances[0].url, list(expected), args.accounts)
            await asyncio.sleep(5)  # let the standbys take the changelogs' tail
            readers = Readers(expected, args.clients)
            readers.live = [inst.url for inst in instances]
            readers.start()

            phases.append(readers.begin("steady, 3 instances"))
            await asyncio.sleep(args.phase_s)

            phases.append(readers.begin("SIGKILL of one of 3"))
            victim = instances[0]
            readers.live = [inst.url for inst in instances if inst is not victim]
            victim.stop(kill=True)
            await asyncio.sleep(args.phase_s)
            readers.begin("(victim restarting)")
            victim.start()
            await asyncio.to_thread(victim.wait_ready)
            readers.live = [inst.url for inst in instances]
            await asyncio.sleep(10)

            phases.append(readers.begin("rolling restart of 3"))
            for inst in instances:
                readers.live = [other.url for other in instances if other is not inst]
                await asyncio.to_thread(inst.stop)  # SIGTERM; waits for the worker to exit
                inst.start()
                await asyncio.to_thread(inst.wait_ready)
                readers.live = [other.url for other in instances]
            await asyncio.sleep(5)

            phases.append(readers.begin("scale-out 3 to 4"))
            newcomer = fleet[3].start()
            await asyncio.to_thread(newcomer.wait_ready)
            instances.append(newcomer)
            readers.live = [inst.url for inst in instances]
            await asyncio.sleep(args.phase_s)
            await readers.stop()
        finally:
            for inst in fleet:
                if inst.proc is not None and inst.proc.poll() is None:
                    inst.stop(kill=True)
    return phases


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench availability")
    parser.add_argument("--accounts", type=int, default=100_000)
    parser.add_argument("--programs", type=int, default=1_000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--phase-s", type=float, default=15.0)
    args, _ = parser.parse_known_args(argv)
    for phase in asyncio.run(run(args)):
        print(f"[bench] {phase.line()}", flush=True)
        for failure in phase.failed[:3]:
            print(f"[bench]   e.g. {failure}", flush=True)
        name = PHASE_FIGURES[phase.name]
        reads = len(phase.latencies_ms) + len(phase.failed)
        results.record(f"availability.{name}.failed", len(phase.failed), "reads", note=f"of {reads:,}")
        if phase.latencies_ms:
            results.record(f"availability.{name}.p99", pct(phase.latencies_ms, 99), "ms")
