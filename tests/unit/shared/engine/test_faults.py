"""The stall points of the failover tests: the block runs once, at the n-th batch, and says so;
the stop (SIGSTOP) happens once, at its handler's point, in a batch that writes rows."""

from __future__ import annotations

import signal
import time

import pytest

from shared.engine._faults import BlockPoint, StopPoint


def test_it_blocks_once_at_the_nth_batch() -> None:
    # A block long enough that no scheduling delay on a loaded machine passes for one.
    block = BlockPoint("3:1.0")
    durations = []
    for _ in range(5):
        started = time.monotonic()
        block.reached()
        durations.append(time.monotonic() - started)
    assert [d >= 1.0 for d in durations] == [False, False, True, False, False]


def test_unset_it_never_blocks() -> None:
    block = BlockPoint(None)
    started = time.monotonic()
    for _ in range(1000):
        block.reached()
    assert time.monotonic() - started < 0.5 and block.remaining == 0


@pytest.mark.parametrize("spec", ["3", "x:1", "2:soon"])
def test_a_malformed_spec_is_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="STATEFLEET_BLOCK_AT"):
        BlockPoint(spec)


def test_a_stop_point_stops_only_at_its_handler_point_and_count(monkeypatch: pytest.MonkeyPatch) -> None:
    stops: list[int] = []
    monkeypatch.setattr("shared.engine._faults.os.kill", lambda pid, sig: stops.append(sig))
    point = StopPoint("tallies.by-program:sent:2")
    point.reached("sent", "tallies.inputs", True)  # another handler
    point.reached("sent", "tallies.by-program", False)  # a batch with no rows
    point.reached("logged", "tallies.by-program", True)  # another point
    point.reached("sent", "tallies.by-program", True)
    assert stops == []
    point.reached("sent", "tallies.by-program", True)
    assert stops == [signal.SIGSTOP]
    point.reached("sent", "tallies.by-program", True)
    assert stops == [signal.SIGSTOP]  # once only


@pytest.mark.parametrize("spec", ["sent:2", "tallies.by-program:nowhere:1", "tallies.by-program:sent:0", "a:sent:1:2"])
def test_a_stop_point_refuses_a_spec_it_cannot_follow(spec: str) -> None:
    with pytest.raises(ValueError, match="STATEFLEET_STOP_AT"):
        StopPoint(spec)
