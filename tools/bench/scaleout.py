"""Scale-out benchmark on the tallies service: query latency local vs forwarded, one
instance's request rate, failover with and without a standby, restore rate, and warm
versus cold restarts.

    python -m tools.bench scaleout --accounts 200000

Method: ``--accounts`` accounts (one AccountCreated each, spread over ``--programs``
programs) are loaded into one instance's memberships table, so its changelog holds one
record per account. Latency: sequential GETs of /tallies/{program} against instance A,
split by the ``X-Statefleet-Served-By`` header into keys A owns (local) and keys B owns
(forwarded). Rate: 32 concurrent clients on local keys for a fixed time. Failover: two
instances (with 1 standby, then with 0), SIGKILL the one that owns most partitions, and
time until every program answers 200 from the survivor (session timeout 6 s, included).
Restore: stop an instance, delete its data dir, start it, time to /readyz 200 (cold);
stop it again and start it with the data dir kept (warm).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson

from shared.settings import Settings
from shared.topic_admin import TopicSpec, ensure_topics_async
from tools.bench.common import bootstrap, machine, produce_bulk

REPO = Path(__file__).resolve().parents[2]
SERVED_BY = "x-statefleet-served-by"


@dataclass
class Instance:
    name: str
    port: int
    data_dir: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Instance:
        env = {**self.env, "STATEFLEET_INSTANCE_ID": self.name, "STATEFLEET_HTTP_PORT": str(self.port),
               "STATEFLEET_DATA_DIR": str(self.data_dir)}
        with open(self.data_dir.parent / f"{self.name}.log", "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "services.tallies"], env=env, cwd=REPO,
                                         stdout=log, stderr=subprocess.STDOUT)
        return self

    def wait_ready(self, timeout: float = 600) -> float:
        started = time.perf_counter()
        while time.perf_counter() - started < timeout:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited")
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return time.perf_counter() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} not ready")

    def stop(self, kill: bool = False) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if kill:
                self.proc.kill()
            else:
                self.proc.terminate()
            self.proc.wait(60)


def accounts(n: int, programs: int) -> Iterator[tuple[bytes, bytes]]:
    for i in range(n):
        acct = f"acct-{i}"
        yield acct.encode(), orjson.dumps({"event_id": acct, "command_id": acct, "type": "AccountCreated",
                                           "account_id": acct, "program_id": f"program-{i % programs}",
                                           "version": 1, "occurred_at": 1, "data": {}})


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def all_served(url: str, programs: list[str]) -> bool:
    try:
        return all(httpx.get(f"{url}/tallies/{p}", timeout=5).status_code == 200 for p in programs)
    except httpx.HTTPError:
        return False


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


def failover(base_env: dict[str, str], root: Path, programs: list[str], standby: int) -> float:
    env = {**base_env, "STATEFLEET_STANDBY_REPLICAS": str(standby)}
    a = Instance(f"fa{standby}", 18110 + standby, root / f"fa{standby}", env).start()
    b = Instance(f"fb{standby}", 18120 + standby, root / f"fb{standby}", env).start()
    a.wait_ready()
    b.wait_ready()
    while not all_served(a.url, programs):
        time.sleep(0.5)
    if standby:
        time.sleep(10)  # let the standby catch up with the changelog
    served = [httpx.get(f"{a.url}/tallies/{p}", timeout=5).headers[SERVED_BY] for p in programs]
    victim, survivor = (a, b) if served.count(a.url) >= served.count(b.url) else (b, a)
    victim.stop(kill=True)
    started = time.perf_counter()
    while not all_served(survivor.url, programs):
        time.sleep(0.1)
    elapsed = time.perf_counter() - started
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
    base_env = {**os.environ, "PYTHONPATH": str(REPO), "STATEFLEET_TOPIC_PREFIX": prefix,
                "STATEFLEET_KAFKA_BOOTSTRAP_SERVERS": bootstrap(), "STATEFLEET_LOG_LEVEL": "WARNING",
                "STATEFLEET_SESSION_TIMEOUT_S": "6"}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        load_started = time.perf_counter()
        a = Instance("a", 18101, root / "a", base_env).start()
        a.wait_ready()
        while not all_served(a.url, programs[:50]) or \
                sum(httpx.get(f"{a.url}/tallies/{p}", timeout=5).json()["numberActive"] for p in programs[-5:]) < \
                5 * (args.accounts // args.programs):
            time.sleep(1)
        print(f"[bench] loaded {args.accounts:,} accounts in {time.perf_counter() - load_started:.1f}s", flush=True)

        b = Instance("b", 18102, root / "b", base_env).start()
        b.wait_ready()
        while not all_served(a.url, programs) or not all_served(b.url, programs):
            time.sleep(0.5)
        local: list[float] = []
        forwarded: list[float] = []
        with httpx.Client(timeout=5) as http:
            for i in range(args.queries):
                p = programs[i % len(programs)]
                t0 = time.perf_counter()
                resp = http.get(f"{a.url}/tallies/{p}")
                dt = (time.perf_counter() - t0) * 1000
                (local if resp.headers[SERVED_BY] == a.url else forwarded).append(dt)
        local_programs = [p for p in programs if httpx.get(f"{a.url}/tallies/{p}").headers[SERVED_BY] == a.url]
        print(f"[bench] point query latency, local: p50 {pct(local, 50):.2f} ms, p99 {pct(local, 99):.2f} ms "
              f"({len(local)} queries)", flush=True)
        print(f"[bench] point query latency, forwarded: p50 {pct(forwarded, 50):.2f} ms, p99 {pct(forwarded, 99):.2f} ms "
              f"({len(forwarded)} queries)", flush=True)
        rate = asyncio.run(request_rate(a.url, local_programs, 10))
        print(f"[bench] one instance, local keys, 32 concurrent clients: {rate:,.0f} requests/s", flush=True)
        b.stop()

        a.stop()
        warm = a.start().wait_ready()
        a.stop()
        shutil.rmtree(root / "a")
        cold = a.start().wait_ready()
        records = args.accounts
        print(f"[bench] restart with data dir kept (warm): ready in {warm:.1f}s", flush=True)
        print(f"[bench] restart with data dir deleted (cold): ready in {cold:.1f}s, restoring {records:,} changelog "
              f"records = {records / cold:,.0f} records/s", flush=True)
        a.stop()

        for standby in (1, 0):
            secs = failover(base_env, root, programs, standby)
            print(f"[bench] failover with {standby} standby: every key served again {secs:.1f}s after SIGKILL "
                  "(includes the 6 s session timeout)", flush=True)
