"""Who may do what on the secure broker: one principal per service, each granted only
what that service's worker does (docs/security.md explains each grant).

Every service:

- reads and creates the topics it consumes, writes and creates those it produces to;
- owns every topic named from its app id (``<prefix>statefleet-<service>``, by PREFIX):
  its internal topics, its tables' changelogs and Faust's ``…-__assignor-__leader``;
- joins its consumer group (the app id) and describes it (the peer watch);
- uses the transactional ids ``<app id>.<topic>.<partition>`` (by PREFIX) and writes
  idempotently, for ``exactly_once``.

The retry scheduler writes to whichever retry topic a dead letter names, so it gets every
topic whose name starts with ``<prefix>retry``.

Spark jobs get a user each too (:data:`JOBS`): the activation join reads ``account-events``
and ``logins``, and reads and writes ``activations`` (its sink looks up what a re-run batch
wrote already); the tally backfill reads ``account-events`` and ``logins`` and, when asked to
publish, writes ``program-tallies``; the archive reads ``account-events``. Spark's consumers
assign partitions and commit nothing to Kafka, so they need no group. The chart runs every
Spark job with one Secret (their executors share one pod template), so the user
:data:`SPARK_USER` holds all of the jobs' grants.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.engine import app_id
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


def service_access(service: str, topic_prefix: str = "") -> TopicAccess:
    t = TopicNames(prefix=topic_prefix)
    if service == "validator":
        # Its HTTP API writes the commands it is posted (POST /commands, /commands/batch).
        return TopicAccess(
            reads=(t.account_commands, t.account_command_batches, t.account_events, t.service_retry(service)),
            writes=(t.account_commands, t.account_command_batches, t.account_events, t.account_rejections, t.dead_letters),
        )
    if service == "tallies":
        return TopicAccess(
            reads=(t.account_events, t.logins, t.service_retry(service)), writes=(t.program_tallies, t.dead_letters)
        )
    if service == "retry_scheduler":
        # A dead letter names its retry topic (dlq.retry.topic): ``retry`` or ``retry-<service>``.
        return TopicAccess(reads=(t.dead_letters,), writes=(t.retry, t.parking_lot), write_prefixes=(t.retry,))
    raise ValueError(f"unknown service {service!r}: one of {', '.join(SERVICES)}")


def service_acls(service: str, topic_prefix: str = "", user: str | None = None) -> list[Acl]:
    principal = f"User:{user or service}"
    access = service_access(service, topic_prefix)
    # The consumer group, and the prefix of the service's own topics.
    own = app_id(service, Settings(topic_prefix=topic_prefix))

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


def job_access(job: str, topic_prefix: str = "") -> TopicAccess:
    t = TopicNames(prefix=topic_prefix)
    if job == "activation_join":
        return TopicAccess(reads=(t.account_events, t.logins, t.activations), writes=(t.activations,))
    if job == "backfill_tallies":
        return TopicAccess(reads=(t.account_events, t.logins), writes=(t.program_tallies,))
    if job == "archive_events":
        return TopicAccess(reads=(t.account_events,), writes=())
    raise ValueError(f"unknown job {job!r}: one of {', '.join(JOBS)}")


def job_acls(job: str, topic_prefix: str = "", user: str | None = None) -> list[Acl]:
    principal = f"User:{user or job}"
    access = job_access(job, topic_prefix)
    # The jobs create the topics they read when missing (spark_jobs/kafka_io.ensure).
    acls = [Acl(principal, "TOPIC", "LITERAL", topic, op) for topic in access.reads for op in ("DESCRIBE", "CREATE", "READ")]
    acls += [Acl(principal, "TOPIC", "LITERAL", topic, op) for topic in access.writes for op in ("DESCRIBE", "WRITE")]
    if access.writes:
        acls.append(Acl(principal, "CLUSTER", "LITERAL", CLUSTER, "IDEMPOTENT_WRITE"))
    return list(dict.fromkeys(acls))  # a topic both read and written is described once


def spark_acls(topic_prefix: str = "") -> list[Acl]:
    """:data:`SPARK_USER`'s ACLs: every job's, once each."""
    return list(dict.fromkeys(a for job in JOBS for a in job_acls(job, topic_prefix, user=SPARK_USER)))


def fleet_acls(topic_prefix: str = "") -> list[Acl]:
    """Every service's and job's ACLs, for topics and groups named with ``topic_prefix``."""
    return [
        *(a for service in SERVICES for a in service_acls(service, topic_prefix)),
        *(a for job in JOBS for a in job_acls(job, topic_prefix)),
        *spark_acls(topic_prefix),
    ]
