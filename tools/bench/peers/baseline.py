"""The bare aiokafka consumer of the peers benchmark, in a process of its own so that its
peak RSS is its own: reads the input topics from the beginning and prints one JSON line,
``{"records", "seconds", "peak_rss_bytes"}``, the clock running from the first fetch (as
in the other benchmarks' baseline: at small sizes one fetch returns everything).

    python -m tools.bench.peers.baseline --records N TOPIC...
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from tools.bench.common import bootstrap


async def consume(topics: list[str], expected: int) -> tuple[int, float]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap(),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_bytes=32 * 1024 * 1024,
    )
    await consumer.start()
    try:
        await consumer._client.force_metadata_update()  # noqa: SLF001 - the bare baseline imports nothing of the project
        tps = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or [])]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        n = 0
        started = time.perf_counter()
        while n < expected:
            batch = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            for msgs in batch.values():
                n += len(msgs)
        return n, time.perf_counter() - started
    finally:
        await consumer.stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.peers.baseline")
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("topics", nargs="+")
    args = parser.parse_args(argv)
    records, seconds = asyncio.run(consume(args.topics, args.records))
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so it would report the
    # parent's size when the parent is the larger.
    status = Path("/proc/self/status").read_text().splitlines()
    peak = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    sys.stdout.write(orjson.dumps({"records": records, "seconds": seconds, "peak_rss_bytes": peak}).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
