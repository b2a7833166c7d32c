"""Prometheus metrics of the retry scheduler (served at GET /metrics with the shared ones)."""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge, Histogram

from shared.metrics import REGISTRY

#: The ``origin_topic`` label of a topic without a label of its own (see :class:`OriginTopicLabels`).
OTHER = "other"

SCHEDULED = Counter(
    "statefleet_retry_scheduled_total",
    "Dead letters scheduled for redelivery, by origin topic (the most frequent ones; the rest: other)",
    ["origin_topic"],
    registry=REGISTRY,
)
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
    "statefleet_retry_redelivered_total",
    "Messages redelivered to their retry topic, by trigger and origin topic (the most frequent ones; the rest: other)",
    ["trigger", "origin_topic"],
    registry=REGISTRY,
)
REDELIVERY_FAILED = Counter(
    "statefleet_retry_redelivery_failed_total",
    "Redeliveries the broker did not acknowledge (kept, tried again)",
    registry=REGISTRY,
)
PARKED = Counter(
    "statefleet_retry_parked_total",
    "Messages published to the parking lot, by origin topic (the most frequent ones; the rest: other)",
    ["origin_topic"],
    registry=REGISTRY,
)
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


class OriginTopicLabels:
    """The ``origin_topic`` label of the scheduled, redelivered and parked counters, with bounded
    cardinality: at most ``max_topics`` topics have a label of their own, the rest count as
    ``other``.

    While fewer than ``max_topics`` have one, a topic gets its label when first seen. Then a topic
    without one takes the place of the least frequent labelled topic once it has been seen more
    than twice as often as that one since the latter was labelled (the evicted topic's series are
    removed and it counts as ``other`` from then on). How often topics are seen is tracked for
    at most ``4 * max_topics`` unlabelled topics (the least seen is forgotten first), so memory is
    bounded too however many topics send dead letters."""

    def __init__(self, max_topics: int = 50) -> None:
        self.configure(max_topics)

    def configure(self, max_topics: int) -> None:
        self.max_topics = max_topics
        self.seen: dict[str, int] = {}  # labelled topics: events since labelled
        self.candidates: dict[str, int] = {}  # unlabelled topics: events seen (bounded)

    def label(self, topic: str, events: int = 1) -> str:
        """The label to count ``events`` events of ``topic`` under (and the events counted)."""
        seen = self.seen
        count = seen.get(topic)
        if count is not None:
            seen[topic] = count + events
            return topic
        if len(seen) < self.max_topics:
            seen[topic] = events
            return topic
        if self.max_topics == 0:
            return OTHER
        candidates = self.candidates
        mine = candidates.get(topic, 0) + events
        least = min(seen, key=seen.__getitem__)
        if mine > 2 * seen[least]:
            del seen[least]
            candidates.pop(topic, None)
            _remove_series(least)
            seen[topic] = mine
            return topic
        if topic not in candidates and len(candidates) >= 4 * self.max_topics:
            del candidates[min(candidates, key=candidates.__getitem__)]
        candidates[topic] = mine
        return OTHER


def _remove_series(topic: str) -> None:
    for counter in (SCHEDULED, PARKED):
        with contextlib.suppress(KeyError):
            counter.remove(topic)
    for trigger in list(REDELIVERY_TRIGGERS):
        with contextlib.suppress(KeyError):
            REDELIVERED.remove(trigger, topic)


#: The ``trigger`` label values of the redelivered counter.
REDELIVERY_TRIGGERS = ("tick", "replay", "unpark", "group-replay", "ordered")
#: The process's labels (configured by the service from ``STATEFLEET_RETRY_METRICS_ORIGIN_TOPICS``).
ORIGIN_TOPICS = OriginTopicLabels()

# Every counter by origin topic has its ``other`` series from the start, at 0: the dashboard's
# rates and the alerts read a series before the first dead letter comes (an unlabelled
# counter has one from the start; a labelled one only once a label is used).
for _counter in (SCHEDULED, PARKED):
    _counter.labels(OTHER)
for _trigger in REDELIVERY_TRIGGERS:
    REDELIVERED.labels(_trigger, OTHER)
