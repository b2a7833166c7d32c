"""This instance as its HTTP API sees it: readiness, the partitions it holds, its copies, its
peers and the requests peers send it. The one view of the running worker that leaves the
engine, so that no Faust object reaches a service or the HTTP layer."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import faust
from faust.types import TP

from shared.engine._assignor import Partition, assigned_partitions, changelog_topics, known_instance_urls
from shared.engine._consumer import BatchConsumer
from shared.engine._copies import Copy, assigned_copies
from shared.engine._coverage import ready, unowned_input_topics
from shared.engine._membership import note_peer_restarting
from shared.engine._warmup import rejoin_for_peer, warmup_partitions


class Instance:
    """The running worker of one service instance (``Engine.instance``)."""

    def __init__(self, app: faust.App, url: str, *, restoring: Callable[[], bool] = lambda: False) -> None:
        self._app = app
        self.url = url
        self._restoring = restoring

    # -- state ---------------------------------------------------------------------------

    def ready(self) -> bool:
        """Table state restored after the last rebalance, and no task of this instance still
        restoring (what ``/readyz`` reports)."""
        return ready(self._app) and not self._restoring()

    @property
    def rebalancing(self) -> bool:
        """A rebalance is under way: partitions may be moving."""
        return bool(self._app.rebalancing)

    def assigned(self) -> tuple[set[Partition], set[Partition]]:
        """(active, standby) partitions of the last assignment, as (topic, partition)."""
        return assigned_partitions(self._app)

    def changelog_topics(self) -> set[str]:
        return changelog_topics(self._app)

    def input_lag(self, partitions: Iterable[Partition]) -> dict[Partition, int | None]:
        """Records behind the end of each input partition (None: not known yet)."""
        consumer = self._app.consumer
        if not isinstance(consumer, BatchConsumer):  # an app without the engine's consumer
            return dict.fromkeys(partitions)
        lags = consumer.input_lag(TP(topic, partition) for topic, partition in partitions)
        return {(tp.topic, tp.partition): lag for tp, lag in lags.items()}

    async def copies(self) -> dict[str, dict[int, Copy]]:
        """Changelog topic -> partition -> this instance's copy of it (active or standby)."""
        return await assigned_copies(self._app)

    def warmups(self) -> dict[str, list[int]]:
        """Changelog topic -> partitions the last assignment gave this instance to warm up."""
        return warmup_partitions(self._app)

    def unowned_inputs(self) -> set[str]:
        """Input topics the last assignment gave no member (see ``shared/engine/_coverage.py``)."""
        return unowned_input_topics(self._app)

    def peer_urls(self) -> set[str]:
        """The URLs of the group's other members, as the last assignment named them."""
        return known_instance_urls(self._app)

    # -- requests from peers -------------------------------------------------------------

    def note_peer_restarting(self, url: str) -> bool:
        """A peer announced its restart: its member is left alone for the restart grace.
        False when this instance keeps no peer watch."""
        return note_peer_restarting(self._app, url)

    def rejoin_for_peer(self, url: str) -> bool:
        """A peer's warm-ups are caught up: rejoin now (False, nothing done, unless ``url`` is
        another member of the last assignment and the consumer has started)."""
        return rejoin_for_peer(self._app, url, self.url)
