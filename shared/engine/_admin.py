"""Create the topics a service needs, with the right partitions and configs, before
its worker starts. Existing topics are left as they are (a partition count that does
not match is logged, since co-partitioned topics must agree). And delete the topics of a
prefix, for the tests and benchmarks that make topics of their own.

Their replication factor is ``STATEFLEET_TOPIC_REPLICATION_FACTOR`` when set, else the brokers'
own ``default.replication.factor`` (:func:`replication_factor`): so one setting, the bootstrap
servers, fits a single broker and a replicated cluster alike. The brokers' default is asked
for, not left to them, because aiokafka's CreateTopics stops at version 3, which cannot say
"the broker's default" (-1, version 4 on)."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import ClusterAuthorizationFailedError, KafkaError, KafkaTimeoutError, TopicAlreadyExistsError, for_code

from shared.engine._access import BrokerAccessDenied, check_created, check_group, check_visible, who
from shared.engine._clients import client_kwargs, started_when_reachable
from shared.settings import Settings

log = logging.getLogger(__name__)


class _Admin(AIOKafkaAdminClient):  # type: ignore[misc]
    """aiokafka's admin client, stopped by ``stop`` like its other clients, with a cluster client
    beside it for the requests the admin client has no method for (a group heartbeat that
    checks access, LeaveGroup): :meth:`send_to_broker`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cluster = AIOKafkaClient(**kwargs)

    async def start(self) -> None:
        await super().start()
        await self.cluster.bootstrap()

    async def close(self) -> None:
        try:
            await self.cluster.close()
        finally:
            await super().close()

    async def stop(self) -> None:
        await self.close()

    async def send_to_broker(self, request: Any, node_id: int) -> Any:
        """Send one request to broker ``node_id`` and return its answer."""
        return await self.cluster.send(node_id, request)


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


#: The broker setting a topic's replication factor comes from when the fleet's settings leave it open.
BROKER_DEFAULT_REPLICATION = "default.replication.factor"

#: The brokers' default replication factor by bootstrap servers: asked once per process.
_broker_defaults: dict[str, int] = {}


async def replication_factor(settings: Settings, admin: AIOKafkaAdminClient | None = None) -> int:
    """The replication factor of the topics the fleet creates: the one ``settings`` set, else
    the brokers' ``default.replication.factor`` (read once per process with ``admin``, a started
    admin client, or with one made here).

    Raises :class:`~shared.engine._access.BrokerAccessDenied` when the brokers do not let these
    settings' user read their configuration (DESCRIBE_CONFIGS on the cluster)."""
    if settings.topic_replication_factor is not None:
        return settings.topic_replication_factor
    known = _broker_defaults.get(settings.kafka_bootstrap_servers)
    if known is not None:
        return known
    if admin is None:
        own = await started_when_reachable(lambda: _Admin(**client_kwargs(settings)), "topic replication", settings)
        try:
            return await replication_factor(settings, own)
        finally:
            await own.close()
    node_id = (await admin.describe_cluster())["brokers"][0]["node_id"]
    try:
        (response,) = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.BROKER, str(node_id), {BROKER_DEFAULT_REPLICATION: None})]
        )
        (resource,) = response.to_object()["resources"]
        if resource["error_code"]:
            raise for_code(resource["error_code"])(resource["error_message"])
    except ClusterAuthorizationFailedError as exc:
        raise BrokerAccessDenied(
            f"the brokers do not let {who(settings)} read their {BROKER_DEFAULT_REPLICATION} (DESCRIBE_CONFIGS on the "
            "cluster): set STATEFLEET_TOPIC_REPLICATION_FACTOR, or grant that ACL"
        ) from exc
    values = {e["config_names"]: e["config_value"] for e in resource["config_entries"]}
    factor = int(values[BROKER_DEFAULT_REPLICATION])
    log.info("new topics get the brokers' %s, %d (no STATEFLEET_TOPIC_REPLICATION_FACTOR)", BROKER_DEFAULT_REPLICATION, factor)
    _broker_defaults[settings.kafka_bootstrap_servers] = factor
    return factor


def resolve_replication_factor(settings: Settings) -> int:
    """:func:`replication_factor` from synchronous code, also with an event loop running in this
    thread (asked in a thread of its own, whose loop leaves this thread's alone)."""
    if settings.topic_replication_factor is not None:
        return settings.topic_replication_factor
    with ThreadPoolExecutor(1, thread_name_prefix="replication-factor") as pool:
        return pool.submit(asyncio.run, replication_factor(settings)).result()


#: How long topic creation goes on trying through the brokers' passing errors (a node
#: restarting, a controller moving) before the worker gives up, and its first and longest waits.
ENSURE_TOPICS_PATIENCE_S = 300.0
ENSURE_TOPICS_RETRY_FIRST_S = 0.5
ENSURE_TOPICS_RETRY_MAX_S = 5.0

#: Longest wait, once topics are created, for the metadata to show a leader for each of their
#: partitions (see :func:`until_led`), and how often it is asked.
LEADERS_WAIT_S = 10.0
LEADERS_POLL_S = 0.05


def passing(exc: BaseException) -> bool:
    """Whether a broker's error is one that goes away by itself: a node not ready or restarting,
    a request that timed out, a controller or leader moving (aiokafka's ``retriable``)."""
    return isinstance(exc, KafkaTimeoutError) or bool(getattr(exc, "retriable", False))


async def ensure_topics_async(settings: Settings, specs: list[TopicSpec], group: str | None = None) -> None:
    """Create what is missing of ``specs``, waiting for the brokers to answer if they do not yet.

    A node of a replicated cluster that dies or restarts meanwhile fails requests with errors
    that pass (see :func:`passing`): the whole step is tried again, for up to
    :data:`ENSURE_TOPICS_PATIENCE_S`, so that a worker started at that moment does not exit.

    Raises :class:`~shared.engine._access.BrokerAccessDenied` when the brokers refuse these
    settings' credentials, or the ACLs deny the topics (or consumer ``group``) to their user."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ENSURE_TOPICS_PATIENCE_S
    delay = ENSURE_TOPICS_RETRY_FIRST_S
    while True:
        try:
            await _ensure_topics_once(settings, specs, group)
            return
        except Exception as exc:
            if not passing(exc) or loop.time() + delay > deadline:
                raise
            log.warning("topic creation: %s: %s; trying again in %.1fs", type(exc).__name__, exc, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, ENSURE_TOPICS_RETRY_MAX_S)


async def _ensure_topics_once(settings: Settings, specs: list[TopicSpec], group: str | None) -> None:
    admin = await started_when_reachable(lambda: _Admin(**client_kwargs(settings)), "topic creation", settings)
    try:
        existing = set(await admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        if missing:
            try:
                replication = await replication_factor(settings, admin)
                response = await admin.create_topics([s.new_topic(replication) for s in missing])
                existed = check_created(settings, response)
                created = [s.name for s in missing if s.name not in existed]
                log.info("created topics %s", ", ".join(created))
                leaderless = await until_led(admin, created)
                if leaderless:
                    log.warning(
                        "the brokers' metadata shows no leader yet for partitions of %s after %.0fs: the worker's "
                        "first assignment may leave them out (its leader rejoins once it sees them)",
                        ", ".join(leaderless),
                        LEADERS_WAIT_S,
                    )
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


def led(described: dict[str, Any]) -> bool:
    """Whether a topic of a metadata answer (``describe_topics``) has partitions, each with a leader."""
    partitions = described.get("partitions") or []
    return not described.get("error_code") and bool(partitions) and all(p["leader"] >= 0 for p in partitions)


async def until_led(admin: Any, names: list[str], timeout_s: float | None = None) -> list[str]:
    """Wait (at most ``timeout_s``, :data:`LEADERS_WAIT_S` by default) until the brokers' metadata
    shows a leader for every partition of ``names``; the names still without, or none.

    A broker answers CreateTopics once the controller has the topics; its metadata can be a moment
    behind, longer while it deletes other topics. A worker whose consumer group is formed in that
    moment is assigned none of the partitions of the topics it has just created (Faust's assignor
    gives out only the topics its leader's metadata shows): it reports ready and processes nothing
    of them until the rejoin that follows once they show (:mod:`shared.engine._coverage`)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (LEADERS_WAIT_S if timeout_s is None else timeout_s)
    pending = list(names)
    while pending:
        try:
            described = await admin.describe_topics(pending)
        except KafkaError as exc:  # a metadata request that failed: asked again
            log.debug("metadata of new topics: %r", exc)
        else:
            shown = {d["topic"]: d for d in described}
            pending = [name for name in pending if name not in shown or not led(shown[name])]
        if not pending or loop.time() >= deadline:
            break
        await asyncio.sleep(LEADERS_POLL_S)
    return pending


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
