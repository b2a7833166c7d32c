"""exactly_once on the real broker: the validator's transactions are fenced from outside again and
again while it decides a stream of commands (another producer initialises the transactional id
of each input partition, as the coordinator does when it times a transaction out or a broker's
death moves it). The worker does not stop: each failed batch is delivered again with a fresh
producer, after its tables caught up with the changelog. Afterwards a read_committed reader sees
every command decided once: each event once, each final outcome once, no rejection."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import pytest
from aiokafka import AIOKafkaProducer

from shared.engine._producer import transactional_id
from tests.e2e.validator.test_commit_crashes import assert_exactly_once
from tests.e2e.validator.test_validator_crash import COMMAND_PARTITIONS, commands_in_order
from tests.support.kafka import create_topics, produce
from tests.support.services import ServiceProcess, wait_for
from tools import web

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: Retried batches to see before the fencing stops (every one a transaction that failed).
RETRIES_WANTED = 5

RETRIES = re.compile(r'^statefleet_batch_retries_total\{[^}]*reason="([^"]+)"[^}]*\} ([0-9.e+]+)$', re.MULTILINE)


def retries_by_reason(proc: ServiceProcess) -> dict[str, float]:
    text = web.get(f"{proc.url}/metrics", timeout=10).text
    return {reason: float(n) for reason, n in RETRIES.findall(text) if float(n) > 0}


class Fencer:
    """Initialises the transactional id of every input partition, again and again, on a thread of its own."""

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: int, every_s: float) -> None:
        self.ids = [transactional_id(group, topic, p) for p in range(partitions)]
        self.bootstrap = bootstrap
        self.every_s = every_s
        self.fenced = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> Fencer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    async def _run(self) -> None:
        while not self._stop.is_set():
            for tid in self.ids:
                producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, transactional_id=tid, enable_idempotence=True)
                await producer.start()  # InitProducerId: the current owner's epoch is stale from here on
                await producer.stop()
                self.fenced += 1
            await asyncio.sleep(self.every_s)


def test_fenced_transactions_are_retried_and_every_command_is_decided_once(
    service_env: dict[str, str], prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    commands = f"{prefix}account-commands"
    create_topics([commands])  # as the validator creates it: 8 partitions
    env = {
        **service_env,
        "STATEFLEET_INSTANCE_ID": "fenced",
        "STATEFLEET_CONSUMER_MAX_POLL_RECORDS": "100",
        "STATEFLEET_PROCESSING_GUARANTEE": "exactly_once",
    }
    log = tmp_path_factory.mktemp("fenced") / "validator.log"
    proc = ServiceProcess("validator", env, log).start().wait_ready()
    stream = commands_in_order()
    fencer = Fencer(
        service_env["STATEFLEET_KAFKA_BOOTSTRAP_SERVERS"], f"{prefix}statefleet-validator", commands, COMMAND_PARTITIONS, 0.3
    )
    try:
        fencer.start()
        for n in range(0, len(stream), 200):  # steady traffic while the fencing goes on
            produce(commands, stream[n : n + 200])
            time.sleep(0.1)
        wait_for(
            lambda: sum(retries_by_reason(proc).values()) >= RETRIES_WANTED,
            timeout=90,
            interval=0.5,
            message=f"{RETRIES_WANTED} retried batches",
        )
        fencer.stop()
        assert proc.proc is not None and proc.proc.poll() is None, f"the worker stopped; log:\n{proc.log_tail()}"
        assert_exactly_once(prefix, proc)
        assert proc.proc.poll() is None, f"the worker stopped; log:\n{proc.log_tail()}"
        reasons = retries_by_reason(proc)
        assert "We experienced a crash" not in log.read_text(errors="replace")
        print(f"fenced {fencer.fenced} times; batches retried by reason: {reasons}")
    finally:
        fencer.stop()
        proc.kill()
