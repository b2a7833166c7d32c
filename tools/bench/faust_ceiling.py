"""The ceiling Faust itself puts on a service: one agent that only counts events,
against a bare aiokafka consumer reading the same topic in the same run.

    python -m tools.bench faust_ceiling --events 200000

Every statefleet agent pays this per-record cost before doing any work of its own,
so it bounds what any one-agent worker can reach on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import faust
import orjson

from shared.engine import TopicSpec, ensure_topics_async
from shared.settings import Settings
from tools.bench.common import bootstrap, machine, produce_bulk, raw_consume_rate

REPO = Path(__file__).resolve().parents[2]


def run_worker(topic: str, expected: int, data_dir: str) -> None:
    """A Faust worker with one counting agent; prints its rate and exits at ``expected``."""
    app = faust.App(
        f"ceiling-{uuid.uuid4().hex[:8]}", broker=f"kafka://{bootstrap()}", store="memory://", web_enabled=False,
        key_serializer="raw", value_serializer="raw", consumer_auto_offset_reset="earliest", autodiscover=False,
        datadir=data_dir, broker_max_poll_records=2000, stream_buffer_maxsize=8192,
    )
    state: dict[str, float] = {"n": 0, "t0": 0.0}

    @app.agent(app.topic(topic, key_type=bytes, value_type=bytes))
    async def count(stream: Any) -> None:
        async for events in stream.take_events(1000, 0.05):
            if not state["t0"]:
                state["t0"] = time.perf_counter()
            state["n"] += len(events)
            if state["n"] >= expected:
                secs = time.perf_counter() - state["t0"]
                print(f"RESULT {int(state['n'])} {secs:.3f}", flush=True)
                os._exit(0)

    faust.Worker(app, loglevel="WARNING", quiet=True).execute_from_commandline()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench faust_ceiling")
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--worker", nargs=3, metavar=("TOPIC", "N", "DATA_DIR"), help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args(argv)
    if args.worker:
        run_worker(args.worker[0], int(args.worker[1]), args.worker[2])
        return
    topic = f"bench{uuid.uuid4().hex[:8]}.ceiling"
    print(f"[bench] machine: {machine()}; topic {topic}", flush=True)
    settings = Settings(kafka_bootstrap_servers=bootstrap())
    asyncio.run(ensure_topics_async(settings, [TopicSpec(topic, 8)]))
    payload = orjson.dumps({"account_id": "a", "program_id": "p", "ts": 1, "pad": "x" * 80})
    asyncio.run(produce_bulk(topic, ((f"k{i}".encode(), payload) for i in range(args.events))))
    n, secs = asyncio.run(raw_consume_rate([topic], args.events))
    raw = n / secs
    print(f"[bench] bare aiokafka consumer: {n:,} in {secs:.2f}s = {raw:,.0f} events/s", flush=True)
    out = subprocess.run(
        [sys.executable, "-m", "tools.bench", "faust_ceiling", "--worker", topic, str(args.events), f"/tmp/{topic}"],
        cwd=REPO, capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    # The worker's stdout goes through Faust's logging, so the line may be on either stream.
    found = re.search(r"RESULT (\d+) ([\d.]+)", out.stdout + out.stderr)
    if found is None:
        print(f"[bench] the counting worker failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}", flush=True)
        return
    count, took = found.groups()
    rate = int(count) / float(took)
    print(f"[bench] Faust agent that only counts: {int(count):,} in {float(took):.2f}s = {rate:,.0f} events/s "
          f"({rate / raw:.1%} of the bare consumer)", flush=True)
