"""Prometheus metrics shared by every service (served at GET /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

MESSAGES_PROCESSED = Counter(
    "statefleet_messages_processed_total", "Messages a handler finished processing", ["service", "stream"], registry=REGISTRY
)
DEAD_LETTERS_WRITTEN = Counter(
    "statefleet_dead_letters_written_total",
    "Messages this service could not process and sent to dead-letters",
    ["service", "error_class"],
    registry=REGISTRY,
)
BATCH_SECONDS = Histogram(
    "statefleet_batch_seconds",
    "Time to process one batch of messages",
    ["service", "stream"],
    registry=REGISTRY,
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
BATCH_STEP_SECONDS = Histogram(
    "statefleet_batch_step_seconds",
    "Time one batch spent in each step: read (input read back), handle, send (outputs acknowledged), "
    "log (changelog rows acknowledged), apply (local write)",
    ["service", "stream", "step"],
    registry=REGISTRY,
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
TRAILING_HOLES_REREAD = Counter(
    "statefleet_input_trailing_holes_reread_total",
    "Times the consumer was sent back to input records the stream had skipped with nothing after them",
    ["service"],
    registry=REGISTRY,
)
HTTP_FORWARDED = Counter(
    "statefleet_http_forwarded_total", "Queries forwarded to the instance that owns the key", ["service"], registry=REGISTRY
)
READS_SERVED = Counter(
    "statefleet_reads_served_total",
    "Reads answered from this instance's state, by the copy they were read from (active, standby, restoring)",
    ["service", "source"],
    registry=REGISTRY,
)
READ_LAG = Histogram(
    "statefleet_read_lag_records",
    "Changelog records behind its partition's end of the copy each read was answered from",
    ["service"],
    buckets=(0, 1, 10, 100, 1_000, 10_000, 100_000, 1_000_000),
    registry=REGISTRY,
)
#: Why a read was answered from a copy (READ_FAILOVERS' reason label).
OWNER_DID_NOT_ANSWER = "owner did not answer"
OWNER_UNAVAILABLE = "owner unavailable"
NO_OWNER = "no owner"
OWNER_SUSPECTED = "owner suspected"
LIST_PARTITION_ORPHANED = "list partition without an answering owner"
READ_FAILOVER_REASONS = (OWNER_DID_NOT_ANSWER, OWNER_UNAVAILABLE, NO_OWNER, OWNER_SUSPECTED, LIST_PARTITION_ORPHANED)
READ_FAILOVERS = Counter(
    "statefleet_read_failovers_total",
    "Reads answered from a copy because the key's owner could not answer, by why",
    ["service", "reason"],
    registry=REGISTRY,
)
PEER_FAILOVERS = Counter(
    "statefleet_peer_failovers_total",
    "Dead peers whose group member this instance had the coordinator remove (their partitions move at once)",
    ["service"],
    registry=REGISTRY,
)
PEER_RESTARTS_ANNOUNCED = Counter(
    "statefleet_peer_restarts_announced_total",
    "Peers that told this instance they were restarting (not removed while they are away)",
    ["service"],
    registry=REGISTRY,
)
TRANSACTIONS = Counter(
    "statefleet_transactions_total",
    "Batch commits as Kafka transactions (exactly_once), by outcome: committed or aborted",
    ["service", "outcome"],
    registry=REGISTRY,
)
TRANSACTIONS_FENCED = Counter(
    "statefleet_transactions_fenced_total",
    "Commits refused because the input partition's next owner fenced this instance's producer",
    ["service"],
    registry=REGISTRY,
)
TRANSACTION_COMMIT_SECONDS = Histogram(
    "statefleet_transaction_commit_seconds",
    "From a batch's commit request to committed readers seeing its records (EndTxn acknowledged: the markers are written)",
    ["service"],
    registry=REGISTRY,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
BATCH_RETRIES = Counter(
    "statefleet_batch_retries_total",
    "Batches whose commit failed on the broker side (a broker died or a partition's leader or "
    "coordinator moved) and that were delivered again instead of stopping the worker, by reason "
    "(the error's class)",
    ["service", "reason"],
    registry=REGISTRY,
)
RESTORE_RETRIES = Counter(
    "statefleet_restore_retries_total",
    "Steps of a table recovery (reading the changelogs' offsets, the bulk restore) that a broker's "
    "failure ended (a broker died, a partition's leader moved) and that were run again instead of "
    "stopping the worker, by reason (the error's class)",
    ["service", "reason"],
    registry=REGISTRY,
)
READY = Gauge("statefleet_ready", "1 when state is restored and queries are answered", ["service"], registry=REGISTRY)
UNOWNED_INPUT_TOPICS = Gauge(
    "statefleet_unowned_input_topics",
    "Input topics the group's last assignment gave no member (their records are not processed; "
    "the leader refreshes their metadata and rejoins)",
    ["service"],
    registry=REGISTRY,
)
CONSUMER_LAG = Gauge(
    "statefleet_consumer_lag_records",
    "Records of an input topic not processed yet: each assigned partition's high watermark as the "
    "consumer last fetched it, minus its processed position, summed (updated every few seconds)",
    ["service", "topic"],
    registry=REGISTRY,
)
RESTORE_SECONDS = Histogram(
    "statefleet_restore_seconds",
    "From a partition assignment to its tables restored (the bulk restore and Faust's recovery)",
    ["service"],
    registry=REGISTRY,
    buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)
RESTORED_RECORDS = Counter(
    "statefleet_restored_records_total",
    "Records read into local state during restores, by where from (changelog: the changelog topics; "
    "few when the local RocksDB copy was kept)",
    ["service", "source"],
    registry=REGISTRY,
)

LOCAL_STATE_DISCARDED = Counter(
    "statefleet_local_state_discarded_total",
    "Table partitions whose local state was discarded and restored from the changelog because it belongs to "
    "another Kafka cluster (cluster_changed), a deleted and recreated changelog (topic_recreated), is ahead of "
    "the changelog (changelog_shorter) or does not match it (not_in_changelog); input_recreated: the next offsets kept "
    "for an input deleted and created again since, read from its start",
    ["service", "table", "cause"],
    registry=REGISTRY,
)


def initialise(service: str, exactly_once: bool) -> None:
    """Creates ``service``'s series of the events that may not have happened yet, at zero:
    a dashboard (and an alert on ``increase``) then shows 0, not "no data", and the first
    event counts as an increase."""
    for counter in (PEER_FAILOVERS, PEER_RESTARTS_ANNOUNCED, HTTP_FORWARDED, TRAILING_HOLES_REREAD):
        counter.labels(service)
    for reason in READ_FAILOVER_REASONS:
        READ_FAILOVERS.labels(service, reason)
    RESTORED_RECORDS.labels(service, "changelog")
    if exactly_once:
        for outcome in ("committed", "aborted"):
            TRANSACTIONS.labels(service, outcome)
        TRANSACTIONS_FENCED.labels(service)
        TRANSACTION_COMMIT_SECONDS.labels(service)
