"""What the forwarding reads of the engine, stood in for without a broker: the owner of each
partition, this instance's copy of it, and the instances the last assignment named."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shared.engine import Copy
from shared.http import forwarding


def stand_in_engine(
    monkeypatch: pytest.MonkeyPatch, *, owner: Callable[[int], str | None], copy: Callable[[], Copy | None],
    instances: set[str],
) -> None:
    async def local_copy(app: Any, table: Any, partition: int) -> Copy | None:
        return copy()

    monkeypatch.setattr(forwarding, "local_copy", local_copy)
    monkeypatch.setattr(forwarding, "partition_owner_url", lambda app, table, p: owner(p))
    monkeypatch.setattr(forwarding, "known_instance_urls", lambda app: instances)
