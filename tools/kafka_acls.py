"""Who may do what on the secure broker: one principal per service, each granted only
what that service's worker does (docs/security.md explains each grant).

Every service:

- reads and creates the topics it consumes, writes and creates those it produces to;
- owns every topic named from its app id (``<prefix>statefleet-<service>``, by PREFIX):
  its internal topics, its tables' changelogs and Faust's ``…-__assignor-__leader``;
- joins its consumer group (the app id) and describes it (the peer watch);
- uses the transactional ids ``<app id>.<topic>.<partition>`` (by PREFIX) and writes
  idempotently, for ``exactly_once``.

The validator's topics are those of its domain and the tallies' those of their projection
(:func:`service_access`; the accounts' by default); the tallies of another projection than
the accounts' are named ``tallies-<name>`` (group, own topics, retry topic).

The retry scheduler writes to whichever retry topic a dead letter names, so it gets every
topic whose name starts with ``<prefix>retry``.

Spark jobs get a user each too (:data:`JOBS`), granted the topics the job's own arguments
name (:func:`job_access`, read by the job's own parser). With the defaults: the activation
join reads ``account-events`` and ``logins``, and reads and writes ``activations`` (its sink
looks up what a re-run batch wrote already); the tally backfill reads ``account-events`` and
``logins`` and, when asked to publish, writes ``program-tallies``; the archive reads
``account-events``. With a team's arguments (the join's ``--first-topic``, ``--then-topic``
and ``--output-topic``, the backfill's ``--projection`` and ``--publish-topic``, the
archive's ``--topic``) the grants follow those topics instead. Spark's consumers assign
partitions and commit nothing to Kafka, so they need no group. The chart runs every Spark job
with one Secret (their executors share one pod template), so the user :data:`SPARK_USER`
holds all of the jobs' grants (:func:`spark_acls`; :func:`spark_jobs_of` reads the jobs and
their arguments from the chart's containers).
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from shared.engine import app_id
from shared.projection import load_projection
from shared.settings import Settings
from shared.topics import TopicNames

#: The principal the tooling connects as: a super user (ACLs do not apply to it).
ADMIN_USER = "admin"
#: The services that connect to Kafka; each connects as the user of its own name.
SERVICES = ("validator", "tallies", "retry_scheduler")
#: The Spark jobs granted a user of their own (of the job's name).
JOBS = ("activation_join", "backfill_tallies", "archive_events")
#: The one user of every Spark job together, as the chart's ``spark`` workload connects.
SPARK_USER = "spark"
#: Every user the fleet's services and jobs connect as.
USERS = (*SERVICES, *JOBS, SPARK_USER)
#: The one resource name of the cluster resource.
CLUSTER = "kafka-cluster"


@dataclass(frozen=True)
class Acl:
    """One ALLOW binding for any host, in Kafka's Admin API terms."""

    principal: str
    resource_type: str  # TOPIC, GROUP, TRANSACTIONAL_ID, CLUSTER
    pattern_type: str  # LITERAL or PREFIXED
    name: str
    operation: str  # READ, WRITE, CREATE, DESCRIBE, IDEMPOTENT_WRITE

    def spec_line(self) -> str:
        return f"acl {self.principal} {self.resource_type} {self.pattern_type} {self.name} {self.operation}"


@dataclass(frozen=True)
class TopicAccess:
    """The topics a service or a Spark job reads and writes (literal names), and the prefixes it writes to."""

    reads: tuple[str, ...]
    writes: tuple[str, ...]
    write_prefixes: tuple[str, ...] = ()


def service_access(service: str, topic_prefix: str = "", domain: str | None = None, projection: str | None = None) -> TopicAccess:
    """The topics ``service`` reads and writes: the validator's those of its domain (``domain``,
    its STATEFLEET_VALIDATOR_DOMAIN; None: the accounts), the tallies' those of its projection
    (``projection``, its STATEFLEET_TALLIES_PROJECTION; None: the accounts tallies), loaded by
    the services' own loaders (which raise, naming the module, for one that cannot be loaded)."""
    t = TopicNames(prefix=topic_prefix)
    if service == "validator":
        from services.validator.app import configured_domain

        d = configured_domain(Settings(validator_domain=domain or "")).topics
        commands, batches, events, rejections = (t.name(n) for n in (d.commands, d.command_batches, d.events, d.rejections))
        # Its HTTP API writes the commands it is posted (POST /commands, /commands/batch).
        return TopicAccess(
            reads=(commands, batches, events, t.service_retry(service)),
            writes=(commands, batches, events, rejections, t.dead_letters),
        )
    if service == "tallies":
        from services.tallies.app import configured_projection
        from services.tallies.state import service_name

        p = configured_projection(Settings(tallies_projection=projection))
        inputs = tuple(t.name(i.topic) for i in p.inputs)
        return TopicAccess(reads=(*inputs, t.service_retry(service_name(p))), writes=(t.name(p.output_topic), t.dead_letters))
    if service == "retry_scheduler":
        # A dead letter names its retry topic (dlq.retry.topic): ``retry`` or ``retry-<service>``.
        return TopicAccess(reads=(t.dead_letters,), writes=(t.retry, t.parking_lot), write_prefixes=(t.retry,))
    raise ValueError(f"unknown service {service!r}: one of {', '.join(SERVICES)}")


def engine_name(service: str, projection: str | None = None) -> str:
    """What the service's group and own topics are named from: the tallies of a projection other
    than the accounts' run as ``tallies-<name>`` (services/tallies/state.py, service_name)."""
    if service != "tallies" or not projection:
        return service
    from services.tallies.app import configured_projection
    from services.tallies.state import service_name

    return service_name(configured_projection(Settings(tallies_projection=projection)))


def service_acls(
    service: str, topic_prefix: str = "", user: str | None = None, domain: str | None = None, projection: str | None = None
) -> list[Acl]:
    principal = f"User:{user or service}"
    access = service_access(service, topic_prefix, domain, projection)
    # The consumer group, and the prefix of the service's own topics.
    own = app_id(engine_name(service, projection), Settings(topic_prefix=topic_prefix))

    def acl(resource_type: str, pattern_type: str, name: str, operation: str) -> Acl:
        return Acl(principal, resource_type, pattern_type, name, operation)

    acls: list[Acl] = []
    for topic in dict.fromkeys((*access.reads, *access.writes)):
        # Services create the topics they use when missing (shared/runtime.py), as without ACLs.
        acls.append(acl("TOPIC", "LITERAL", topic, "CREATE"))
        acls.append(acl("TOPIC", "LITERAL", topic, "DESCRIBE"))
    acls += [acl("TOPIC", "LITERAL", topic, "READ") for topic in access.reads]
    acls += [acl("TOPIC", "LITERAL", topic, "WRITE") for topic in access.writes]
    for prefix in access.write_prefixes:
        acls += [acl("TOPIC", "PREFIXED", prefix, op) for op in ("WRITE", "DESCRIBE")]
    acls += [acl("TOPIC", "PREFIXED", own, op) for op in ("CREATE", "DESCRIBE", "READ", "WRITE")]
    acls += [acl("GROUP", "LITERAL", own, op) for op in ("READ", "DESCRIBE")]
    acls += [acl("TRANSACTIONAL_ID", "PREFIXED", f"{own}.", op) for op in ("WRITE", "DESCRIBE")]
    acls.append(acl("CLUSTER", "LITERAL", CLUSTER, "IDEMPOTENT_WRITE"))
    return acls


def job_access(job: str, topic_prefix: str = "", args: Sequence[str] = (), projection: str | None = None) -> TopicAccess:
    """The topics ``job`` reads and writes when run with ``args`` (its command-line arguments),
    as the job itself reads them: with its own parser and the same resolution of defaults.
    ``projection`` is the backfill's ``STATEFLEET_TALLIES_PROJECTION`` (its ``--projection``
    wins; neither: the accounts tallies). Raises ``ValueError`` for arguments the job refuses,
    ``ProjectionError`` for a projection that cannot be loaded."""
    # The jobs' modules import pyspark: imported here, for the callers that ask about jobs.
    from services.tallies.domain import PROJECTION as ACCOUNTS_TALLIES
    from spark_jobs import activation_join, archive_events, backfill_tallies
    from spark_jobs.config import load_spark_settings

    t = TopicNames(prefix=topic_prefix)
    if job == "activation_join":
        join = _parsed(activation_join.parser(), job, args)
        spec = activation_join.spec_of(join)
        output = join.output_topic or t.name(spec.default_output or "")
        inputs = (t.name(spec.first.topic), t.name(spec.then.topic), output)
        return TopicAccess(reads=tuple(dict.fromkeys(inputs)), writes=(output,))
    if job == "backfill_tallies":
        backfill = _parsed(backfill_tallies.parser(), job, args)
        spec_name = backfill.projection or projection
        rebuilt = load_projection(spec_name) if spec_name else ACCOUNTS_TALLIES
        publish = t.name(backfill.publish_topic or rebuilt.output_topic)
        return TopicAccess(reads=tuple(t.name(i.topic) for i in rebuilt.inputs), writes=(publish,))
    if job == "archive_events":
        archive = archive_events.options_of(_parsed(archive_events.parser(), job, args), load_spark_settings(), t)
        return TopicAccess(reads=(t.name(archive.topic),), writes=())
    raise ValueError(f"unknown job {job!r}: one of {', '.join(JOBS)}")


def _parsed(parser: argparse.ArgumentParser, job: str, args: Sequence[str]) -> argparse.Namespace:
    try:
        return parser.parse_args(list(args))
    except SystemExit as exc:  # argparse has printed why
        raise ValueError(f"{job} refuses its arguments {shlex.join(args)}") from exc


def job_acls(
    job: str, topic_prefix: str = "", user: str | None = None, args: Sequence[str] = (), projection: str | None = None
) -> list[Acl]:
    principal = f"User:{user or job}"
    access = job_access(job, topic_prefix, args, projection)
    # The jobs create the topics they read when missing (spark_jobs/kafka_io.ensure).
    acls = [Acl(principal, "TOPIC", "LITERAL", topic, op) for topic in access.reads for op in ("DESCRIBE", "CREATE", "READ")]
    acls += [Acl(principal, "TOPIC", "LITERAL", topic, op) for topic in access.writes for op in ("DESCRIBE", "WRITE")]
    if access.writes:
        acls.append(Acl(principal, "CLUSTER", "LITERAL", CLUSTER, "IDEMPOTENT_WRITE"))
    return list(dict.fromkeys(acls))  # a topic both read and written is described once


#: The Spark jobs that run, each with its command-line arguments.
JobArgs = Mapping[str, Sequence[str]]
#: Every job, with its default arguments (the accounts').
DEFAULT_JOBS: JobArgs = {job: () for job in JOBS}


def spark_jobs_of(commands: Iterable[Sequence[str]]) -> dict[str, tuple[str, ...]]:
    """The jobs of :data:`JOBS` among container commands ``[module, *args]`` (the chart's Spark
    containers run ``spark_jobs.<job>`` with the job's ``args`` values), with their arguments.
    Other commands (a service, the dead-letter replay, which has no user of its own) are left out."""
    jobs: dict[str, tuple[str, ...]] = {}
    for module, *args in commands:
        package, _, job = module.partition(".")
        if package == "spark_jobs" and job in JOBS:
            if job in jobs and jobs[job] != tuple(args):
                raise ValueError(f"{job} runs with two sets of arguments: {shlex.join(jobs[job])} and {shlex.join(args)}")
            jobs[job] = tuple(args)
    return jobs


def spark_acls(topic_prefix: str = "", jobs: JobArgs = DEFAULT_JOBS, projection: str | None = None) -> list[Acl]:
    """:data:`SPARK_USER`'s ACLs: every one of ``jobs``' (run with their arguments), once each."""
    return list(dict.fromkeys(a for job, args in jobs.items() for a in job_acls(job, topic_prefix, SPARK_USER, args, projection)))


def fleet_acls(
    topic_prefix: str = "", jobs: JobArgs = DEFAULT_JOBS, projection: str | None = None, domain: str | None = None
) -> list[Acl]:
    """Every service's and job's ACLs, for topics and groups named with ``topic_prefix``: the
    validator's for its ``domain``, the tallies' and the backfill's for their ``projection``,
    the Spark jobs' for the topics their arguments name."""
    return [
        *(a for service in SERVICES for a in service_acls(service, topic_prefix, domain=domain, projection=projection)),
        *(a for job, args in jobs.items() for a in job_acls(job, topic_prefix, args=args, projection=projection)),
        *spark_acls(topic_prefix, jobs, projection),
    ]
