"""The stall point of the failover tests: it blocks once, at the n-th batch, and says so."""

from __future__ import annotations

import time

import pytest

from shared.engine._faults import BlockPoint


def test_it_blocks_once_at_the_nth_batch() -> None:
    block = BlockPoint("3:0.2")
    durations = []
    for _ in range(5):
        started = time.monotonic()
        block.reached()
        durations.append(time.monotonic() - started)
    assert [d >= 0.2 for d in durations] == [False, False, True, False, False]


def test_unset_it_never_blocks() -> None:
    block = BlockPoint(None)
    started = time.monotonic()
    block.reached()
    assert time.monotonic() - started < 0.05


@pytest.mark.parametrize("spec", ["3", "x:1", "2:soon"])
def test_a_malformed_spec_is_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="STATEFLEET_BLOCK_AT"):
        BlockPoint(spec)
