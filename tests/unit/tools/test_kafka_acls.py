"""What each service's user may do on the secure broker (tools/kafka_acls.py)."""

from __future__ import annotations

import pytest

from shared.projection import ProjectionError
from tools.kafka_acls import JOBS, Acl, fleet_acls, job_acls, service_acls, spark_acls, spark_jobs_of


def grants(acls: list[Acl]) -> set[tuple[str, str, str, str]]:
    return {(a.resource_type, a.pattern_type, a.name, a.operation) for a in acls}


def test_tallies_read_their_inputs_and_write_only_their_outputs() -> None:
    acls = service_acls("tallies", "p.")
    assert {a.principal for a in acls} == {"User:tallies"}
    g = grants(acls)
    for topic in ("p.account-events", "p.logins", "p.retry-tallies"):
        assert ("TOPIC", "LITERAL", topic, "READ") in g
    for topic in ("p.program-tallies", "p.dead-letters"):
        assert ("TOPIC", "LITERAL", topic, "WRITE") in g
    writes = {name for kind, _, name, op in g if kind == "TOPIC" and op == "WRITE"}
    assert writes == {"p.program-tallies", "p.dead-letters", "p.statefleet-tallies"}
    # Its own topics (internal, changelogs, Faust's leader topic) by prefix, its group, its transactions.
    assert ("TOPIC", "PREFIXED", "p.statefleet-tallies", "CREATE") in g
    assert ("GROUP", "LITERAL", "p.statefleet-tallies", "READ") in g
    assert ("TRANSACTIONAL_ID", "PREFIXED", "p.statefleet-tallies.", "WRITE") in g
    assert ("CLUSTER", "LITERAL", "kafka-cluster", "IDEMPOTENT_WRITE") in g
    assert not any(name.startswith("p.statefleet-validator") for _, _, name, _ in g)


def test_the_retry_scheduler_writes_every_retry_topic_by_prefix() -> None:
    g = grants(service_acls("retry_scheduler", "p."))
    assert ("TOPIC", "PREFIXED", "p.retry", "WRITE") in g
    assert ("TOPIC", "LITERAL", "p.dead-letters", "READ") in g
    assert ("TOPIC", "LITERAL", "p.parking-lot", "WRITE") in g
    reads = {name for kind, _, name, op in g if kind == "TOPIC" and op == "READ"}
    assert reads == {"p.dead-letters", "p.statefleet-retry_scheduler"}


def test_no_service_is_granted_anything_on_the_cluster_but_idempotent_writes() -> None:
    cluster = {a.operation for a in fleet_acls() if a.resource_type == "CLUSTER"}
    assert cluster == {"IDEMPOTENT_WRITE"}
    assert all(a.principal != "User:admin" for a in fleet_acls())


def test_the_activation_join_reads_its_inputs_and_writes_only_activations() -> None:
    g = grants(job_acls("activation_join", "p."))
    reads = {name for kind, _, name, op in g if kind == "TOPIC" and op == "READ"}
    writes = {name for kind, _, name, op in g if kind == "TOPIC" and op == "WRITE"}
    assert reads == {"p.account-events", "p.logins", "p.activations"}  # its sink reads back what it wrote
    assert writes == {"p.activations"}
    assert not any(kind == "GROUP" for kind, _, _, _ in g)  # Spark's consumers assign, commit nothing


def test_the_backfill_reads_its_inputs_and_may_publish_only_tallies() -> None:
    g = grants(job_acls("backfill_tallies", "p."))
    reads = {name for kind, _, name, op in g if kind == "TOPIC" and op == "READ"}
    writes = {name for kind, _, name, op in g if kind == "TOPIC" and op == "WRITE"}
    assert reads == {"p.account-events", "p.logins"}
    assert writes == {"p.program-tallies"}  # with --publish-topic


def test_the_archive_only_reads_events() -> None:
    g = grants(job_acls("archive_events", "p."))
    assert {op for kind, _, _, op in g if kind == "TOPIC"} == {"DESCRIBE", "CREATE", "READ"}
    assert {name for _, _, name, _ in g} == {"p.account-events"}  # and nothing on the cluster


def test_the_spark_user_holds_every_jobs_grants_and_nothing_more() -> None:
    acls = spark_acls("p.")
    assert {a.principal for a in acls} == {"User:spark"}
    assert len(acls) == len(set(acls))
    assert grants(acls) == set().union(*(grants(job_acls(job, "p.")) for job in JOBS))


def topic_grants(acls: list[Acl], operation: str) -> set[str]:
    """The topics ``operation`` is granted on by name (not by prefix)."""
    return {name for kind, pattern, name, op in grants(acls) if (kind, pattern, op) == ("TOPIC", "LITERAL", operation)}


ORDERS_JOIN = [
    "--first-topic", "order-events", "--first-kind", "OrderPlaced", "--key", "aggregate_id",
    "--then-topic", "order-events", "--then-kind", "OrderShipped", "--then-time", "occurred_at",
    "--carry", "data.customer_id", "--key-name", "order_id", "--window", "7d", "--output-topic", "p.order-shipments",
]  # fmt: skip


def test_the_join_is_granted_the_topics_its_arguments_name() -> None:
    acls = job_acls("activation_join", "p.", args=ORDERS_JOIN)
    # Both kinds on one topic; the output is a full name (no prefix added), read back by the sink.
    assert topic_grants(acls, "READ") == {"p.order-events", "p.order-shipments"}
    assert topic_grants(acls, "WRITE") == {"p.order-shipments"}
    assert topic_grants(acls, "CREATE") == {"p.order-events", "p.order-shipments"}  # it creates what it reads when missing
    logins = job_acls("activation_join", "p.", args=["--then-topic", "visits", "--output-topic", "p.returns"])
    assert topic_grants(logins, "READ") == {"p.account-events", "p.visits", "p.returns"}


def test_the_backfill_is_granted_its_projections_inputs_and_output() -> None:
    orders = "examples.orders.projection:PROJECTION"
    by_argument = job_acls("backfill_tallies", "p.", args=["--projection", orders])
    assert (topic_grants(by_argument, "READ"), topic_grants(by_argument, "WRITE")) == ({"p.order-events"}, {"p.order-tallies"})
    # The job's STATEFLEET_TALLIES_PROJECTION, when its arguments name none; --publish-topic is what it writes.
    by_setting = job_acls("backfill_tallies", "p.", args=["--publish-topic", "rebuilt"], projection=orders)
    assert (topic_grants(by_setting, "READ"), topic_grants(by_setting, "WRITE")) == ({"p.order-events"}, {"p.rebuilt"})


def test_the_archive_is_granted_the_topic_it_archives() -> None:
    acls = job_acls("archive_events", "p.", args=["--available-now", "--topic", "order-events", "--fields", "aggregate_id"])
    assert {name for _, _, name, _ in grants(acls)} == {"p.order-events"}
    assert topic_grants(acls, "WRITE") == set()


@pytest.mark.parametrize(
    ("job", "args", "message"),
    [
        ("activation_join", ["--first-kind", "OrderPlaced"], "--output-topic is required"),
        ("activation_join", ["--no-such-flag"], "activation_join refuses its arguments --no-such-flag"),
        ("archive_events", ["--topic", ""], "--topic must name a topic"),
        ("backfill_tallies", ["--projection", "no.such.module:P"], "cannot import projection module 'no.such.module'"),
    ],
)
def test_arguments_a_job_refuses_grant_nothing(job: str, args: list[str], message: str) -> None:
    with pytest.raises((ValueError, ProjectionError), match=message):
        job_acls(job, "p.", args=args)


def test_the_spark_user_holds_the_grants_of_the_jobs_that_run_with_their_arguments() -> None:
    commands = [
        ["spark_jobs.activation_join", *ORDERS_JOIN],
        ["spark_jobs.archive_events", "--topic", "order-events"],
        ["spark_jobs.replay_dead_letters"],  # no user of its own: not granted here
        ["services.tallies"],
    ]
    jobs = spark_jobs_of(commands)
    assert jobs == {"activation_join": tuple(ORDERS_JOIN), "archive_events": ("--topic", "order-events")}
    acls = spark_acls("p.", jobs)
    assert {a.principal for a in acls} == {"User:spark"}
    assert topic_grants(acls, "READ") == {"p.order-events", "p.order-shipments"}  # no backfill, no accounts topics
    fleet = fleet_acls("p.", jobs)
    assert {a.principal for a in fleet if a.principal != "User:spark"} >= {"User:activation_join", "User:archive_events"}
    assert not any(a.principal == "User:backfill_tallies" for a in fleet)


def test_one_job_with_two_sets_of_arguments_is_refused() -> None:
    with pytest.raises(ValueError, match="archive_events runs with two sets of arguments"):
        spark_jobs_of([["spark_jobs.archive_events"], ["spark_jobs.archive_events", "--topic", "order-events"]])


def test_the_validator_is_granted_its_domains_topics() -> None:
    acls = service_acls("validator", "p.", domain="examples.orders.domain:ORDERS")
    orders = {f"p.order-{name}" for name in ("commands", "command-batches", "events")}
    assert topic_grants(acls, "READ") == {*orders, "p.retry-validator"}
    assert topic_grants(acls, "WRITE") == {*orders, "p.order-rejections", "p.dead-letters"}
    assert ("GROUP", "LITERAL", "p.statefleet-validator", "READ") in grants(acls)  # named from the prefix, not the domain


def test_the_tallies_of_a_projection_are_granted_its_topics_and_their_own_names() -> None:
    acls = service_acls("tallies", "p.", projection="examples.orders.projection:PROJECTION")
    assert topic_grants(acls, "READ") == {"p.order-events", "p.retry-tallies-orders"}
    assert topic_grants(acls, "WRITE") == {"p.order-tallies", "p.dead-letters"}
    g = grants(acls)
    # Its group, changelogs and transactional ids are named from tallies-orders.
    assert ("GROUP", "LITERAL", "p.statefleet-tallies-orders", "READ") in g
    assert ("TOPIC", "PREFIXED", "p.statefleet-tallies-orders", "WRITE") in g
    assert ("TRANSACTIONAL_ID", "PREFIXED", "p.statefleet-tallies-orders.", "WRITE") in g
    assert not any("account" in name or "logins" in name for _, _, name, _ in g)
