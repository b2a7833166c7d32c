"""Every input topic owned by some member: an assignment that skipped a topic is made again.

Faust's assignor gives out only the partitions of topics its leader finds in its cluster
metadata; a subscribed topic without metadata at that moment is skipped ("Ignoring missing
topic") and nobody owns its partitions. That happens to a fleet starting right after the
broker did (its topics exist, but their partitions have no leader yet) or before an input
topic is created (not to the topics a worker creates at its start: it waits until they are
led, :func:`shared.engine._admin.until_led`). aiokafka's leader would rejoin once its
metadata shows the topic, but it refreshes metadata only every ``metadata_max_age_ms`` (5
minutes), and a static member that restarts within the session timeout is handed the same
empty assignment back without a rebalance: the fleet reports ready and processes nothing for minutes.

So the leader, when an assignment skipped topics, chases their metadata
(:class:`MetadataChase`: forced refreshes, backing off) and rejoins the moment one of them
is known; and every instance says which of its input topics the group's last assignment
left without an owner (:func:`unowned_input_topics`: ``GET /instance`` and a metric).
Readiness stays what it was, state restored: an instance that made every instance unready
over a topic nobody can see would take every answer it can give from its state with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, cast

import faust

from shared.engine._faust import consumer_coordinator, coordinator_client, recovery_done

log = logging.getLogger(__name__)

#: First wait before a metadata refresh for skipped topics, doubled up to :data:`CHASE_MAX_WAIT_S`.
CHASE_FIRST_WAIT_S = 0.5
CHASE_MAX_WAIT_S = 10.0
#: Longest wait for one forced metadata refresh.
REFRESH_TIMEOUT_S = 10.0


def owned_topics(app: faust.App) -> set[str]:
    """Topics of which the group's last assignment gave some member at least one partition as
    active (the assignor publishes every member's actives to every member)."""
    assignor = cast(Any, app.assignor)
    distributions = (assignor.changelog_distribution or {}, assignor.external_topic_distribution or {})
    return {
        topic
        for distribution in distributions
        for by_topic in distribution.values()
        for topic, partitions in (by_topic or {}).items()
        if partitions
    }


def unowned_topics(app: faust.App, topics: Iterable[str]) -> set[str]:
    """Of ``topics``, those no member owns a partition of after the last assignment."""
    return set(topics) - owned_topics(app)


def unowned_input_topics(app: faust.App) -> set[str]:
    """The topics the app's handlers read that no member owns a partition of after the last
    assignment: none of their records is processed until an assignment gives them out."""
    return unowned_topics(app, getattr(app, "input_topics", ()))


def ready(app: faust.App) -> bool:
    """Table state restored after the last rebalance (what ``/readyz`` reports)."""
    return recovery_done(app)


class MetadataChase:
    """Refreshes the leader's metadata for topics an assignment skipped until one is known, then
    rejoins (see the module docs). Runs on the consumer thread's loop, where the assignor runs."""

    def __init__(self, app: faust.App) -> None:
        self.app = app
        self.topics: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self, topics: Iterable[str]) -> None:
        """What the last assignment skipped (called at every assignment: nothing skipped, no chase)."""
        self.topics = set(topics)
        if not self.topics or (self._task is not None and not self._task.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # an assignment computed off any loop (unit tests): nothing to chase with
            return
        log.warning(
            "assignment skipped topics without metadata %s: none of their partitions is processed "
            "until the next assignment; refreshing their metadata to rejoin as soon as it is known",
            sorted(self.topics),
        )
        self._task = loop.create_task(self._run(), name="metadata-chase")

    async def _run(self) -> None:
        coordinator = consumer_coordinator(self.app)
        if coordinator is None:
            return
        client = coordinator_client(coordinator)
        wait = CHASE_FIRST_WAIT_S
        while self.topics:
            await asyncio.sleep(wait)
            wait = min(wait * 2, CHASE_MAX_WAIT_S)
            try:
                await asyncio.wait_for(client.force_metadata_update(), REFRESH_TIMEOUT_S)
            except Exception as exc:  # the broker away: the next round asks again
                log.debug("metadata refresh for skipped topics: %r", exc)
                continue
            known = {t for t in self.topics if client.cluster.partitions_for_topic(t)}
            if known:
                self.topics -= known
                log.info("metadata of %s is known now: rejoining so that their partitions are assigned", sorted(known))
                coordinator.request_rejoin()
                return
