"""One validator process for the whole module (its own topic prefix), plus helpers to
read what it wrote."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.environment import service_environment
from tests.support.kafka import Record, read_all
from tests.support.services import ServiceProcess, wait_for


@dataclass
class Validator:
    proc: ServiceProcess
    prefix: str

    def topic(self, base: str) -> str:
        return f"{self.prefix}{base}"

    @property
    def commands(self) -> str:
        return self.topic("account-commands")

    def records(self, base: str) -> list[Record]:
        return read_all(self.topic(base))

    def values(self, base: str, account_id: str) -> list[dict[str, Any]]:
        """JSON values on ``base`` for one account, in topic order."""
        return [orjson.loads(r.value) for r in self.records(base) if r.key == account_id.encode() and r.value]

    def wait_answers(self, account_ids: set[str], count: int, timeout: float = 30) -> None:
        """Until events plus rejections for ``account_ids`` number ``count``."""

        def answered() -> int | None:
            n = sum(
                1
                for base in ("account-events", "account-rejections")
                for r in self.records(base)
                if r.key is not None and r.key.decode() in account_ids
            )
            return n if n >= count else None

        wait_for(answered, timeout=timeout, interval=0.5, message=f"{count} answers for {sorted(account_ids)}")


@pytest.fixture(scope="module")
def validator(kafka_bootstrap: str, module_prefix: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Validator]:
    tmp: Path = tmp_path_factory.mktemp("validator")
    env = service_environment(kafka_bootstrap, module_prefix, tmp / "data", instance="i1")
    proc = ServiceProcess("validator", env, tmp / "validator.log").start()
    try:
        proc.wait_ready()
        yield Validator(proc=proc, prefix=module_prefix)
    finally:
        proc.kill()
