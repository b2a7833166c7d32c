"""The chaos run itself: its own broker and fleet, the load, the faults, the settle
wait and the verdict. Imported by ``python -m tools.chaos`` once the environment names
the run's own broker and fleet home (``tools.fleet`` reads them at import)."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from shared.engine.clients import PlainConsumer, refresh_metadata
from tools import fleet, kafka_broker
from tools.chaos.load import Load, Topics
from tools.chaos.nodes import NodeFaults, PauseWatch, ReadProbe, choose_victim, kill_and_restart
from tools.chaos.observe import Answer, Observed, ask_all, list_topics, read_topics
from tools.chaos.plan import Plan, build
from tools.chaos.verify import Report, TopicConfig, verify

INSTANCES = 2
#: An instance is looked at by the restarter only this long after it was started.
START_GRACE_S = 20.0


@dataclass(frozen=True)
class Config:
    seed: int
    seconds: float
    home: Path
    max_attempts: int
    settle_s: float
    guarantee: str = "at_least_once"
    kill_every: tuple[float, float] = (10.0, 20.0)
    #: Chance that a killed instance's data dir is deleted before it is started again.
    wipe_chance: float = 0.3
    ready_timeout_s: float = 240.0
    #: KRaft nodes of the run's broker; with more than one, nodes are killed instead of the broker.
    brokers: int = 1
    #: With several nodes: the wait between one node's restart and the next node kill, and how
    #: long a killed node stays down.
    node_kill_every: tuple[float, float] = (8.0, 14.0)
    node_down_s: tuple[float, float] = (3.0, 6.0)


@dataclass
class Faults:
    log: list[str] = field(default_factory=list)
    kills: int = 0
    wipes: int = 0
    broker_kills: int = 0
    nodes: NodeFaults = field(default_factory=NodeFaults)
    #: Instances found exited that nobody killed (e.g. started while the broker was down), started again.
    exited: list[str] = field(default_factory=list)
    #: When each instance was last started (a process just started may not show its command line yet).
    started: dict[str, float] = field(default_factory=dict)

    def settled(self, kind: fleet.ServiceKind, n: int) -> bool:
        return time.monotonic() - self.started.get(f"{kind.name}-{n}", 0.0) > START_GRACE_S


def say(message: str) -> None:
    print(message, flush=True)


class Clock:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self) -> str:
        return f"[chaos {time.monotonic() - self.start:6.1f}s]"


def instances() -> list[tuple[fleet.ServiceKind, int]]:
    return [(kind, n) for kind in fleet.SERVICES for n in range(INSTANCES)]


def urls(name: str) -> list[str]:
    kind = next(k for k in fleet.SERVICES if k.name == name)
    return [fleet.url(kind, n) for n in range(INSTANCES)]


def start_broker(layout: kafka_broker.BrokerLayout) -> None:
    kafka_broker.start(layout, wait_s=180.0)


def wait_fleet_ready(timeout: float, now: Callable[[], str], faults: Faults | None = None) -> None:
    for kind, n in instances():
        if fleet.pid_of(kind, n) is None:
            if faults is not None:  # after the faults began: it exited on its own, and that is reported
                _restart_exited(kind, n, faults, now)
                continue
            say(f"{now()} {kind.name}-{n} is not running: starting it")
            fleet.start_instance(kind, n)
    deadline = time.monotonic() + timeout
    for kind, n in instances():
        if not fleet.wait_ready(kind, n, max(1.0, deadline - time.monotonic())):
            pid = fleet.pid_of(kind, n)
            state = "exited"
            if pid is not None:
                # mode's worker writes every thread's stack and every asyncio task's to its log
                # on SIGUSR1: where it waits, for whoever reads the log after the run.
                os.kill(pid, signal.SIGUSR1)
                time.sleep(2)
                state = f"still running; its stacks and tasks are in its log (SIGUSR1 to pid {pid})"
            log_path = fleet.LOG_DIR / f"{kind.name}-{n}.log"
            raise RuntimeError(
                f"{kind.name}-{n} not ready within {timeout:.0f}s ({state}); see {log_path}; its last warnings:\n"
                + "\n".join(last_warnings(log_path))
            )


def last_warnings(log_path: Path, count: int = 40) -> list[str]:
    """The last ``count`` lines of a service's log at WARNING or above (or its last lines when
    none is), so that a run that fails on an unready instance carries the reason in its own
    output: a CI log outlives the run's directory."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return [f"(the log cannot be read: {exc})"]
    loud = [line for line in lines if any(level in line for level in ("WARNING", "ERROR", "CRITICAL", "Traceback"))]
    return (loud or lines)[-count:]


async def partitions_of(bootstrap: str, topics: list[str], wait_s: float = 120.0) -> int:
    """The partition count of the fleet's input topics (the services create them)."""
    deadline = time.monotonic() + wait_s
    while True:
        records = await read_partition_counts(bootstrap, topics)
        counts = set(records.values())
        if len(records) == len(topics) and len(counts) == 1 and 0 not in counts:
            return counts.pop()
        if time.monotonic() > deadline:
            raise RuntimeError(f"the fleet did not create {topics} with one partition count: {records}")
        await asyncio.sleep(1)


async def read_partition_counts(bootstrap: str, topics: list[str]) -> dict[str, int]:
    consumer = PlainConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        await refresh_metadata(consumer)
        return {t: len(consumer.partitions_for_topic(t) or ()) for t in topics}
    finally:
        await consumer.stop()


async def run_faults(
    cfg: Config, layout: kafka_broker.BrokerLayout, stop_at: float, faults: Faults, now: Callable[[], str]
) -> None:
    rng = random.Random(cfg.seed * 31 + 7)
    node_rng = random.Random(cfg.seed * 31 + 11)
    start = time.monotonic()
    broker_at = start + (stop_at - start) * rng.uniform(0.3, 0.6)
    next_kill = start + rng.uniform(*cfg.kill_every)
    next_node_kill = start + node_rng.uniform(*cfg.node_kill_every)
    node_task: asyncio.Task[None] | None = None
    while time.monotonic() < stop_at:
        if cfg.brokers == 1 and not faults.broker_kills and time.monotonic() >= broker_at:
            await asyncio.to_thread(_kill_broker, layout, faults, now)
        if node_task is not None and node_task.done():
            node_task.result()  # a node that did not come back fails the run
            node_task = None
            next_node_kill = time.monotonic() + node_rng.uniform(*cfg.node_kill_every)
        if cfg.brokers > 1 and node_task is None and time.monotonic() >= next_node_kill:
            # One node down at a time: with replication 3 and min ISR 2 every partition stays writable.
            node_task = asyncio.create_task(_kill_node(cfg, layout, node_rng, faults, now))
        if time.monotonic() >= next_kill:
            kind, n = rng.choice(instances())
            wipe = rng.random() < cfg.wipe_chance
            await asyncio.to_thread(_kill_instance, kind, n, wipe, faults, now)
            next_kill = time.monotonic() + rng.uniform(*cfg.kill_every)
        # Like an orchestrator, start again what exited on its own.
        for kind, n in instances():
            if faults.settled(kind, n) and fleet.pid_of(kind, n) is None:
                await asyncio.to_thread(_restart_exited, kind, n, faults, now)
        await asyncio.sleep(0.25)
    if node_task is not None:
        await node_task  # the last node killed is started again before the run settles


async def _kill_node(
    cfg: Config, layout: kafka_broker.BrokerLayout, rng: random.Random, faults: Faults, now: Callable[[], str]
) -> None:
    nodes = [node.node_id for node in layout.nodes]
    try:
        node_id, why = await choose_victim(layout.bootstrap, nodes, rng, cfg.guarantee == "exactly_once")
    except Exception as exc:  # the metadata could not be had: any node will do
        node_id, why = rng.choice(nodes), f"at random ({type(exc).__name__})"
    down_s = rng.uniform(*cfg.node_down_s)
    faults.nodes.kills += 1
    faults.nodes.reasons[why] += 1
    faults.nodes.log.append(f"{now()} node {node_id} ({why}) down for {down_s:.0f}s")
    say(f"{now()} killing broker node {node_id}: {why}")
    await asyncio.to_thread(kill_and_restart, layout, node_id, down_s, lambda message: say(f"{now()} {message}"))


def _restart_exited(kind: fleet.ServiceKind, n: int, faults: Faults, now: Callable[[], str]) -> None:
    log = fleet.LOG_DIR / f"{kind.name}-{n}.log"
    tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
    note = f"{kind.name}-{n} exited on its own ({tail[0][:160] if tail else 'no log'}); started again"
    faults.exited.append(f"{now()} {note}")
    say(f"{now()} {note}")
    fleet.start_instance(kind, n)
    faults.started[f"{kind.name}-{n}"] = time.monotonic()


def _kill_instance(kind: fleet.ServiceKind, n: int, wipe: bool, faults: Faults, now: Callable[[], str]) -> None:
    pid = fleet.kill_instance(kind, n)
    if pid is None:
        note = f"{kind.name}-{n} was not running; starting it"
    else:
        fleet.reap(pid)
        faults.kills += 1
        note = f"SIGKILL {kind.name}-{n} (pid {pid})"
        if wipe:
            shutil.rmtree(fleet.instance_data_dir(kind, n), ignore_errors=True)
            faults.wipes += 1
            note += ", data dir deleted"
    fleet.start_instance(kind, n)
    faults.started[f"{kind.name}-{n}"] = time.monotonic()
    faults.log.append(f"{now()} {note}; restarted")
    say(f"{now()} {note}; restarted")


def _kill_broker(layout: kafka_broker.BrokerLayout, faults: Faults, now: Callable[[], str]) -> None:
    pid = int(layout.pid_file.read_text())
    os.kill(pid, signal.SIGKILL)
    fleet.reap(pid, timeout=60)
    faults.broker_kills += 1
    say(f"{now()} SIGKILL the broker (pid {pid}); restarting it on the same storage")
    time.sleep(2.0)
    start_broker(layout)
    faults.log.append(f"{now()} SIGKILL the broker (pid {pid}); restarted on the same storage")
    say(f"{now()} the broker is back")


async def observe(plan: Plan, bootstrap: str, topics: TopicConfig, cache: dict[str, Answer], isolation_level: str) -> Observed:
    names = await list_topics(bootstrap)
    retry_topics = sorted(t for t in names if t == topics.retry or t.startswith(topics.retry + "-"))
    wanted = ["account-events", "account-rejections", "program-tallies", "dead-letters", topics.parking_lot, *retry_topics]
    read = await read_topics(bootstrap, [t for t in wanted if t in names], isolation_level=isolation_level)
    observed = Observed(
        events=read.get("account-events", []),
        rejections=read.get("account-rejections", []),
        tallies=read.get("program-tallies", []),
        dead_letters=read.get("dead-letters", []),
        retries={t: read.get(t, []) for t in retry_topics},
        parking_lot=read.get(topics.parking_lot, []),
    )
    model = plan.model
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=2.0)) as client:
        # An outcome once decided does not change: ask only for those not decided yet.
        undecided = [c for c in model.outcomes if not _decided(cache.get(c))]
        cache.update(await ask_all(client, urls("validator"), "/commands", undecided))
        observed.commands_http = dict(cache)
        observed.accounts_http = await ask_all(client, urls("validator"), "/accounts", sorted(model.named_accounts))
        programs = model.programs | {(r.key or b"").decode(errors="replace") for r in observed.tallies}
        observed.tallies_http = await ask_all(client, urls("tallies"), "/tallies", sorted(programs))
        parked = [s.dlq_id for s in plan.dead_letters if s.dlq_id is not None]
        observed.parked_http = await ask_all(client, urls("retry-scheduler"), "/parked", parked)
    return observed


def _decided(answer: Answer | None) -> bool:
    return isinstance(answer, dict) and answer.get("status") in ("accepted", "rejected")


async def chaos(cfg: Config, layout: kafka_broker.BrokerLayout) -> int:
    now = Clock()
    bootstrap = layout.bootstrap
    topics = TopicConfig(max_attempts=cfg.max_attempts)
    exactly_once = cfg.guarantee == "exactly_once"
    # exactly_once promises each record once to committed readers, and only to them.
    isolation_level = "read_committed" if exactly_once else "read_uncommitted"
    say(f"{now()} starting the broker on {bootstrap} (home {layout.home})")
    await asyncio.to_thread(start_broker, layout)
    say(f"{now()} starting {INSTANCES} instances of each service (logs in {fleet.LOG_DIR})")
    for kind, n in instances():
        fleet.start_instance(kind, n)
    await asyncio.to_thread(wait_fleet_ready, cfg.ready_timeout_s, now)
    partitions = await partitions_of(bootstrap, ["account-commands", "logins", "dead-letters"])
    plan = build(cfg.seed, duration_s=cfg.seconds, max_attempts=cfg.max_attempts, retry_topic=topics.retry)
    say(
        f"{now()} fleet ready ({partitions} partitions per topic); seed {cfg.seed}: {plan.commands} commands, "
        f"{len(plan.model.named_accounts)} accounts, {len(plan.poison)} poison records, "
        f"{len(plan.dead_letters)} dead letters, {plan.steps()} steps over {cfg.seconds:.0f}s"
    )

    faults = Faults()
    load = Load(
        plan,
        bootstrap=bootstrap,
        validator_urls=urls("validator"),
        partitions=partitions,
        topics=Topics(),
        duration_s=cfg.seconds,
        deadline_s=cfg.seconds + 600,
    )
    stop_at = time.monotonic() + cfg.seconds
    load_task = asyncio.create_task(load.run())
    fault_task = asyncio.create_task(run_faults(cfg, layout, stop_at, faults, now))
    # What the faults cost while they happen (see tools/chaos/nodes.py).
    pauses = PauseWatch(bootstrap)
    probe = ReadProbe(urls("validator"), sorted(plan.model.named_accounts))
    watchers = [asyncio.create_task(pauses.run(stop_at, time.monotonic())), asyncio.create_task(probe.run(stop_at))]
    total = plan.steps()
    while not (load_task.done() and fault_task.done()):
        await asyncio.wait({load_task, fault_task}, timeout=10, return_when=asyncio.FIRST_EXCEPTION)
        for task in (load_task, fault_task):
            if task.done() and task.exception() is not None:
                load_task.cancel()
                fault_task.cancel()
                raise task.exception()  # type: ignore[misc]
        say(
            f"{now()} load: {load.done_steps}/{total} steps sent; {faults.kills} instances killed "
            f"({faults.wipes} wiped), "
            + (f"broker killed {faults.broker_kills}x" if cfg.brokers == 1 else f"broker nodes killed {faults.nodes.kills}x")
        )
    stats = load_task.result()
    await asyncio.gather(*watchers, return_exceptions=True)
    say(f"{now()} load done: " + ", ".join(f"{k} {v}" for k, v in sorted(stats.sent.items())))

    await asyncio.to_thread(wait_fleet_ready, cfg.ready_timeout_s, now, faults)
    say(f"{now()} every instance ready; settling (at most {cfg.settle_s:.0f}s)")
    deadline = time.monotonic() + cfg.settle_s
    cache: dict[str, Answer] = {}
    while True:
        try:
            observed = await observe(plan, bootstrap, topics, cache, isolation_level)
        except Exception as exc:  # the broker or an instance not answering yet: look again
            if time.monotonic() > deadline:
                raise
            say(f"{now()} settling: could not read everything yet ({type(exc).__name__}: {exc})")
            await asyncio.sleep(5)
            continue
        report = verify(plan, stats.dead_letter_headers, observed, topics, exactly_once=exactly_once)
        if report.ok or report.settled or time.monotonic() > deadline:
            break  # settled: nothing missing any more, so waiting cannot undo what is wrong
        say(
            f"{now()} settling: lost {report.lost}, wrong {report.wrong}, wrong tallies {report.wrong_tallies}, "
            f"dead letters lost {report.dead_letters_lost}"
        )
        await asyncio.sleep(5)
    print_summary(cfg, plan, faults, report, now, pauses, probe)
    return 0 if report.ok else 1


def print_summary(
    cfg: Config,
    plan: Plan,
    faults: Faults,
    report: Report,
    now: Callable[[], str],
    pauses: PauseWatch | None = None,
    probe: ReadProbe | None = None,
) -> None:
    broker = (
        f"the broker SIGKILLed {faults.broker_kills}x"
        if cfg.brokers == 1
        else f"{faults.nodes.kills} of {cfg.brokers} broker nodes SIGKILLed and started again ("
        + ", ".join(f"{n} {why}" for why, n in sorted(faults.nodes.reasons.items()))
        + ")"
    )
    say(
        f"{now()} faults: {faults.kills} instances SIGKILLed ({faults.wipes} with their data dir deleted), "
        f"{broker}; {len(faults.exited)} exited on their own and were started again"
    )
    for line in faults.exited:
        say(f"  {line}")
    if pauses is not None and probe is not None:
        say(
            f"{now()} cost of the faults: the validator's longest processing pause {pauses.longest_s:.1f}s "
            f"(from {pauses.longest_at:.0f}s into the load); reads {probe.failed} failed of {probe.reads}, "
            f"longest failing {probe.longest_failing_s:.1f}s"
        )
    if report.problems:
        say(f"problems ({len(report.problems)}; the first 40):")
        for problem in report.problems[:40]:
            say(f"  {problem}")
    nodes = f", {cfg.brokers} broker nodes" if cfg.brokers > 1 else ""
    say(f"\nchaos run, seed {cfg.seed}, {cfg.seconds:.0f}s, {INSTANCES} instances per service{nodes}, {cfg.guarantee}:")
    say(report.table())
    if report.ok:
        result = "nothing lost, nothing wrong" + (", nothing delivered twice" if report.exactly_once else "")
    else:
        result = f"FAILED (logs in {fleet.LOG_DIR})"
    say("result: " + result)


def teardown(layout: kafka_broker.BrokerLayout) -> None:
    say("[chaos] stopping the fleet and the broker")
    fleet.down()
    kafka_broker.stop(layout)


def run(cfg: Config) -> int:
    # The client library's own retries while the broker is away are expected here: the
    # progress lines say what happens; the services' logs keep their own.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    layout = kafka_broker.default_layout()
    home = cfg.home.resolve()
    for what, path in (("fleet home", fleet.FLEET_HOME), ("broker home", layout.home.resolve())):
        if not path.is_relative_to(home):
            raise SystemExit(f"the chaos run kills its broker and deletes its {what}: {path} must be under {home}")
    # A fresh fleet and broker storage each run (the broker's resolved jars are kept).
    shutil.rmtree(fleet.FLEET_HOME, ignore_errors=True)
    # Every node's storage, and the cluster id kept beside them: a node formatted afresh among
    # nodes that kept a former run's storage would not form one cluster with them, and the
    # former run's records (the same seed, the same ids) would be read as this run's.
    kafka_broker.reset_storage(layout)
    try:
        return asyncio.run(chaos(cfg, layout))
    finally:
        teardown(layout)
