"""Deleting the topics of a prefix (what the tests and benchmarks clean up with), on the real broker."""

from __future__ import annotations

import asyncio
import uuid

from shared.engine.clients import PlainAdmin, client_kwargs, delete_topics_with_prefix
from shared.settings import Settings
from tests.support.kafka import create_topics


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

        deadline = asyncio.get_running_loop().time() + 30
        names = await topics()
        while set(mine) & names and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.25)
            names = await topics()
        assert not set(mine) & names and kept in names
        assert await delete_topics_with_prefix(settings, prefix) == []
    finally:
        await delete_topics_with_prefix(settings, kept)
