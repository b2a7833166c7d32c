"""What the forwarding reads of the engine, stood in for without a broker: the owner of each
partition, this instance's copy of it, whether a rebalance is under way, and the instances the
last assignment named."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shared.engine import Copy


class StandInTable:
    """A table as the forwarding reads it (``shared.engine.Table``): owners and copies of its
    partitions, as :func:`stand_in_engine` sets them."""

    name = "stand-in"
    partitions = 8

    def __init__(self) -> None:
        self.owner: Callable[[int], str | None] = lambda partition: None
        self.mine: Callable[[], Copy | None] = lambda: None

    def owner_url(self, partition: int) -> str | None:
        return self.owner(partition)

    def owner_urls(self) -> set[str]:
        return {url for url in map(self.owner, range(self.partitions)) if url is not None}

    async def copy(self, partition: int) -> Copy | None:
        return self.mine()


#: The table the tests route reads of.
TABLE: Any = StandInTable()


class StandInInstance:
    """The running instance as the forwarding reads it (``shared.engine.Instance``), as
    :func:`stand_in_engine` sets it."""

    def __init__(self) -> None:
        self.rebalancing = False
        self.peers: set[str] = set()

    def ready(self) -> bool:
        return True

    def peer_urls(self) -> set[str]:
        return set(self.peers)


#: The instance the tests' contexts stand for.
INSTANCE: Any = StandInInstance()


def stand_in_engine(
    monkeypatch: pytest.MonkeyPatch, *, owner: Callable[[int], str | None], copy: Callable[[], Copy | None], instances: set[str]
) -> None:
    monkeypatch.setattr(TABLE, "owner", owner)
    monkeypatch.setattr(TABLE, "mine", copy)
    monkeypatch.setattr(INSTANCE, "peers", instances)
    monkeypatch.setattr(INSTANCE, "rebalancing", False)
