"""Warm-up copies: a partition changes hands only to an instance that holds a caught-up copy.

aiokafka's rebalances are eager: every join stops every partition of the group until the
new assignment is recovered. What makes that stop long is a partition handed to an
instance that has no current copy of its tables and must restore them first (a new
instance on scale-out, one back from a long absence). Kafka Streams' answer (KIP-441) is
warm-up replicas, and this module does the same on Faust's assignor:

* Every member tells the group leader, in its join metadata, which table partitions it
  could take over at once: those it holds a copy of (active, standby or a previous owner's
  database) at most ``warmup_max_lag`` changelog records behind, as last measured
  (:class:`WarmupWatch`, every :data:`CHECK_EVERY_S`).
* The leader (:class:`WarmupAssignor`) first moves partitions from members holding more
  than their share to members under it that have such a copy (:func:`hand_over_to_caught_up`),
  then runs Faust's sticky assignment, and then takes back every hand-over to a member
  without a caught-up copy while the previous owner is still in the group
  (:func:`hold_until_warm`). That member gets the partition as a *warm-up* copy instead:
  a standby, restored in bulk right after the rebalance (:mod:`shared.engine._restore`) and
  kept current from the changelog. The assignment says which standbys are warm-ups.
* Once its warm-ups are caught up, the member asks for one more rebalance (a probing
  rebalance in KIP-441's terms), and the first step hands them over; the move itself
  then needs no restore.

A partition whose owner is gone (a failover) goes where Faust's assignor puts it, a
standby first; nothing is held for an owner that is not there. Nor is a partition whose
whole changelog is within the bound (as the leader last measured it: a member reports no
copies until it has measured them), and a leader that has not measured the changelogs yet
holds nothing back at all. Members that do not report
their copies (warm-ups turned off there, or an older version) count as caught up, which is
Faust's behaviour.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, List, Protocol, cast  # noqa: UP035 (Faust's Record fields need typing's List)

import faust
import httpx
from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata
from faust.assignor.client_assignment import ClientMetadata, CopartitionedAssignment

from shared.engine._assignor import TableAssignor, decompress, member_urls
from shared.engine._copies import Copy, lag_without_copy, local_copy
from shared.engine._coverage import MetadataChase
from shared.engine._faust import AnyTable, recovery_done, request_rejoin
from shared.engine._loops import run_every
from shared.settings import Settings

log = logging.getLogger(__name__)

#: How often a member measures its copies' lag (what it reports at its next join).
CHECK_EVERY_S = 0.5
#: A member asks for a rebalance to take its warm-ups over at most this often.
PROBE_EVERY_S = 5.0
#: A member with some warm-ups caught up and others not asks anyway after this long.
PARTIAL_PROBE_AFTER_S = 30.0
#: The peers' endpoint that has them rejoin at once (see :meth:`WarmupWatch.nudge_peers`).
REBALANCE_PATH = "/instance/rebalance"
NUDGE_TIMEOUT_S = 1.0
#: Nor sooner than this after the last rebalance: eager rebalances stop every partition, and two
#: in a row would add up to one long stop where two short ones do.
SETTLE_AFTER_ASSIGNMENT_S = 5.0


class _Copartitioned(Protocol):
    """One member's share of a copartitioned topic group (Faust's ``CopartitionedAssignment``)."""

    actives: set[int]
    standbys: set[int]


#: Whether a member (by member id) could take a partition over at once.
CaughtUp = Callable[[str, int], bool]


def hand_over_to_caught_up(
    assignments: Mapping[str, _Copartitioned], partitions: int, caught_up: CaughtUp
) -> list[tuple[int, str, str]]:
    """Move partitions to members holding fewer than their share (``partitions // members``)
    from members holding more, where the receiver has a caught-up copy; the most loaded
    donor gives first. Returns the moves as (partition, from, to)."""
    if not assignments:
        return []
    share = partitions // len(assignments)
    owner = {p: member for member, a in sorted(assignments.items()) for p in a.actives}
    moves: list[tuple[int, str, str]] = []
    for member in sorted(assignments, key=lambda m: (len(assignments[m].actives), m)):
        receiver = assignments[member]
        while len(receiver.actives) < share:
            candidates = [
                p
                for p, holder in owner.items()
                if holder != member and len(assignments[holder].actives) > share and caught_up(member, p)
            ]
            if not candidates:
                break
            p = max(candidates, key=lambda p: (len(assignments[owner[p]].actives), -p))
            donor = owner[p]
            assignments[donor].actives.discard(p)
            receiver.standbys.discard(p)
            receiver.actives.add(p)
            owner[p] = member
            moves.append((p, donor, member))
    return moves


def hold_until_warm(
    assignments: Mapping[str, _Copartitioned], previous_owner: Mapping[int, str], caught_up: CaughtUp
) -> dict[str, set[int]]:
    """Undo each hand-over of a partition to a member without a caught-up copy while its
    previous owner is still a member: the owner keeps it, the member gets a warm-up copy.
    Returns member -> its warm-up partitions."""
    warmups: dict[str, set[int]] = defaultdict(set)
    for member, assignment in sorted(assignments.items()):
        for p in sorted(assignment.actives):
            owner = previous_owner.get(p)
            if owner is None or owner == member or owner not in assignments or caught_up(member, p):
                continue
            assignment.actives.discard(p)
            assignment.standbys.add(p)
            assignments[owner].actives.add(p)
            assignments[owner].standbys.discard(p)
            warmups[member].add(p)
    return dict(warmups)


class StatefleetClientMetadata(ClientMetadata, serializer="json", include_metadata=False, namespace="@StatefleetClientMetadata"):
    """Faust's member metadata with the copies a member could take over (in its join) and its
    warm-ups (in its assignment). Faust's own decoder keeps unknown fields, so members of either
    kind understand each other."""

    caught_up: Mapping[str, List[int]] | None = None  # noqa: UP006 (changelog topic -> partitions)
    warmups: Mapping[str, List[int]] | None = None  # noqa: UP006 (changelog topic -> partitions)


class WarmupAssignor(TableAssignor):
    """Faust's partition assignor with warm-up copies (see the module docs).

    ``caught_up`` is what this member reports at its next join (kept current by
    :class:`WarmupWatch`; None until measured, which counts as nothing caught up);
    ``warmups`` are the changelog partitions the last assignment gave it to warm up.
    """

    def __init__(self, app: faust.App, replicas: int = 0) -> None:
        super().__init__(app, replicas=replicas)
        self.caught_up: dict[str, list[int]] | None = None
        #: Changelog topic -> partitions whose whole changelog is within ``warmup_max_lag`` records.
        self.small: dict[str, list[int]] | None = None
        self.warmups: dict[str, list[int]] = {}
        self.assigned_at = time.monotonic()
        self.enabled = True
        #: The last assignment's hand-overs and holds, for the log and the tests.
        self.last_moves: list[tuple[str, int, str, str]] = []
        self.last_holds: dict[str, dict[str, list[int]]] = {}
        #: Topics the last assignment skipped for want of metadata, refreshed until known.
        self.metadata_chase = MetadataChase(app)

    # -- a member --------------------------------------------------------------------------

    metadata_class = StatefleetClientMetadata

    def join_extras(self) -> dict[str, Any]:
        # A member with warm-ups off reports no copies (Faust's metadata): it counts as caught up.
        return {"caught_up": dict(self.caught_up or {}), "warmups": {}} if self.enabled else {}

    def on_assignment(self, assignment: ConsumerProtocolMemberMetadata) -> None:
        super().on_assignment(assignment)
        raw = json.loads(decompress(assignment.user_data))
        self.warmups = {topic: sorted(parts) for topic, parts in (raw.get("warmups") or {}).items() if parts}
        self.assigned_at = time.monotonic()

    # -- the leader ------------------------------------------------------------------------

    def begin_assignment(
        self, topics: set[str], cluster: ClusterMetadata, clients_metadata: Mapping[str, ClientMetadata]
    ) -> None:
        # A topic the cluster metadata does not show yet is skipped: nobody would own it until
        # the next rebalance, which only a metadata change minutes later would bring.
        self.metadata_chase.start(t for t in topics if not cluster.partitions_for_topic(t))
        self.last_moves, self.last_holds = [], {}

    def assign_group(
        self,
        topics: set[str],
        previous: Mapping[str, CopartitionedAssignment],
        num_partitions: int,
        clients_metadata: Mapping[str, ClientMetadata],
    ) -> Mapping[str, CopartitionedAssignment]:
        # The two warm-up steps around Faust's sticky assignment.
        group_changelogs = sorted(set(topics) & self.changelog_topics)
        caught_up = self._caught_up(clients_metadata, group_changelogs)
        if self.enabled and group_changelogs:
            for p, donor, receiver in hand_over_to_caught_up(previous, num_partitions, caught_up):
                self.last_moves.extend((topic, p, donor, receiver) for topic in group_changelogs)
        previous_owner = {p: member for member, a in sorted(previous.items()) for p in a.actives}
        assigned = super().assign_group(topics, previous, num_partitions, clients_metadata)
        # A leader that has not measured the changelogs yet (it has just started, as in a
        # fleet starting at once) cannot tell small tables from large: Faust's assignment.
        if self.enabled and group_changelogs and self.small is not None:
            for member, held in hold_until_warm(assigned, previous_owner, caught_up).items():
                for topic in group_changelogs:
                    self.last_holds.setdefault(member, {})[topic] = sorted(held)
        return assigned

    def end_assignment(self, clients_metadata: Mapping[str, ClientMetadata]) -> None:
        self._log_assignment(clients_metadata)

    def _caught_up(self, clients_metadata: Mapping[str, ClientMetadata], changelogs: list[str]) -> CaughtUp:
        reported: dict[str, dict[str, set[int]] | None] = {}
        for member, metadata in clients_metadata.items():
            copies = getattr(metadata, "caught_up", None)
            reported[member] = None if copies is None else {t: set(ps) for t, ps in copies.items()}
        # A partition whose whole changelog is within the bound is caught up anywhere: a member
        # that joins before it has measured its copies reports none, and small tables (a fresh
        # deployment) should not wait for a warm-up.
        small = {t: set(ps) for t, ps in (self.small or {}).items()}

        def caught_up(member: str, partition: int) -> bool:
            copies = reported.get(member)
            if copies is None:  # this member does not report its copies: Faust's behaviour
                return True
            return all(partition in copies.get(topic, ()) or partition in small.get(topic, ()) for topic in changelogs)

        return caught_up

    def _log_assignment(self, clients_metadata: Mapping[str, ClientMetadata]) -> None:
        url = {member: metadata.url for member, metadata in clients_metadata.items()}
        for topic, p, donor, receiver in self.last_moves:
            log.info(
                "assignment: %s[%d] moves from %s to %s, which holds a caught-up copy",
                topic,
                p,
                url.get(donor, donor),
                url.get(receiver, receiver),
            )
        for member, held in sorted(self.last_holds.items()):
            for topic, parts in sorted(held.items()):
                log.info(
                    "assignment: %s warms up %s %s before taking them over (their owners keep them meanwhile)",
                    url.get(member, member),
                    topic,
                    parts,
                )

    def assignment_extras(self, member: str) -> dict[str, Any]:
        # Each member's warm-ups travel in its assignment's metadata.
        return {"caught_up": {}, "warmups": dict(self.last_holds.get(member, {}))}


def rejoin_for_peer(app: faust.App, url: str, own_url: str) -> bool:
    """A peer asked for a rebalance (to take its warm-ups over): rejoin the group now. False, and
    nothing done, when ``url`` is not another member of the last assignment (a rebalance stops
    every partition, so only the group's own members may ask for one) or the consumer has not
    started."""
    asking = url.rstrip("/")
    if asking == own_url.rstrip("/") or asking not in member_urls(app):
        log.info("ignored a rebalance request from %s: not a member of the group", asking)
        return False
    joined = request_rejoin(app)
    if joined:
        log.info("peer %s asked for a rebalance: rejoining now", url.rstrip("/"))
    return joined


def warmup_partitions(app: faust.App) -> dict[str, list[int]]:
    """Changelog topic -> partitions the last assignment gave this instance to warm up."""
    assignor = app.assignor
    return dict(assignor.warmups) if isinstance(assignor, WarmupAssignor) else {}


class WarmupWatch:
    """Measures this member's copies for its next join, and asks for a rebalance once its
    warm-ups are caught up (an Engine app task)."""

    def __init__(self, app: faust.App, settings: Settings, own_url: str) -> None:
        self.app = app
        self.settings = settings
        self.own_url = own_url.rstrip("/")
        self.max_lag = settings.warmup_max_lag
        self.stopping = False
        self._probed_at = float("-inf")

    @property
    def assignor(self) -> WarmupAssignor:
        return cast(WarmupAssignor, self.app.assignor)

    async def run(self) -> None:
        # A failed check is mostly a store being closed by a rebalance: measured again next time.
        await run_every(CHECK_EVERY_S, self.tick, lambda: not self.stopping, lambda exc: log.debug("warm-up check: %r", exc))

    async def tick(self) -> None:
        caught_up, small = await self.measure()
        self.assignor.caught_up, self.assignor.small = caught_up, small
        if self.due(caught_up, time.monotonic()):
            self._probed_at = time.monotonic()
            waiting = {t: ps for t, ps in self.assignor.warmups.items()}
            if request_rejoin(self.app):
                log.info("warm-up copies caught up (%s): asking for a rebalance to take them over", waiting)
                await self.nudge_peers()

    async def nudge_peers(self) -> None:
        """Have every peer rejoin now rather than at its next heartbeat: in an eager rebalance the
        first member to rejoin stops processing until the last one has, so that wait is a pause of
        every partition."""
        peers = sorted(member_urls(self.app) - {self.own_url})
        if not peers:
            return
        headers = {"Authorization": f"Bearer {self.settings.admin_token}"}
        async with httpx.AsyncClient(timeout=NUDGE_TIMEOUT_S) as client:
            results = await asyncio.gather(
                *(client.post(url + REBALANCE_PATH, json={"url": self.own_url}, headers=headers) for url in peers),
                return_exceptions=True,
            )
        missed = [u for u, r in zip(peers, results, strict=True) if not (isinstance(r, httpx.Response) and r.is_success)]
        if missed:
            log.info("peers not told to rejoin now (they will at their next heartbeat): %s", ", ".join(missed))

    def due(self, caught_up: Mapping[str, Iterable[int]], now: float) -> bool:
        """Whether to ask for a rebalance now: every warm-up caught up, or some after
        :data:`PARTIAL_PROBE_AFTER_S`; not during a rebalance or recovery, not within
        :data:`SETTLE_AFTER_ASSIGNMENT_S` of the last one, and at most every :data:`PROBE_EVERY_S`."""
        warmups = self.assignor.warmups
        if not warmups or now - self._probed_at < PROBE_EVERY_S:
            return False
        if now - self.assignor.assigned_at < SETTLE_AFTER_ASSIGNMENT_S:
            return False
        if self.app.rebalancing or not recovery_done(self.app):
            return False
        ready = {t: set(caught_up.get(t, ())) & set(ps) for t, ps in warmups.items()}
        partitions = {p for ps in warmups.values() for p in ps}
        warm = {p for p in partitions if all(p in ready[t] for t in warmups)}
        if warm == partitions:
            return True
        return bool(warm) and now - self.assignor.assigned_at >= PARTIAL_PROBE_AFTER_S

    async def measure(self) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
        """Changelog topic -> partitions this instance could take over with at most
        ``warmup_max_lag`` changelog records to apply (an unknown lag does not count); and
        changelog topic -> partitions whose whole changelog is within that bound."""
        out: dict[str, list[int]] = {}
        small: dict[str, list[int]] = {}
        measured: dict[tuple[str, int], Copy | None] = {}
        for table in list(self.app.tables.values()):
            topic = table.changelog_topic.get_topic_name()
            partitions = table.partitions or self.app.conf.topic_partitions
            caught: list[int] = []
            small[topic] = []
            for p in range(partitions):
                copy = await local_copy(self.app, cast(AnyTable, table), p, measured=measured)
                whole = await lag_without_copy(self.app, cast(AnyTable, table), p)
                if whole is not None and whole <= self.max_lag:
                    small[topic].append(p)
                # No copy at all is as good as one when the whole changelog is within the bound.
                lag = copy.lag if copy is not None else whole
                if lag is not None and lag <= self.max_lag:
                    caught.append(p)
            out[topic] = caught
        return out, small

    def close(self) -> None:
        self.stopping = True
