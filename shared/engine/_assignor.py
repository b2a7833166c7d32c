"""The group's partition assignor, on aiokafka's public assignor API.

Faust's tables need an assignor that is sticky (a partition stays with its owner), places
standby copies, and tells every member which instance owns which changelog partition (the
URLs behind reads from any instance). Faust's own ``PartitionAssignor`` does that, but the
engine's warm-ups (:mod:`shared.engine._warmup`) change its leader step, and Faust keeps that
step and its parts private. This class is that assignor written on aiokafka's
:class:`~aiokafka.coordinator.assignors.abstract.AbstractPartitionAssignor` (``name``,
``metadata``, ``assign``, ``on_assignment``) and Faust's public assignment types
(``ClientMetadata``, ``ClientAssignment``, ``ClusterAssignment``, ``CopartitionedAssignor``),
with each step of the leader's assignment a public method.

It speaks Faust's protocol unchanged (name ``faust``, version 4, zlib-compressed JSON
metadata), so a member running it and a member running Faust's assignor understand each
other during a rolling upgrade. It offers Faust's app everything Faust asks of
``app.assignor`` (assigned actives and standbys, the topic groups, the owners' URLs).
"""

from __future__ import annotations

import logging
import zlib
from collections import defaultdict
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any, cast

import faust
from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata
from faust.assignor.client_assignment import ClientAssignment, ClientMetadata, CopartitionedAssignment
from faust.assignor.cluster_assignment import ClusterAssignment
from faust.assignor.copartitioned_assignor import CopartitionedAssignor
from faust.types import TP
from yarl import URL

log = logging.getLogger(__name__)

#: Changelog or input topic -> partitions.
TopicPartitions = MutableMapping[str, list[int]]
#: Member URL -> its topics' partitions (Faust's "host to partition map").
HostPartitions = MutableMapping[str, TopicPartitions]

#: The protocol the members agree on: Faust's, so members of either assignor can share a group.
PROTOCOL_NAME = "faust"
PROTOCOL_VERSION = 4


def compress(data: bytes) -> bytes:
    """Member metadata as it travels in a join or an assignment (zlib, as Faust)."""
    return zlib.compress(data)


def decompress(data: bytes) -> bytes:
    return zlib.decompress(data)


def _by_url(distribution: HostPartitions) -> dict[TP, str]:
    return {
        TP(topic, partition): url
        for url, topics in distribution.items()
        for topic, partitions in topics.items()
        for partition in partitions
    }


class TableAssignor(AbstractPartitionAssignor):  # type: ignore[misc]  # aiokafka's class is untyped at its base
    """Faust's sticky, standby-placing assignor on aiokafka's public assignor API (see the module docs).

    A member's state is its last assignment (:meth:`assigned_actives`, :meth:`assigned_standbys`),
    the topic groups, and the owners' URLs of every changelog partition and input partition.
    """

    def __init__(self, app: faust.App, replicas: int = 0) -> None:
        self.app = app
        self.replicas = replicas
        self.assignment = ClientAssignment(actives={}, standbys={})
        self.topic_groups: dict[str, int] = {}
        self._changelogs_by_url: HostPartitions = {}
        self._inputs_by_url: HostPartitions = {}
        self._changelog_owner: dict[TP, str] = {}
        self._external_owner: dict[TP, str] = {}
        self.member_urls: dict[str, str] = {}

    # -- aiokafka's assignor API -------------------------------------------------------------

    @property
    def name(self) -> str:
        return PROTOCOL_NAME

    @property
    def version(self) -> int:
        return PROTOCOL_VERSION

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        return ConsumerProtocolMemberMetadata(self.version, list(topics), self.join_metadata().dumps())

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        metadata = cast(ClientMetadata, ClientMetadata.loads(decompress(assignment.user_data)))
        self.assignment = metadata.assignment
        self.topic_groups = dict(metadata.topic_groups)
        self.changelog_distribution = metadata.changelog_distribution
        self.external_topic_distribution = metadata.external_topic_distribution
        expected = self.kafka_assignment(self.assignment)
        if sorted(assignment.assignment) != expected:  # the leader's two halves disagree: a bug, say so
            log.error("assignment: partitions %s differ from the metadata's %s", sorted(assignment.assignment), expected)

    def assign(
        self, cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        sensors = self.app.sensors
        state = sensors.on_assignment_start(self)  # type: ignore[arg-type]  # Faust types it as its own class
        try:
            assignment = dict(self.perform_assignment(cluster, members))
        except MemoryError:
            raise
        except Exception as exc:
            sensors.on_assignment_error(self, state, exc)  # type: ignore[arg-type]
            raise
        sensors.on_assignment_completed(self, state)  # type: ignore[arg-type]
        return assignment

    # -- a member --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return str(self.app.conf.canonical_url)

    def join_metadata(self) -> ClientMetadata:
        """What this member tells the leader when it joins: its last assignment and its URL."""
        return self.client_metadata_of(
            self.url,
            self.assignment,
            (self.changelog_distribution, self.external_topic_distribution),
            self.topic_groups,
            self.join_extras(),
        )

    #: The class of the metadata a member joins with and the leader assigns with when a
    #: subclass adds fields of its own (:meth:`join_extras`, :meth:`assignment_extras`).
    metadata_class: type[ClientMetadata] = ClientMetadata

    def join_extras(self) -> dict[str, Any]:
        """Fields of :attr:`metadata_class` this member adds to its join (none: Faust's metadata)."""
        return {}

    def assignment_extras(self, member: str) -> dict[str, Any]:
        """Fields of :attr:`metadata_class` the leader adds to ``member``'s assignment."""
        return {}

    def client_metadata_of(
        self,
        url: str,
        assignment: ClientAssignment,
        distributions: tuple[HostPartitions, HostPartitions],
        topic_groups: Mapping[str, int],
        extras: Mapping[str, Any],
    ) -> ClientMetadata:
        metadata_class = self.metadata_class if extras else ClientMetadata
        return metadata_class(
            assignment=assignment,
            url=url,
            changelog_distribution=distributions[0],
            external_topic_distribution=distributions[1],
            topic_groups=topic_groups,
            **extras,
        )

    @property
    def changelog_distribution(self) -> HostPartitions:
        """Member URL -> the changelog partitions it owns as active."""
        return self._changelogs_by_url

    @changelog_distribution.setter
    def changelog_distribution(self, value: HostPartitions) -> None:
        self._changelogs_by_url = value
        self._changelog_owner = _by_url(value)

    @property
    def external_topic_distribution(self) -> HostPartitions:
        """Member URL -> the input partitions (of topics other than changelogs) it owns."""
        return self._inputs_by_url

    @external_topic_distribution.setter
    def external_topic_distribution(self, value: HostPartitions) -> None:
        self._inputs_by_url = value
        self._external_owner = _by_url(value)

    def changelog_owner_urls(self) -> Mapping[TP, str]:
        """Changelog partition -> the URL of the member that owns it as active."""
        return self._changelog_owner

    def assigned_actives(self) -> set[TP]:
        return {TP(topic, p) for topic, parts in self.assignment.actives.items() for p in parts}

    def assigned_standbys(self) -> set[TP]:
        return {TP(topic, p) for topic, parts in self.assignment.standbys.items() for p in parts}

    def is_active(self, tp: TP) -> bool:
        return tp in self.assigned_actives()

    def is_standby(self, tp: TP) -> bool:
        return tp in self.assigned_standbys()

    def group_for_topic(self, topic: str) -> int:
        return self.topic_groups[topic]

    # What Faust's web router asks (``app.router``): the owner of a key, the tables' owners.

    def key_store(self, topic: str, key: bytes) -> URL:
        return URL(self._changelog_owner[self.app.producer.key_partition(topic, key)])

    def external_key_store(self, topic: str, key: bytes) -> URL:
        return URL(self._external_owner[self.app.producer.key_partition(topic, key)])

    def table_metadata(self, topic: str) -> HostPartitions:
        return {url: {t: ps for t, ps in topics.items() if t == topic} for url, topics in self.changelog_distribution.items()}

    def tables_metadata(self) -> HostPartitions:
        return self.changelog_distribution

    def external_topics_metadata(self) -> HostPartitions:
        return self.external_topic_distribution

    # -- the leader: Faust's assignment, step by step ----------------------------------------

    def perform_assignment(
        self, cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> MutableMapping[str, ConsumerProtocolMemberAssignment]:
        """The leader's assignment of every member: each group of co-partitioned topics assigned
        by Faust's sticky ``CopartitionedAssignor``, global tables' changelogs to everyone."""
        clients_metadata = {member: self.client_metadata(m) for member, m in members.items()}
        subscriptions = {member: list(m.subscription) for member, m in members.items()}
        cluster_assignment = ClusterAssignment()
        for member in members:
            cluster_assignment.add_client(member, subscriptions[member], clients_metadata[member])
        groups = self.copartitioned_groups(cluster_assignment.topics(), cluster, subscriptions)
        self.member_urls = {member: metadata.url for member, metadata in clients_metadata.items()}
        self.begin_assignment(cluster_assignment.topics(), cluster, clients_metadata)
        assignments: dict[str, ClientAssignment] = {member: ClientAssignment(actives={}, standbys={}) for member in members}
        topic_groups: dict[str, int] = {}
        partitions_by_topic: dict[str, int] = {}
        for group_id, (num_partitions, topic_sets) in enumerate(sorted(groups.items())):
            for topics in topic_sets:
                for topic in topics:
                    topic_groups[topic] = group_id
                    partitions_by_topic[topic] = num_partitions
                previous = cluster_assignment.copartitioned_assignments(topics)
                for member, copartitioned in self.assign_group(topics, previous, num_partitions, clients_metadata).items():
                    assignments[member].add_copartitioned_assignment(copartitioned)
        self.end_assignment(clients_metadata)
        assignments = self.with_global_table_standbys(assignments, partitions_by_topic)
        return self.protocol_assignments(assignments, topic_groups)

    def begin_assignment(
        self, topics: set[str], cluster: ClusterMetadata, clients_metadata: Mapping[str, ClientMetadata]
    ) -> None:
        """A leader's assignment starts (a subclass resets what it tracks per assignment)."""

    def assign_group(
        self,
        topics: set[str],
        previous: Mapping[str, CopartitionedAssignment],
        num_partitions: int,
        clients_metadata: Mapping[str, ClientMetadata],
    ) -> Mapping[str, CopartitionedAssignment]:
        """One group of co-partitioned topics, member -> its partitions: Faust's sticky assignment,
        from each member's previous partitions."""
        return cast(
            Mapping[str, CopartitionedAssignment],
            CopartitionedAssignor(
                topics=topics, cluster_asgn=dict(previous), num_partitions=num_partitions, replicas=self.replicas
            ).get_assignment(),
        )

    def end_assignment(self, clients_metadata: Mapping[str, ClientMetadata]) -> None:
        """Every group is assigned (a subclass logs what it did)."""

    @staticmethod
    def client_metadata(metadata: ConsumerProtocolMemberMetadata) -> ClientMetadata:
        """A member's join metadata, decoded."""
        return cast(ClientMetadata, ClientMetadata.loads(metadata.user_data))

    @staticmethod
    def copartitioned_groups(
        topics: Iterable[str], cluster: ClusterMetadata, subscriptions: Mapping[str, list[str]]
    ) -> dict[int, list[set[str]]]:
        """Partition count -> groups of topics assigned together: topics with as many partitions
        and the same subscribed members. A topic the cluster metadata does not show is skipped."""
        by_count: dict[int, set[str]] = defaultdict(set)
        for topic in topics:
            count = len(cluster.partitions_for_topic(topic) or ())
            if count == 0:
                log.warning("assignment: skipping topic %r, which the cluster metadata does not show yet", topic)
                continue
            by_count[count].add(topic)
        subscribers: dict[str, set[str]] = defaultdict(set)
        for member, subscribed in subscriptions.items():
            for topic in subscribed:
                subscribers[topic].add(member)
        groups: dict[int, list[set[str]]] = {}
        for count, counted in by_count.items():
            by_members: dict[tuple[str, ...], set[str]] = defaultdict(set)
            for topic in counted:
                by_members[tuple(sorted(subscribers[topic]))].add(topic)
            groups[count] = list(by_members.values())
        return groups

    @property
    def changelog_topics(self) -> set[str]:
        return {table.changelog_topic.get_topic_name() for table in self.app.tables.values()}

    def with_global_table_standbys(
        self, assignments: dict[str, ClientAssignment], partitions_by_topic: Mapping[str, int]
    ) -> dict[str, ClientAssignment]:
        """Every member holds every partition of a global table: actives (recovered at the start),
        and standbys of those it does not own (all, when the table writes through its partitioner
        or keeps every active in sync)."""
        for table in self.app.tables.values():
            if not table.is_global:
                continue
            topic = table.changelog_topic.get_topic_name()
            every = set(range(partitions_by_topic[topic]))
            for assignment in assignments.values():
                everywhere = table.synchronize_all_active_partitions or table.use_partitioner
                owned = set(assignment.actives.get(topic, []))
                assignment.standbys[topic] = sorted(every if everywhere else every - owned)
                assignment.actives[topic] = sorted(every)
        return assignments

    def distributions(self, assignments: Mapping[str, ClientAssignment]) -> tuple[HostPartitions, HostPartitions]:
        """(member URL -> changelog partitions it owns, member URL -> input partitions it owns)."""
        changelogs = self.changelog_topics
        tables: HostPartitions = {}
        inputs: HostPartitions = {}
        for member, assignment in assignments.items():
            url = self.member_urls[member]
            tables[url] = {t: ps for t, ps in assignment.actives.items() if t in changelogs}
            inputs[url] = {t: ps for t, ps in assignment.actives.items() if t not in changelogs}
        return tables, inputs

    def kafka_assignment(self, assignment: ClientAssignment) -> list[Any]:
        """A member's assignment as the Kafka protocol carries it: (topic, partitions), sorted."""
        return sorted(assignment.kafka_protocol_assignment(self.app.tables))

    def protocol_assignments(
        self, assignments: Mapping[str, ClientAssignment], topic_groups: Mapping[str, int]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        distributions = self.distributions(assignments)
        return {
            member: ConsumerProtocolMemberAssignment(
                self.version,
                self.kafka_assignment(assignment),
                compress(
                    self.client_metadata_of(
                        self.member_urls[member], assignment, distributions, topic_groups, self.assignment_extras(member)
                    ).dumps()
                ),
            )
            for member, assignment in assignments.items()
        }


# -- what the last assignment says, for the engine's other parts ---------------------------------

#: A topic partition as the fleet view gives it: (topic, partition), a plain tuple.
Partition = tuple[str, int]


def table_assignor(app: faust.App) -> TableAssignor:
    assignor = app.assignor
    if not isinstance(assignor, TableAssignor):
        raise TypeError(f"the app's assignor is {type(assignor).__name__}, not a TableAssignor (see shared/engine/_app.py)")
    return assignor


def changelog_topics(app: faust.App) -> set[str]:
    """The changelog topic of every table of ``app``."""
    return {table.changelog_topic.get_topic_name() for table in app.tables.values()}


def active_partitions(app: faust.App, table: faust.types.TableT[Any, Any]) -> set[int]:
    """Changelog partitions of ``table`` this instance currently owns as active."""
    topic = table.changelog_topic.get_topic_name()
    return {tp.partition for tp in table_assignor(app).assigned_actives() if tp.topic == topic}


def assigned_partitions(app: faust.App) -> tuple[set[Partition], set[Partition]]:
    """(active, standby) topic partitions the last assignment gave this instance."""
    assignor = table_assignor(app)
    return (
        {(tp.topic, tp.partition) for tp in assignor.assigned_actives()},
        {(tp.topic, tp.partition) for tp in assignor.assigned_standbys()},
    )


def partition_owner_url(app: faust.App, table: faust.types.TableT[Any, Any], partition: int) -> str | None:
    """Canonical URL of the instance that owns ``partition`` of ``table`` as active, if known."""
    topic = table.changelog_topic.get_topic_name()
    url = table_assignor(app).changelog_owner_urls().get(TP(topic, partition))
    return str(url).rstrip("/") if url else None


def all_owner_urls(app: faust.App, table: faust.types.TableT[Any, Any]) -> set[str]:
    """Every instance URL that owns at least one active partition of ``table``."""
    topic = table.changelog_topic.get_topic_name()
    return {str(url).rstrip("/") for tp, url in table_assignor(app).changelog_owner_urls().items() if tp.topic == topic}


def known_instance_urls(app: faust.App) -> set[str]:
    """Canonical URLs of every instance the last assignment gave changelog partitions to."""
    return {str(url).rstrip("/") for url in table_assignor(app).changelog_distribution}


def member_urls(app: faust.App) -> set[str]:
    """Canonical URLs of every instance the last assignment gave active partitions to, of tables
    or of other topics (the leader sends both maps to every member)."""
    assignor = table_assignor(app)
    distributions = (assignor.changelog_distribution, assignor.external_topic_distribution)
    return {str(url).rstrip("/") for distribution in distributions for url in distribution}
