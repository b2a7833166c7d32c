"""A three-node Kafka cluster of a test's own: its home in a temporary folder, on free ports,
started through the same code as ``make broker BROKERS=3`` and stopped however the test ends."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

from tools import kafka_broker

#: Ports per node: the client listener and the controller's.
PORTS_PER_NODE = 2


def free_port_block(count: int, attempts: int = 100) -> int:
    """The first of ``count`` consecutive ports that are all free now."""
    for _ in range(attempts):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = int(probe.getsockname()[1])
        if first + count > 65535:
            continue
        with contextlib.ExitStack() as held:
            try:
                for port in range(first, first + count):
                    s = held.enter_context(socket.socket())
                    s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return first
    raise RuntimeError(f"found no {count} consecutive free ports in {attempts} tries")


@contextlib.contextmanager
def running_cluster(home: Path, brokers: int = 3) -> Iterator[kafka_broker.BrokerLayout]:
    """Start a cluster of ``brokers`` nodes in ``home`` (the jars: the test broker's), and stop
    every node of it on the way out, also when starting it failed half-way."""
    first = free_port_block(PORTS_PER_NODE * brokers)
    layout = kafka_broker.BrokerLayout(
        home=home,
        port=first,
        controller_port=first + 1,
        brokers=brokers,
        port_step=PORTS_PER_NODE,
        libs_dir=kafka_broker.default_layout().libs,
    )
    try:
        yield kafka_broker.start(layout, wait_s=120.0)
    finally:
        kafka_broker.stop(layout, wait_s=30.0)
