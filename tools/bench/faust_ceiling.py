"""The ceiling the stream runtime puts on a service: a handler that only counts events,
against a bare aiokafka consumer reading the same topic in the same run; once on
Faust's own per-record path (an agent with ``take_events``) and once on the engine's
batch hand-over (a batch handler), each in a worker process of its own.

    python -m tools.bench faust_ceiling --events 200000

Every handler pays this per-record cost before doing any work of its own, so it bounds
what any one-handler worker can reach on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import resource
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import faust
import orjson

from shared.engine import Engine, InputBatch
from shared.engine.clients import TopicSpec, ensure_topics_async
from shared.settings import Settings
from tools.bench import results
from tools.bench.common import bootstrap, machine, produce_bulk, raw_consume_rate

REPO = Path(__file__).resolve().parents[2]


def finish(count: int, secs: float) -> None:
    """Report the count, the time and this process's peak RSS, and exit at once."""
    print(f"RESULT {count} {secs:.3f}", flush=True)
    print(f"PEAK_RSS_KIB {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}", flush=True)
    os._exit(0)


def run_worker(topic: str, expected: int, data_dir: str) -> None:
    """A Faust worker with one counting agent; prints its rate and exits at ``expected``."""
    app = faust.App(
        f"ceiling-{uuid.uuid4().hex[:8]}",
        broker=f"kafka://{bootstrap()}",
        store="memory://",
        web_enabled=False,
        key_serializer="raw",
        value_serializer="raw",
        consumer_auto_offset_reset="earliest",
        autodiscover=False,
        datadir=data_dir,
        broker_max_poll_records=2000,
        stream_buffer_maxsize=8192,
    )
    state: dict[str, float] = {"n": 0, "t0": 0.0}

    @app.agent(app.topic(topic, key_type=bytes, value_type=bytes))
    async def count(stream: Any) -> None:
        async for events in stream.take_events(1000, 0.05):
            if not state["t0"]:
                state["t0"] = time.perf_counter()
            state["n"] += len(events)
            if state["n"] >= expected:
                finish(int(state["n"]), time.perf_counter() - state["t0"])

    faust.Worker(app, loglevel="WARNING", quiet=True).execute_from_commandline()


def run_engine_worker(topic: str, expected: int, data_dir: str) -> None:
    """An engine worker with one batch handler that counts; prints its rate and exits at ``expected``."""
    settings = Settings(
        kafka_bootstrap_servers=bootstrap(),
        data_dir=Path(data_dir),
        http_port=free_port(),
        instance_id="ceiling",
        static_membership=False,
        standby_replicas=0,
    )
    engine = Engine(f"ceiling-{uuid.uuid4().hex[:8]}", settings, 0)
    state: dict[str, float] = {"n": 0, "t0": 0.0}

    async def count(batch: InputBatch) -> None:
        if not state["t0"]:
            state["t0"] = time.perf_counter()
        state["n"] += len(batch.records)
        if state["n"] >= expected:
            finish(int(state["n"]), time.perf_counter() - state["t0"])

    engine.handler(topic, name="count", offsets=None)(count)
    engine.run()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timed_worker(mode: str, topic: str, events: int) -> tuple[int, float, int] | None:
    """Run the counting worker of ``mode`` in a process of its own: (count, seconds, peak RSS in KiB)."""
    out = subprocess.run(
        [sys.executable, "-m", "tools.bench", "faust_ceiling", "--worker", mode, topic, str(events), f"/tmp/{topic}-{mode}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    # The worker's stdout goes through Faust's logging, so the line may be on either stream.
    found = re.search(r"RESULT (\d+) ([\d.]+)", out.stdout + out.stderr)
    rss = re.search(r"PEAK_RSS_KIB (\d+)", out.stdout + out.stderr)
    if found is None:
        print(f"[bench] the {mode} counting worker failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}", flush=True)
        return None
    return int(found.group(1)), float(found.group(2)), int(rss.group(1)) if rss else 0


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench faust_ceiling")
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--worker", nargs=4, metavar=("MODE", "TOPIC", "N", "DATA_DIR"), help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args(argv)
    if args.worker:
        mode, topic, n, data_dir = args.worker
        (run_engine_worker if mode == "engine" else run_worker)(topic, int(n), data_dir)
        return
    topic = f"bench{uuid.uuid4().hex[:8]}.ceiling"
    print(f"[bench] machine: {machine()}; load average {os.getloadavg()[0]:.2f}; topic {topic}", flush=True)
    settings = Settings(kafka_bootstrap_servers=bootstrap())
    asyncio.run(ensure_topics_async(settings, [TopicSpec(topic, 8)]))
    payload = orjson.dumps({"account_id": "a", "program_id": "p", "ts": 1, "pad": "x" * 80})
    asyncio.run(produce_bulk(topic, ((f"k{i}".encode(), payload) for i in range(args.events))))
    n, secs = asyncio.run(raw_consume_rate([topic], args.events))
    raw = n / secs
    print(f"[bench] bare aiokafka consumer: {n:,} in {secs:.2f}s = {raw:,.0f} events/s", flush=True)
    for mode, what in (("faust", "Faust agent that only counts"), ("engine", "engine batch handler that only counts")):
        result = timed_worker(mode, topic, args.events)
        if result is None:
            continue
        count, took, rss_kib = result
        rate = count / took
        print(
            f"[bench] {what}: {count:,} in {took:.2f}s = {rate:,.0f} events/s "
            f"({rate / raw:.1%} of the bare consumer); peak RSS {rss_kib / 1024:.0f} MiB",
            flush=True,
        )
        results.record(f"ceiling.{mode}", rate, "events/s", baseline=raw)
