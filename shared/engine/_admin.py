"""Create the topics a service needs, with the right partitions and configs, before
its worker starts. Existing topics are left as they are (a partition count that does
not match is logged, since co-partitioned topics must agree). And delete the topics of a
prefix, for the tests and benchmarks that make topics of their own."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from shared.engine._access import check_created, check_group, check_visible
from shared.engine._clients import client_kwargs, started_when_reachable
from shared.settings import Settings

log = logging.getLogger(__name__)


class _Admin(AIOKafkaAdminClient):  # type: ignore[misc]
    """aiokafka's admin client, stopped by ``stop`` like its other clients."""

    async def stop(self) -> None:
        await self.close()


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    compacted: bool = False
    config: dict[str, str] = field(default_factory=dict)

    def new_topic(self, replication: int) -> NewTopic:
        config = dict(self.config)
        if self.compacted:
            config.setdefault("cleanup.policy", "compact")
        return NewTopic(self.name, self.partitions, replication, topic_configs=config)


async def ensure_topics_async(settings: Settings, specs: list[TopicSpec], group: str | None = None) -> None:
    """Create what is missing of ``specs``, waiting for the brokers to answer if they do not yet.

    Raises :class:`~shared.engine._access.BrokerAccessDenied` when the brokers refuse these
    settings' credentials, or the ACLs deny the topics (or consumer ``group``) to their user."""
    admin = await started_when_reachable(lambda: _Admin(**client_kwargs(settings)), "topic creation", settings)
    try:
        existing = set(await admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        if missing:
            try:
                response = await admin.create_topics([s.new_topic(settings.topic_replication_factor) for s in missing])
                existed = check_created(settings, response)
                log.info("created topics %s", ", ".join(s.name for s in missing if s.name not in existed))
            except TopicAlreadyExistsError:
                existed = []
            if existed:
                # Created meanwhile by another instance, or there all along but hidden from this user.
                check_visible(settings, await admin.describe_topics(existed))
        if group is not None:
            await check_group(settings, admin, group)
        present = [s for s in specs if s.name in existing]
        if present:
            described = await admin.describe_topics([s.name for s in present])
            counts = {d["topic"]: len(d["partitions"]) for d in described}
            for spec in present:
                if counts.get(spec.name, spec.partitions) != spec.partitions:
                    log.warning(
                        "topic %s has %s partitions, expected %s: keys may not be co-partitioned",
                        spec.name,
                        counts[spec.name],
                        spec.partitions,
                    )
    finally:
        await admin.close()


def ensure_topics(settings: Settings, specs: list[TopicSpec], group: str | None = None) -> None:
    asyncio.run(ensure_topics_async(settings, specs, group))


async def delete_topics_with_prefix(settings: Settings, prefix: str) -> list[str]:
    """Delete every topic whose name starts with ``prefix`` (what a test or a benchmark run
    created under a prefix of its own); returns their names."""
    admin = _Admin(**client_kwargs(settings))
    await admin.start()
    try:
        names = sorted(name for name in await admin.list_topics() if name.startswith(prefix))
        if names:
            await admin.delete_topics(names)
        return names
    finally:
        await admin.close()
