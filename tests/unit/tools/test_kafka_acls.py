"""What each service's user may do on the secure broker (tools/kafka_acls.py)."""

from __future__ import annotations

from tools.kafka_acls import JOBS, Acl, fleet_acls, job_acls, service_acls, spark_acls


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
