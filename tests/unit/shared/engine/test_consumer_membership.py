"""A batch is handed over only while the group still counts this consumer as its member: a
recent heartbeat says so, a silence is answered by one heartbeat first, and a member the
coordinator dropped hands nothing over (see ``shared/engine/_consumer.py``)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP

from shared.engine._consumer import (
    _BATCH_GENERATION,
    MEMBER_CONFIRMED_WITHIN_S,
    WRITE_CONFIRMED_WITHIN_S,
    BatchConsumer,
    NotAMember,
)


class FakeThread:
    def __init__(self, confirmed_ago_s: float, *, current: bool = True, answer: bool = True) -> None:
        self.member_confirmed_at = time.monotonic() - confirmed_ago_s
        self.current = current
        self.answer = answer
        self.asked: list[int] = []

    def member_current(self, generation: int) -> bool:
        return self.current and generation == 5

    async def confirm_member(self, generation: int, timeout_s: float) -> bool:
        self.asked.append(generation)
        await asyncio.sleep(0.01)
        if self.answer:
            self.member_confirmed_at = time.monotonic()
        return self.answer and self.member_current(generation)


def consumer(thread: FakeThread) -> Any:
    return SimpleNamespace(_member_thread=thread, _confirming=asyncio.Lock(), _dropped_generation=None)


def still_member(fake: Any, generation: int = 5) -> bool:
    return asyncio.run(BatchConsumer._still_member(fake, generation))


def test_a_recent_heartbeat_confirms_the_member_without_asking() -> None:
    thread = FakeThread(confirmed_ago_s=1.0)
    assert still_member(consumer(thread))
    assert thread.asked == []


def test_after_a_silence_one_heartbeat_is_sent_first() -> None:
    thread = FakeThread(confirmed_ago_s=MEMBER_CONFIRMED_WITHIN_S + 20)
    fake = consumer(thread)

    async def three_lanes() -> list[bool]:
        return list(await asyncio.gather(*(BatchConsumer._still_member(fake, 5) for _ in range(3))))

    assert asyncio.run(three_lanes()) == [True, True, True]
    assert thread.asked == [5]  # the lanes waited for one answer


@pytest.mark.parametrize(
    "thread",
    [
        FakeThread(confirmed_ago_s=MEMBER_CONFIRMED_WITHIN_S + 20, answer=False),  # removed while stopped
        FakeThread(confirmed_ago_s=1.0, current=False),  # the heartbeat already learnt it
    ],
    ids=["coordinator-says-unknown", "generation-reset"],
)
def test_a_member_the_group_dropped_hands_nothing_over(thread: FakeThread) -> None:
    assert not still_member(consumer(thread))


def test_a_commit_of_a_dropped_member_raises() -> None:
    fake = consumer(FakeThread(confirmed_ago_s=MEMBER_CONFIRMED_WITHIN_S + 20, answer=False))
    fake._still_member = lambda generation: BatchConsumer._still_member(fake, generation)

    async def commit_in_batch() -> None:
        _BATCH_GENERATION.set(5)
        await BatchConsumer.ensure_member(fake)

    with pytest.raises(NotAMember):
        asyncio.run(commit_in_batch())


def writing(thread: FakeThread, delivering: dict[int, int], generation: int = 5) -> Any:
    fake = consumer(thread)
    fake._delivering = delivering
    fake.app = SimpleNamespace(consumer_generation_id=generation)
    fake._still_member = lambda g, within_s: BatchConsumer._still_member(fake, g, within_s)
    return fake


def may_write(fake: Any) -> bool:
    return asyncio.run(BatchConsumer.may_write(fake))


def test_a_commit_writes_without_asking_right_after_a_heartbeat() -> None:
    thread = FakeThread(confirmed_ago_s=0.2)
    assert may_write(writing(thread, {5: 2}))
    assert thread.asked == []


def test_a_commit_write_after_a_freeze_asks_the_coordinator_first() -> None:
    # Longer than a write may go unconfirmed, though short enough for a batch to be handed over.
    thread = FakeThread(confirmed_ago_s=WRITE_CONFIRMED_WITHIN_S + 1)
    assert WRITE_CONFIRMED_WITHIN_S + 1 < MEMBER_CONFIRMED_WITHIN_S
    assert may_write(writing(thread, {5: 1}))
    assert thread.asked == [5]
    dropped = FakeThread(confirmed_ago_s=WRITE_CONFIRMED_WITHIN_S + 1, answer=False)
    assert not may_write(writing(dropped, {5: 1}))


def test_a_batch_of_an_older_generation_still_writing_closes_the_gate() -> None:
    """The member rejoined (generation 5) before a batch fetched in generation 4 got to send:
    that batch's records must not leave, even though the member is confirmed."""
    thread = FakeThread(confirmed_ago_s=0.1)
    assert not may_write(writing(thread, {4: 1, 5: 1}))


def test_with_no_batch_delivering_the_current_generation_decides() -> None:
    assert may_write(writing(FakeThread(confirmed_ago_s=0.1), {}))
    assert not may_write(writing(FakeThread(confirmed_ago_s=0.1, current=False), {}))


def owning(tp: Any, *, assigned: bool = True, flow: bool = True, stopping: bool = False, generation: int = 5) -> Any:
    """A consumer, as ``ensure_owner`` sees it, delivering a batch of generation 5."""
    fake = consumer(FakeThread(confirmed_ago_s=1.0))
    fake._still_member = lambda g: BatchConsumer._still_member(fake, g)
    fake.ensure_member = lambda: BatchConsumer.ensure_member(fake)
    fake.assignment = lambda: {tp} if assigned else set()
    fake.flow_active = flow
    fake.should_stop = stopping
    fake.app = SimpleNamespace(consumer_generation_id=generation)
    return fake


def ensure_owner(fake: Any, tp: Any) -> None:
    async def retry_in_batch() -> None:
        _BATCH_GENERATION.set(5)
        await BatchConsumer.ensure_owner(fake, tp)

    asyncio.run(retry_in_batch())


@pytest.mark.parametrize(
    "change",
    [{"assigned": False}, {"flow": False}, {"stopping": True}, {"generation": 6}],
    ids=["revoked", "rebalancing", "stopping", "next-generation"],
)
def test_a_failed_batch_is_retried_only_while_its_partition_is_still_ours(change: dict[str, Any]) -> None:
    tp = TP("in", 3)
    ensure_owner(owning(tp), tp)  # ours: no error
    with pytest.raises(NotAMember):
        ensure_owner(owning(tp, **change), tp)
