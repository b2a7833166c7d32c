"""Scale-out benchmark on the tallies service: query latency local vs forwarded, one
instance's request rate, failover with and without a standby, restore rate, and warm
versus cold restarts.

    python -m tools.bench scaleout --accounts 200000

Method: ``--accounts`` accounts (one AccountCreated each, spread over ``--programs``
programs) are loaded into one instance's memberships table, so its changelog holds one
record per account. Latency: sequential GETs of /tallies/{program} against instance A,
split by the ``X-Statefleet-Served-By`` header into keys A owns (local) and keys B owns
(forwarded). Rate: 32 concurrent clients on local keys for a fixed time. Restarts: stop
an instance and start it with its data dir kept (warm), then with it deleted (cold),
once with the bulk restore and once with Faust's recovery alone; each is the time to
/readyz 200. Failover: two fresh instances (1 standby with bulk restore; 0 standbys with
bulk restore; 0 standbys with Faust's recovery alone), SIGKILL the one that owns most
partitions, and time until every program has answered 200 from the survivor, polling
with 16 concurrent clients only the programs not yet answered (so a figure is late by at
most one pass over the victim's programs, under a second); then every program's count
is summed and must equal ``--accounts``. The session timeout (6 s) is included.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson

from shared.engine.clients import TopicSpec, ensure_topics_async
from shared.settings import Settings
from tools.bench import results
from tools.bench.common import Instance, bootstrap, last_bulk_restore, machine, produce_bulk

REPO = Path(__file__).resolve().parents[2]
SERVED_BY = "x-statefleet-served-by"
#: Short, so the failover figure is mostly takeover; it is the floor of any failover time.
SESSION_TIMEOUT_S = 6.0


def accounts(n: int, programs: int) -> Iterator[tuple[bytes, bytes]]:
    for i in range(n):
        acct = f"acct-{i}"
        yield (
            acct.encode(),
            orjson.dumps(
                {
                    "event_id": acct,
                    "command_id": acct,
                    "type": "AccountCreated",
                    "account_id": acct,
                    "program_id": f"program-{i % programs}",
                    "version": 1,
                    "occurred_at": 1,
                    "data": {},
                }
            ),
        )


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


async def unserved(http: httpx.AsyncClient, url: str, programs: list[str], concurrency: int = 16) -> list[str]:
    """The programs ``url`` does not answer 200 for (yet)."""
    missing: list[str] = []
    queue = list(reversed(programs))

    async def worker() -> None:
        while queue:
            program = queue.pop()
            try:
                ok = (await http.get(f"{url}/tallies/{program}")).status_code == 200
            except httpx.HTTPError:
                ok = False
            if not ok:
                missing.append(program)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return missing


async def wait_served(url: str, programs: list[str], give_up_after_s: float = 1800) -> float:
    """Seconds until every program has answered 200 once, polling only those that have not."""
    started = time.perf_counter()
    remaining = programs
    async with httpx.AsyncClient(timeout=5) as http:
        while remaining:
            if time.perf_counter() - started > give_up_after_s:
                raise TimeoutError(f"{len(remaining)} programs still unanswered at {url}")
            remaining = await unserved(http, url, remaining)
            if remaining:
                await asyncio.sleep(0.05)
    return time.perf_counter() - started


def total_active(url: str, programs: list[str]) -> int:
    with httpx.Client(timeout=10) as http:
        return sum(http.get(f"{url}/tallies/{p}").json().get("numberActive", 0) for p in programs)


def wait_loaded(url: str, programs: list[str], accounts: int) -> None:
    asyncio.run(wait_served(url, programs))
    while total_active(url, programs) < accounts:
        time.sleep(1)


async def request_rate(url: str, programs: list[str], seconds: float, concurrency: int = 32) -> float:
    done = 0
    deadline = time.perf_counter() + seconds

    async def client(i: int) -> None:
        nonlocal done
        async with httpx.AsyncClient(timeout=5) as http:
            k = i
            while time.perf_counter() < deadline:
                await http.get(f"{url}/tallies/{programs[k % len(programs)]}")
                done += 1
                k += concurrency

    started = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(concurrency)))
    return done / (time.perf_counter() - started)


def failover(base_env: dict[str, str], root: Path, programs: list[str], accounts: int, standby: int) -> float:
    env = {**base_env, "STATEFLEET_STANDBY_REPLICAS": str(standby)}
    run = f"{standby}{env.get('STATEFLEET_BULK_RESTORE', 'true')[0]}"
    port = 18110 + 2 * len(list(root.glob("f*.log")))
    a = Instance(f"fa{run}", port, root / f"fa{run}", env).start()
    b = Instance(f"fb{run}", port + 1, root / f"fb{run}", env).start()
    a.wait_ready()
    b.wait_ready()
    wait_loaded(a.url, programs, accounts)
    if standby:
        time.sleep(5)  # standbys were restored in bulk at the rebalance; let Faust's reader take the tail
    with httpx.Client(timeout=5) as http:
        served = [http.get(f"{a.url}/tallies/{p}").headers[SERVED_BY] for p in programs]
    victim, survivor = (a, b) if served.count(a.url) >= served.count(b.url) else (b, a)
    victim.stop(kill=True)
    started = time.perf_counter()
    asyncio.run(wait_served(survivor.url, programs))
    elapsed = time.perf_counter() - started
    counted = total_active(survivor.url, programs)
    if counted != accounts:
        raise AssertionError(f"after failover the survivor counts {counted:,} active accounts, not {accounts:,}")
    survivor.stop()
    return elapsed


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench scaleout")
    parser.add_argument("--accounts", type=int, default=200_000)
    parser.add_argument("--programs", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=2000)
    args, _ = parser.parse_known_args(argv)
    prefix = f"bench{uuid.uuid4().hex[:8]}."
    print(f"[bench] machine: {machine()}; prefix {prefix}; {args.accounts:,} accounts", flush=True)
    settings = Settings(kafka_bootstrap_servers=bootstrap(), topic_prefix=prefix)
    topic = f"{prefix}account-events"
    asyncio.run(ensure_topics_async(settings, [TopicSpec(topic, 8), TopicSpec(f"{prefix}logins", 8)]))
    asyncio.run(produce_bulk(topic, accounts(args.accounts, args.programs)))
    programs = [f"program-{i}" for i in range(args.programs)]
    base_env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "STATEFLEET_TOPIC_PREFIX": prefix,
        "STATEFLEET_KAFKA_BOOTSTRAP_SERVERS": bootstrap(),
        "STATEFLEET_LOG_LEVEL": "INFO",
        "STATEFLEET_SESSION_TIMEOUT_S": str(SESSION_TIMEOUT_S),
        "STATEFLEET_BULK_RESTORE": "true",
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        load_started = time.perf_counter()
        a = Instance("a", 18101, root / "a", base_env).start()
        a.wait_ready()
        wait_loaded(a.url, programs, args.accounts)
        print(f"[bench] loaded {args.accounts:,} accounts in {time.perf_counter() - load_started:.1f}s", flush=True)

        b = Instance("b", 18102, root / "b", base_env).start()
        b.wait_ready()
        asyncio.run(wait_served(a.url, programs))
        asyncio.run(wait_served(b.url, programs))
        local: list[float] = []
        forwarded: list[float] = []
        with httpx.Client(timeout=5) as http:
            for i in range(args.queries):
                p = programs[i % len(programs)]
                t0 = time.perf_counter()
                resp = http.get(f"{a.url}/tallies/{p}")
                dt = (time.perf_counter() - t0) * 1000
                (local if resp.headers[SERVED_BY] == a.url else forwarded).append(dt)
        with httpx.Client(timeout=5) as http:
            local_programs = [p for p in programs if http.get(f"{a.url}/tallies/{p}").headers[SERVED_BY] == a.url]
        print(
            f"[bench] point query latency, local: p50 {pct(local, 50):.2f} ms, p99 {pct(local, 99):.2f} ms "
            f"({len(local)} queries)",
            flush=True,
        )
        print(
            f"[bench] point query latency, forwarded: p50 {pct(forwarded, 50):.2f} ms, p99 {pct(forwarded, 99):.2f} ms "
            f"({len(forwarded)} queries)",
            flush=True,
        )
        results.record("scaleout.query_local_p99", pct(local, 99) if local else None, "ms")
        results.record("scaleout.query_forwarded_p99", pct(forwarded, 99) if forwarded else None, "ms")
        rate = asyncio.run(request_rate(a.url, local_programs, 10))
        print(f"[bench] one instance, local keys, 32 concurrent clients: {rate:,.0f} requests/s", flush=True)
        results.record("scaleout.local_requests", rate, "requests/s")
        b.stop()

        a.stop()
        warm = a.start().wait_ready()
        a.stop()
        print(f"[bench] restart with data dir kept (warm): ready in {warm:.1f}s", flush=True)
        results.record("scaleout.warm_restart", warm, "s")
        for label, bulk in (("bulk restore", "true"), ("Faust's recovery alone", "false")):
            shutil.rmtree(root / "a")
            cold = a.start(STATEFLEET_BULK_RESTORE=bulk).wait_ready()
            a.stop()
            print(
                f"[bench] restart with data dir deleted (cold), {label}: ready in {cold:.1f}s "
                f"= {args.accounts / cold:,.0f} accounts/s end to end",
                flush=True,
            )
            how = "bulk" if bulk == "true" else "faust"
            results.record(f"scaleout.cold_restart_{how}", cold, "s", note=f"{args.accounts:,} accounts")
        restored = last_bulk_restore(root / "a.log")
        if restored:
            print(f"[bench] the bulk restore itself: {restored}", flush=True)

        for standby, bulk in ((1, "true"), (0, "true"), (0, "false")):
            secs = failover({**base_env, "STATEFLEET_BULK_RESTORE": bulk}, root, programs, args.accounts, standby)
            how = "bulk restore" if bulk == "true" else "Faust's recovery alone"
            print(
                f"[bench] failover with {standby} standby, {how}: every program served again {secs:.1f}s after "
                f"SIGKILL (includes the {SESSION_TIMEOUT_S:g} s session timeout), all {args.accounts:,} accounts "
                "counted",
                flush=True,
            )
            how = "bulk" if bulk == "true" else "faust"
            results.record(f"scaleout.failover_standby{standby}_{how}", secs, "s", note=f"{args.accounts:,} accounts")
