"""Prometheus metrics of the retry scheduler (served at GET /metrics with the shared ones)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from shared.metrics import REGISTRY

SCHEDULED = Counter("statefleet_retry_scheduled_total", "Dead letters scheduled for redelivery", registry=REGISTRY)
DUPLICATES = Counter(
    "statefleet_retry_duplicates_total",
    "Dead letters dropped as copies of one already taken in (kind: why; each is logged)",
    ["kind"],
    registry=REGISTRY,
)
REFAILURES = Counter(
    "statefleet_retry_refailures_total",
    "Dead letters of an attempt already redelivered taken as its next attempt, by what their producer wrote: "
    "attempt-kept (the headers it got) or attempt-lower (an earlier attempt, or none)",
    ["how"],
    registry=REGISTRY,
)
REDELIVERED = Counter(
    "statefleet_retry_redelivered_total", "Messages redelivered to their retry topic", ["trigger"], registry=REGISTRY
)
REDELIVERY_FAILED = Counter(
    "statefleet_retry_redelivery_failed_total",
    "Redeliveries the broker did not acknowledge (kept, tried again)",
    registry=REGISTRY,
)
PARKED = Counter("statefleet_retry_parked_total", "Messages published to the parking lot", registry=REGISTRY)
PARKED_REMOVED = Counter(
    "statefleet_retry_parked_removed_total",
    "Parked messages removed without a redelivery (how: deleted over HTTP, expired by the retention)",
    ["how"],
    registry=REGISTRY,
)
CANCELLED = Counter("statefleet_retry_cancelled_total", "Scheduled messages cancelled over HTTP", registry=REGISTRY)
TICK_SECONDS = Histogram(
    "statefleet_retry_tick_seconds",
    "Time of one tick of one partition: scan, redeliver, wait for acks, delete",
    registry=REGISTRY,
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
LATENESS_SECONDS = Histogram(
    "statefleet_retry_lateness_seconds",
    "Redelivered at minus due at",
    registry=REGISTRY,
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
)
STORED = Gauge("statefleet_retry_stored", "Messages held by this instance", ["table"], registry=REGISTRY)
ORDERED = Counter(
    "statefleet_retry_ordered_total",
    "Ordered retries: records held behind a head, released, parked past the cap, acknowledgements ignored",
    ["event"],
    registry=REGISTRY,
)
