"""``make chaos``: the whole fleet (2 instances of each service) on its own broker, a
seeded load through the public contract, an instance SIGKILLed every 10-20 s (sometimes
with its data dir deleted) and the broker once; then everything checked against a
reference model of the contract. Exits 1 on anything lost or wrong.

    python -m tools.chaos --seconds 600 --seed 7 [--guarantee exactly_once]

With ``--guarantee exactly_once`` every service runs in that mode, the topics are read
``read_committed``, and a single duplicate delivered fails the run.

With ``--brokers N`` (N > 1; ``make chaos BROKERS=3``) the broker is a cluster of N KRaft nodes
(replication 3, min ISR 2), and instead of the one broker kill, the node leading the most of
the fleet's partitions (sometimes a group's or a transaction's coordinator) is SIGKILLed and
started again a few seconds later, again and again; the summary says what that cost (the
validator's longest processing pause, failed reads): see ``tools/chaos/nodes.py``.

The run has its own broker (it kills it), fleet home and ports, never those of
``make up`` or ``make test``: ``--home`` (``.local/chaos``), ``--broker-port`` (29092, or
the next free one), ``--port-offset`` (20000, or the next free one). Everything it
started is stopped at the end, on failure too.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

REPO = Path(__file__).resolve().parents[2]


def _env_default(name: str, fallback: str) -> str:
    return os.environ.get(name) or fallback


#: The ports of the run's instances before the offset (2 per service: port and port + 10).
SERVICE_PORTS = (8001, 8011, 8002, 8012, 8003, 8013)


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _first_free(base: int, ports: Callable[[int], tuple[int, ...]], step: int = 100, tries: int = 50) -> int:
    """The first of ``base``, ``base + step``, ... whose ``ports`` are all free."""
    for n in range(tries):
        if all(_port_free(p) for p in ports(base + n * step)):
            return base + n * step
    raise SystemExit(f"no free ports for the chaos run from {base} on (step {step})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--seconds",
        type=float,
        default=float(_env_default("STATEFLEET_CHAOS_SECONDS", "120")),
        help="how long the load and the faults last (default 120)",
    )
    parser.add_argument("--seed", type=int, default=int(_env_default("STATEFLEET_CHAOS_SEED", "1")))
    parser.add_argument("--home", type=Path, default=Path(_env_default("STATEFLEET_CHAOS_HOME", str(REPO / ".local" / "chaos"))))
    parser.add_argument(
        "--broker-port",
        type=int,
        default=_env_int("STATEFLEET_CHAOS_BROKER_PORT"),
        help="default: 29092, or the next free one of 29192, 29292, ...",
    )
    parser.add_argument(
        "--port-offset",
        type=int,
        default=_env_int("STATEFLEET_CHAOS_PORT_OFFSET"),
        help="added to the services' ports; default: 20000, or the next free one of 20100, 20200, ...",
    )
    parser.add_argument("--settle", type=float, default=240.0, help="longest wait for the fleet to catch up (s)")
    parser.add_argument(
        "--guarantee",
        choices=("at_least_once", "exactly_once"),
        default=_env_default("STATEFLEET_CHAOS_GUARANTEE", "at_least_once"),
        help="the fleet's STATEFLEET_PROCESSING_GUARANTEE (default at_least_once); with exactly_once "
        "a duplicate delivered fails the run",
    )
    parser.add_argument(
        "--brokers",
        type=int,
        default=int(_env_default("STATEFLEET_CHAOS_BROKERS", "1")),
        help="KRaft nodes of the run's broker (default 1: the broker is killed once); with more, the "
        "node leading the most of the fleet's partitions (or a coordinator's) is killed again and again",
    )
    parser.add_argument("--max-attempts", type=int, default=4, help="the retry scheduler's STATEFLEET_RETRY_MAX_ATTEMPTS")
    args = parser.parse_args(argv)
    # Two runs at once (two worktrees' make test) each find ports of their own.
    if args.brokers < 1:
        parser.error("--brokers must be 1 or more")
    # Node i listens on broker_port + 100 * (i - 1), its controller one above (tools.kafka_broker).
    nodes = range(args.brokers)
    if args.broker_port is None:
        args.broker_port = _first_free(
            29092, lambda base: tuple(p for i in nodes for p in (base + 100 * i, base + 100 * i + 1)), step=100 * args.brokers
        )
    if args.port_offset is None:
        args.port_offset = _first_free(20000, lambda base: tuple(p + base for p in SERVICE_PORTS))
    if args.broker_port == 9092:
        parser.error("the chaos run kills its broker: give it a port of its own, not the shared 9092")
    home = args.home.resolve()
    # Set before tools.fleet is imported (it reads them then); the services inherit them.
    os.environ.update(
        {
            "STATEFLEET_FLEET_HOME": str(home / "fleet"),
            "STATEFLEET_PORT_OFFSET": str(args.port_offset),
            "STATEFLEET_BROKER_PORT": str(args.broker_port),
            "STATEFLEET_BROKER_CONTROLLER_PORT": str(args.broker_port + 1),
            "STATEFLEET_BROKER_HOME": str(home / "broker"),
            "STATEFLEET_BROKERS": str(args.brokers),
            # The fleet's topics replicated as the cluster's own (3 replicas, min ISR 2): with one
            # replica a killed node would take its partitions offline, not move their leaders.
            "STATEFLEET_TOPIC_REPLICATION_FACTOR": str(min(args.brokers, 3)),
            "STATEFLEET_KAFKA_BOOTSTRAP_SERVERS": ",".join(f"127.0.0.1:{args.broker_port + 100 * i}" for i in nodes),
            "STATEFLEET_DATA_DIR": str(home / "fleet" / "data"),
            "STATEFLEET_TOPIC_PREFIX": "",
            "STATEFLEET_TOPIC_PARTITIONS": "4",
            "STATEFLEET_RETRY_MAX_ATTEMPTS": str(args.max_attempts),
            "STATEFLEET_PROCESSING_GUARANTEE": args.guarantee,
            "STATEFLEET_RETRY_BASE_DELAY_MS": "500",
            "STATEFLEET_RETRY_MAX_DELAY_MS": "4000",
            "STATEFLEET_RETRY_POLICY_OVERRIDES": "",
            "STATEFLEET_BROKER_HEAP": _env_default("STATEFLEET_CHAOS_BROKER_HEAP", "512m"),
        }
    )

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt  # runs the clean-up on the way out

    signal.signal(signal.SIGTERM, stop)
    run = importlib.import_module("tools.chaos.run")
    cfg = run.Config(
        seed=args.seed,
        seconds=args.seconds,
        home=home,
        max_attempts=args.max_attempts,
        settle_s=args.settle,
        guarantee=args.guarantee,
        brokers=args.brokers,
    )
    try:
        code: int = run.run(cfg)
    except KeyboardInterrupt:
        print("[chaos] interrupted; what it started is stopped", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
