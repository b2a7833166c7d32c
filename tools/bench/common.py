"""What the benchmarks share: the machine description, fast bulk production, and the
raw-aiokafka consume baseline the Faust figures are compared against."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from shared.engine.clients import refresh_metadata
from tools import web
from tools.kafka_broker import default_layout

REPO = Path(__file__).resolve().parents[2]


def bootstrap() -> str:
    return os.environ.get("STATEFLEET_KAFKA_BOOTSTRAP_SERVERS", default_layout().bootstrap)


def machine() -> str:
    cpus = os.cpu_count()
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{platform.machine()}, {cpus} cores, {mem_gb:.0f} GiB, Python {platform.python_version()}"


async def produce_bulk(topic: str, records: Iterable[tuple[bytes, bytes]], progress_every: int = 200_000) -> int:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap(), linger_ms=20, max_batch_size=512 * 1024, acks=1)
    await producer.start()
    n = 0
    try:
        pending = []
        for key, value in records:
            pending.append(await producer.send(topic, value, key=key))
            n += 1
            if len(pending) >= 20_000:
                for fut in pending:
                    await fut
                pending.clear()
            if n % progress_every == 0:
                print(f"[bench]   produced {n:,} to {topic}", flush=True)
        await producer.flush()
        for fut in pending:
            await fut
    finally:
        await producer.stop()
    return n


async def raw_consume_rate(topics: Sequence[str], expected: int) -> tuple[int, float]:
    """Read ``topics`` from the beginning with a bare aiokafka consumer: (records, seconds)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap(),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_bytes=32 * 1024 * 1024,
    )
    await consumer.start()
    try:
        await refresh_metadata(consumer)
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


def peak_rss_mib(pid: int) -> float | None:
    """The peak resident set (VmHWM) of a running process, in MiB (None once it has exited)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def stop_worker(proc: subprocess.Popen[bytes], timeout_s: float = 60.0, name: str = "worker") -> None:
    """SIGTERM a worker and wait for its clean shutdown; SIGKILL it when that takes too long.
    Its peak RSS is printed first, since each benchmark's figure goes with it."""
    if proc.poll() is not None:
        return
    rss = peak_rss_mib(proc.pid)
    if rss is not None:
        print(f"[bench] {name} peak RSS {rss:,.0f} MiB", flush=True)
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def service_worker(module: str, prefix: str, port: int, extra_env: dict[str, str] | None = None) -> Iterator[str]:
    """One ``services.<module>`` instance on an empty data dir; yields its URL once ready, stops it after."""
    with tempfile.TemporaryDirectory() as data_dir:
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "STATEFLEET_TOPIC_PREFIX": prefix,
            "STATEFLEET_KAFKA_BOOTSTRAP_SERVERS": bootstrap(),
            "STATEFLEET_DATA_DIR": data_dir,
            "STATEFLEET_HTTP_PORT": str(port),
            "STATEFLEET_INSTANCE_ID": "bench",
            "STATEFLEET_LOG_LEVEL": "WARNING",
            **(extra_env or {}),
        }
        log_path = Path(data_dir) / "worker.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", f"services.{module}"], env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT
            )
        url = f"http://127.0.0.1:{port}"
        try:
            while True:
                try:
                    if web.get(url + "/readyz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None:
                    raise RuntimeError(f"{module} worker exited: {log_path.read_text(errors='replace')[-3000:]}")
                time.sleep(0.1)
            yield url
        finally:
            stop_worker(proc, name=f"{module} worker")


async def topic_size(topic: str) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap())
    await consumer.start()
    try:
        await refresh_metadata(consumer)
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        ends = await consumer.end_offsets(tps) if tps else {}
        return sum(ends.values())
    finally:
        await consumer.stop()


def restore_figures(url: str) -> tuple[float, float]:
    """The worker's restore from its metrics: (changelog records restored, seconds restoring)."""
    records = seconds = 0.0
    for line in web.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("statefleet_restored_records_total{") and 'source="changelog"' in line:
            records += float(line.split()[-1])
        elif line.startswith("statefleet_restore_seconds_sum{"):
            seconds += float(line.split()[-1])
    return records, seconds


BULK_RESTORE_LINE = re.compile(r"bulk restore: (\d+ records into \d+ partitions in .*)$")


def last_bulk_restore(log: Path) -> str | None:
    """The last 'N records into P partitions in Ss (R records/s)' a worker logged."""
    found = None
    for line in log.read_text(errors="replace").splitlines():
        match = BULK_RESTORE_LINE.search(line)
        if match:
            found = match.group(1)
    return found


@dataclass
class Instance:
    """A service worker on a data dir of its own, started and stopped again; its log is
    ``<name>.log`` beside the data dir."""

    name: str
    port: int
    data_dir: Path
    env: dict[str, str]
    #: The service it runs (``services.<module>``).
    module: str = "tallies"
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, **extra_env: str) -> Instance:
        env = {
            **self.env,
            "STATEFLEET_INSTANCE_ID": self.name,
            "STATEFLEET_HTTP_PORT": str(self.port),
            "STATEFLEET_DATA_DIR": str(self.data_dir),
            **extra_env,
        }
        with open(self.data_dir.parent / f"{self.name}.log", "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", f"services.{self.module}"], env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT
            )
        return self

    def wait_ready(self, timeout: float = 600) -> float:
        started = time.perf_counter()
        while time.perf_counter() - started < timeout:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited")
            try:
                if web.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return time.perf_counter() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} not ready")

    def stop(self, kill: bool = False) -> None:
        if self.proc is not None and kill:
            self.proc.kill()
            self.proc.wait()
        elif self.proc is not None:
            stop_worker(self.proc)
