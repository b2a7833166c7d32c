"""Deleting the topics of a prefix (what the tests and benchmarks clean up with), on the real broker."""

from __future__ import annotations

import asyncio
import uuid

from shared.engine.clients import PlainAdmin, client_kwargs, delete_topics_with_prefix
from shared.settings import Settings
from tests.support.kafka import create_topics
from tests.support.services import wait_for_async


async def test_the_topics_of_a_prefix_are_deleted_and_no_others(kafka_bootstrap: str, prefix: str) -> None:
    settings = Settings(kafka_bootstrap_servers=kafka_bootstrap)
    # Starts with the prefix's first letter but not the prefix: kept.
    kept = f"{prefix[:-1]}x.kept-{uuid.uuid4().hex[:6]}"
    mine = [f"{prefix}a", f"{prefix}b-changelog"]
    await asyncio.to_thread(create_topics, [*mine, kept])
    try:
        assert await delete_topics_with_prefix(settings, prefix) == sorted(mine)

        async def topics() -> set[str]:
            admin = PlainAdmin(**client_kwargs(settings))
            await admin.start()
            try:
                return set(await admin.list_topics())
            finally:
                await admin.close()

        async def mine_gone() -> set[str] | None:
            names = await topics()
            return None if set(mine) & names else names

        names = await wait_for_async(mine_gone, message=f"{mine} to leave the topic list")
        assert kept in names
        assert await delete_topics_with_prefix(settings, prefix) == []
    finally:
        await delete_topics_with_prefix(settings, kept)
