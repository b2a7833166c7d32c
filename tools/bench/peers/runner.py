"""statefleet next to what a user would pick instead: the same tally work done by statefleet's
tallies service, Kafka Streams and Quix Streams, on the same broker, input and machine, in
one run, with the bare aiokafka consumer reading the same input as the floor of the cost.

    python -m tools.bench peers [--events 500000] [--programs 1000] [--rounds 3]
                                [--systems aiokafka statefleet kafka-streams quix-streams]
                                [--replays 0.0] [--exactly-once] [--json FILE]

Method. The workload (:mod:`tools.bench.peers.workload`) is generated once. In each round
every system runs once, in an order rotated from round to round, each on a fresh topic
prefix: the N records are pre-loaded into ``<prefix>account-events`` and ``<prefix>logins``
(8 partitions, keyed by account), ``<prefix>program-tallies`` is created empty (8
partitions, compacted), and the system starts cold (no state, no consumer group, no
internal topics). The clock starts when the system processes its first record: the first
``first-record-at-ms`` line of the Kafka Streams and Quix applications, statefleet's
``/readyz`` answering 200 (it then starts consuming), the bare consumer's first fetch. It
stops when a consumer reading ``<prefix>program-tallies`` from the beginning
(read_committed) has seen, for every program, a latest record equal to the expected
Tally JSON and no record for any other key; records/s is N over that time. The peak RSS is
the process's VmHWM, read once the output is exact (the bare consumer reads its own).
Every topic of the prefix, the systems' internal ones included, is deleted afterwards.

The systems:

- ``statefleet``: ``python -m services.tallies`` from this checkout, default settings
  (tallies published every second, at-least-once unless ``--exactly-once``).
- ``kafka-streams``: ``tools/bench/peers/kstreams`` (Kafka Streams 4.4.0, RocksDB stores
  with changelogs, one stream thread, at_least_once, commit interval 1 s), built into
  ``.local/bench/kstreams`` by ``make bench-peers-build``.
- ``quix-streams``: ``tools/bench/peers/quix_tallies.py`` in ``.local/quix-venv`` (RocksDB
  state with changelogs, at-least-once, commit interval 1 s).
- ``aiokafka``: :mod:`tools.bench.peers.baseline`, reading the two input topics.

``--exactly-once`` runs Kafka Streams with exactly_once_v2, Quix with exactly-once and
statefleet with ``STATEFLEET_PROCESSING_GUARANTEE=exactly_once`` (the output is read
read_committed in both modes).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from shared.engine.clients import TopicSpec, ensure_topics_async, refresh_metadata
from shared.settings import Settings
from tools import web
from tools.bench import results
from tools.bench.common import REPO, bootstrap, machine, produce_bulk, stop_worker
from tools.bench.peers.workload import Workload, build

SYSTEMS = ("aiokafka", "statefleet", "kafka-streams", "quix-streams")
LABELS = {
    "aiokafka": "bare aiokafka consumer",
    "statefleet": "statefleet (tallies service)",
    "kafka-streams": "Kafka Streams 4.4.0",
    "quix-streams": "Quix Streams 3.28.1",
}
PARTITIONS = 8
DASH, TIMES = "\N{EN DASH}", "\N{MULTIPLICATION SIGN}"

KSTREAMS_JAR = REPO / ".local" / "bench" / "kstreams" / "statefleet-kstreams-tallies.jar"
QUIX_PYTHON = REPO / ".local" / "quix-venv" / "bin" / "python"
QUIX_APP = REPO / "tools" / "bench" / "peers" / "quix_tallies.py"
FIRST_RECORD = re.compile(rb"^first-record-at-ms (\d+)$", re.MULTILINE)


class PeersError(RuntimeError):
    """A system could not be run; the message says why, with its log's tail."""


@dataclass(frozen=True)
class Options:
    events: int = 500_000
    programs: int = 1000
    rounds: int = 3
    systems: tuple[str, ...] = SYSTEMS
    replay_fraction: float = 0.0
    exactly_once: bool = False
    timeout_s: float = 900.0
    kstreams_threads: int = 1
    java_opts: tuple[str, ...] = ()


@dataclass
class Run:
    system: str
    round: int
    records: int
    #: From the first record processed to the output exact; None when it never was.
    seconds: float | None
    #: Programs whose latest tally was exact at the end; None for the bare consumer.
    exact: int | None
    programs: int
    peak_rss_bytes: int
    prefix: str = ""

    @property
    def rate(self) -> float | None:
        return self.records / self.seconds if self.seconds else None

    @property
    def ok(self) -> bool:
        return self.seconds is not None and (self.exact is None or self.exact == self.programs)


@dataclass
class Summary:
    system: str
    rates: list[float | None] = field(default_factory=list)
    exact_min: int | None = None
    programs: int = 0
    peak_rss_max: int = 0
    median: float | None = None
    vs_bare: float | None = None
    vs_kstreams: float | None = None


# -- the machine ---------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def describe_machine() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{machine()}; {cpu_model()}; load average at start {load}"


# -- topics ------------------------------------------------------------------------------


def new_prefix() -> str:
    return f"peers{uuid.uuid4().hex[:8]}."


async def prepare_topics(prefix: str, workload: Workload, with_output: bool) -> None:
    settings = Settings(kafka_bootstrap_servers=bootstrap(), topic_prefix=prefix)
    specs = [TopicSpec(f"{prefix}account-events", PARTITIONS), TopicSpec(f"{prefix}logins", PARTITIONS)]
    if with_output:
        specs.append(TopicSpec(f"{prefix}program-tallies", PARTITIONS, compacted=True))
    await ensure_topics_async(settings, specs)
    await produce_bulk(f"{prefix}account-events", iter(workload.events))
    await produce_bulk(f"{prefix}logins", iter(workload.logins))


async def delete_topics(prefix: str) -> None:
    """Every topic naming the prefix: Kafka Streams' (``<app id>-…``) and Quix's
    (``changelog__<group>--…``, ``repartition__<group>--…``) internal topics included."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap())
    await admin.start()
    try:
        mine = [t for t in await admin.list_topics() if prefix in t]
        if mine:
            await admin.delete_topics(mine)
    finally:
        await admin.close()


# -- processes -----------------------------------------------------------------------------


def _status_kib(pid: int, field_name: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            kids += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        pass
    return kids


def peak_rss_bytes(pid: int) -> int:
    """The peak resident set (VmHWM) of ``pid`` and all its descendants, summed."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += _status_kib(p, "VmHWM") * 1024
        todo += _children(p)
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def check_built(systems: Sequence[str]) -> None:
    missing = []
    if "kafka-streams" in systems and not KSTREAMS_JAR.exists():
        missing.append(f"the Kafka Streams jar ({KSTREAMS_JAR.relative_to(REPO)})")
    if "quix-streams" in systems and not QUIX_PYTHON.exists():
        missing.append(f"the Quix Streams environment ({QUIX_PYTHON.parent.parent.relative_to(REPO)})")
    if missing:
        raise PeersError(f"{' and '.join(missing)} not built: run `make bench-peers-build`")


def launch(system: str, prefix: str, workdir: Path, opts: Options) -> tuple[subprocess.Popen[bytes], Path, str | None]:
    """Start one system on ``prefix``; (process, its log, statefleet's URL or None)."""
    log_path = workdir / f"{system}.log"
    state_dir = workdir / "state"
    url = None
    if system == "statefleet":
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "STATEFLEET_TOPIC_PREFIX": prefix,
            "STATEFLEET_KAFKA_BOOTSTRAP_SERVERS": bootstrap(),
            "STATEFLEET_DATA_DIR": str(state_dir),
            "STATEFLEET_HTTP_HOST": "127.0.0.1",
            "STATEFLEET_HTTP_PORT": str(port),
            "STATEFLEET_INSTANCE_ID": "peers",
            "STATEFLEET_LOG_LEVEL": "WARNING",
            "STATEFLEET_PROCESSING_GUARANTEE": "exactly_once" if opts.exactly_once else "at_least_once",
        }
        cmd = [sys.executable, "-m", "services.tallies"]
    elif system == "kafka-streams":
        env = dict(os.environ)
        cmd = [
            "java",
            *opts.java_opts,
            "-jar",
            str(KSTREAMS_JAR),
            "--bootstrap",
            bootstrap(),
            "--prefix",
            prefix,
            "--application-id",
            f"{prefix}kstreams-tallies",
            "--state-dir",
            str(state_dir),
            "--processing-guarantee",
            "exactly_once_v2" if opts.exactly_once else "at_least_once",
            "--threads",
            str(opts.kstreams_threads),
        ]
    elif system == "quix-streams":
        # Its own environment: nothing of the project's on its path.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        cmd = [
            str(QUIX_PYTHON),
            str(QUIX_APP),
            "--bootstrap",
            bootstrap(),
            "--prefix",
            prefix,
            "--consumer-group",
            f"{prefix}quix-tallies",
            "--state-dir",
            str(state_dir),
            *(["--exactly-once"] if opts.exactly_once else []),
        ]
    else:
        raise ValueError(f"unknown system {system!r}")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return proc, log_path, url


def wait_ready(proc: subprocess.Popen[bytes], url: str, log_path: Path, deadline: float) -> float:
    """Poll statefleet's /readyz; the wall-clock time it first answered 200."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PeersError(f"statefleet exited with {proc.returncode} before ready:\n{log_tail(log_path)}")
        try:
            if web.get(url + "/readyz", timeout=1.0).status_code == 200:
                return time.time()
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise PeersError(f"statefleet not ready within the timeout:\n{log_tail(log_path)}")


def first_record_at(log_path: Path) -> float | None:
    try:
        m = FIRST_RECORD.search(log_path.read_bytes())
    except OSError:
        return None
    return int(m.group(1)) / 1000 if m else None


# -- the output check ------------------------------------------------------------------------


@dataclass
class Watch:
    done_at: float | None  # wall-clock time the output was first seen exact
    exact: int
    wrong: list[tuple[str, Any]]


async def watch_output(topic: str, expected: dict[str, dict[str, Any]], proc: subprocess.Popen[bytes], deadline: float) -> Watch:
    """Read ``topic`` from the beginning until every program's latest record is its
    expected tally and no other key has appeared, the process exits, or the deadline."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap(), enable_auto_commit=False, auto_offset_reset="earliest", isolation_level="read_committed"
    )
    await consumer.start()
    latest: dict[str, Any] = {}
    wrong = set(expected)
    unexpected: set[str] = set()
    try:
        await refresh_metadata(consumer)
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        while True:
            batch = await consumer.getmany(timeout_ms=100, max_records=20_000)
            now = time.time()
            for msgs in batch.values():
                for msg in msgs:
                    program = msg.key.decode() if msg.key is not None else ""
                    try:
                        value = orjson.loads(msg.value) if msg.value is not None else None
                    except orjson.JSONDecodeError:
                        value = msg.value
                    latest[program] = value
                    if program not in expected:
                        unexpected.add(program)
                    elif value == expected[program]:
                        wrong.discard(program)
                    else:
                        wrong.add(program)
            if not wrong and not unexpected:
                return Watch(done_at=now, exact=len(expected), wrong=[])
            if proc.poll() is not None or time.monotonic() > deadline:
                examples = [(p, latest.get(p)) for p in sorted(wrong)[:3]] + [(p, latest[p]) for p in sorted(unexpected)[:3]]
                return Watch(done_at=None, exact=len(expected) - len(wrong), wrong=examples)
    finally:
        await consumer.stop()


# -- one system, one round ------------------------------------------------------------------


def run_baseline(round_no: int, workload: Workload, opts: Options) -> Run:
    prefix = new_prefix()
    try:
        asyncio.run(prepare_topics(prefix, workload, with_output=False))
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "tools.bench.peers.baseline",
                "--records",
                str(workload.records),
                f"{prefix}account-events",
                f"{prefix}logins",
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            timeout=opts.timeout_s,
            check=False,
        )
        if out.returncode != 0:
            raise PeersError(f"the bare consumer failed:\n{out.stderr.decode(errors='replace')[-3000:]}")
        result = orjson.loads(out.stdout.splitlines()[-1])
        return Run(
            "aiokafka",
            round_no,
            result["records"],
            result["seconds"],
            None,
            len(workload.expected),
            result["peak_rss_bytes"],
            prefix,
        )
    finally:
        asyncio.run(delete_topics(prefix))


def run_system(system: str, round_no: int, workload: Workload, opts: Options) -> Run:
    if system == "aiokafka":
        return run_baseline(round_no, workload, opts)
    prefix = new_prefix()
    workdir = Path(tempfile.mkdtemp(prefix=f"peers-{system}-"))
    proc: subprocess.Popen[bytes] | None = None
    try:
        asyncio.run(prepare_topics(prefix, workload, with_output=True))
        deadline = time.monotonic() + opts.timeout_s
        proc, log_path, url = launch(system, prefix, workdir, opts)
        started = wait_ready(proc, url, log_path, deadline) if url else None
        watch = asyncio.run(watch_output(f"{prefix}program-tallies", workload.expected, proc, deadline))
        rss = peak_rss_bytes(proc.pid)
        if proc.poll() is not None:
            raise PeersError(f"{system} exited with {proc.returncode}:\n{log_tail(log_path)}")
        if started is None:
            started = first_record_at(log_path)
            if started is None and watch.done_at is not None:
                raise PeersError(f"{system} printed no first-record-at-ms line:\n{log_tail(log_path)}")
        seconds = watch.done_at - started if watch.done_at is not None and started is not None else None
        if watch.wrong:
            print(
                f"[peers]   {system}: {watch.exact}/{len(workload.expected)} exact at the timeout; for example {watch.wrong}",
                flush=True,
            )
        return Run(system, round_no, workload.records, seconds, watch.exact, len(workload.expected), rss, prefix)
    finally:
        if proc is not None:
            stop_worker(proc, timeout_s=30)
        asyncio.run(delete_topics(prefix))
        shutil.rmtree(workdir, ignore_errors=True)


def run_all(opts: Options, workload: Workload | None = None) -> list[Run]:
    """Every round, every system in it (the order rotated by one each round)."""
    check_built(opts.systems)
    workload = workload or build(opts.events, opts.programs, opts.replay_fraction)
    print(
        f"[peers] {workload.records:,} records ({len(workload.events):,} account events of which "
        f"{workload.replays:,} replays, {len(workload.logins):,} logins), {len(workload.expected):,} programs",
        flush=True,
    )
    runs: list[Run] = []
    systems = list(opts.systems)
    for round_no in range(1, opts.rounds + 1):
        shift = (round_no - 1) % len(systems)
        for system in systems[shift:] + systems[:shift]:
            run = run_system(system, round_no, workload, opts)
            runs.append(run)
            rate = f"{run.rate:,.0f} records/s in {run.seconds:.2f}s" if run.rate and run.seconds else "never exact"
            exact = "" if run.exact is None else f", {run.exact}/{run.programs} programs exact"
            print(
                f"[peers] round {round_no}: {system}: {rate}{exact}, peak RSS {run.peak_rss_bytes / 2**20:,.0f} MiB", flush=True
            )
    return runs


# -- the table -------------------------------------------------------------------------------


def summarize(runs: Sequence[Run], systems: Sequence[str]) -> list[Summary]:
    out: dict[str, Summary] = {}
    for system in systems:
        mine = [r for r in runs if r.system == system]
        if not mine:
            continue
        done = [r.rate for r in mine if r.ok and r.rate]
        exacts = [r.exact for r in mine if r.exact is not None]
        out[system] = Summary(
            system=system,
            rates=[r.rate if r.ok else None for r in mine],
            exact_min=min(exacts) if exacts else None,
            programs=mine[0].programs,
            peak_rss_max=max(r.peak_rss_bytes for r in mine),
            median=statistics.median(done) if len(done) == len(mine) else None,
        )
    bare = out["aiokafka"].median if "aiokafka" in out else None
    kstreams = out["kafka-streams"].median if "kafka-streams" in out else None
    for s in out.values():
        if s.median is not None:
            s.vs_bare = s.median / bare if bare else None
            s.vs_kstreams = s.median / kstreams if kstreams else None
    return list(out.values())


def _ratio(x: float | None) -> str:
    if x is None:
        return DASH
    return f"{x:.2f}{TIMES}" if x >= 1 else f"{x:.3g}{TIMES}"


def table(summaries: Sequence[Summary]) -> str:
    lines = [
        "| system | records/s (median) | rounds | vs bare consumer | vs Kafka Streams | programs exact | peak RSS |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for s in summaries:
        rounds = ", ".join(f"{r:,.0f}" if r else "failed" for r in s.rates)
        median = f"**{s.median:,.0f}**" if s.median else "not exact"
        exact = DASH if s.exact_min is None else f"{s.exact_min:,}/{s.programs:,}"
        lines.append(
            f"| {LABELS[s.system]} | {median} | {rounds} | {_ratio(s.vs_bare)} | {_ratio(s.vs_kstreams)} "
            f"| {exact} | {s.peak_rss_max / 2**20:,.0f} MiB |"
        )
    return "\n".join(lines)


def record(summaries: Sequence[Summary], opts: Options) -> None:
    """Each system's median rate and peak RSS in the results file; statefleet's with the bare
    consumer as its baseline, and statefleet against Kafka Streams."""
    mode = "exactly_once" if opts.exactly_once else "at_least_once"
    how = f"{opts.events:,} records, median of {opts.rounds} rounds, {mode}"
    by_system = {s.system: s for s in summaries}
    bare = by_system["aiokafka"].median if "aiokafka" in by_system else None
    suffix = "_eos" if opts.exactly_once else ""
    for s in summaries:
        if s.system == "aiokafka":
            continue
        results.record(f"peers.{s.system}{suffix}", s.median, "records/s", baseline=bare, note=how)
        results.record(f"peers.{s.system}{suffix}.peak_rss", s.peak_rss_max / 2**20, "MiB", note=how)
    ours, theirs = by_system.get("statefleet"), by_system.get("kafka-streams")
    if ours and theirs and ours.median and theirs.median:
        results.record(f"peers.statefleet_vs_kafka_streams{suffix}", ours.median, "records/s", baseline=theirs.median, note=how)


def parse_args(argv: list[str]) -> tuple[Options, str | None]:
    parser = argparse.ArgumentParser(prog="python -m tools.bench peers", description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=Options.events, help="input records in all (default %(default)s)")
    parser.add_argument("--programs", type=int, default=Options.programs)
    parser.add_argument("--rounds", type=int, default=Options.rounds)
    parser.add_argument(
        "--systems", nargs="+", default=list(SYSTEMS), help=f"any of {', '.join(SYSTEMS)} (space- or comma-separated)"
    )
    parser.add_argument("--replays", type=float, default=0.0, help="fraction of the records that are replayed account events")
    parser.add_argument(
        "--exactly-once", action="store_true", help="statefleet exactly_once, Kafka Streams exactly_once_v2, Quix exactly-once"
    )
    parser.add_argument("--timeout", type=float, default=Options.timeout_s, help="seconds per system and round")
    parser.add_argument("--kstreams-threads", type=int, default=1)
    parser.add_argument("--java-opt", action="append", default=[], help="a JVM option for Kafka Streams (repeatable)")
    parser.add_argument("--json", help="write every run and the summary to this file")
    args, _ = parser.parse_known_args(argv)
    systems = tuple(s for item in args.systems for s in item.split(",") if s)
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        parser.error(f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
    opts = Options(
        events=args.events,
        programs=args.programs,
        rounds=args.rounds,
        systems=systems,
        replay_fraction=args.replays,
        exactly_once=args.exactly_once,
        timeout_s=args.timeout,
        kstreams_threads=args.kstreams_threads,
        java_opts=tuple(args.java_opt),
    )
    return opts, args.json


def main(argv: list[str]) -> None:
    opts, json_path = parse_args(argv)
    at_start = describe_machine()
    print(f"[peers] machine: {at_start}", flush=True)
    print(
        f"[peers] broker {bootstrap()}; systems {', '.join(opts.systems)}; {opts.rounds} round(s); "
        f"{'exactly-once' if opts.exactly_once else 'at-least-once'}",
        flush=True,
    )
    started = time.perf_counter()
    try:
        runs = run_all(opts)
    except PeersError as exc:
        print(f"[peers] {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from exc
    summaries = summarize(runs, opts.systems)
    record(summaries, opts)
    print(f"\n{table(summaries)}\n", flush=True)
    print(f"[peers] done in {time.perf_counter() - started:.0f}s", flush=True)
    if json_path:
        Path(json_path).write_bytes(
            orjson.dumps(
                {
                    "machine": at_start,
                    "options": asdict(opts),
                    "runs": [asdict(r) for r in runs],
                    "summary": [asdict(s) for s in summaries],
                },
                option=orjson.OPT_INDENT_2,
            )
        )
    if not all(r.ok for r in runs):
        print("[peers] FAILED: some system's output was not exact", file=sys.stderr, flush=True)
        raise SystemExit(1)
