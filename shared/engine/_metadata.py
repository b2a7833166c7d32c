"""Keep cluster metadata for every topic a Kafka client has used.

aiokafka's client refreshes metadata for all topics until it tracks a topic, and from
then on only for the topics it tracks. It tracks a topic only when a send finds no
metadata for it. So a topic first seen in an all-topics refresh (a changelog created
before the worker started, the inbox, the parking lot) is used without being tracked;
the first send to a topic created later switches the client to tracked topics only,
and the next refresh drops the untracked ones from its metadata. Records for them
still queued then have a partition without a known leader: the sender keeps asking
for the same metadata and the records wait until the request timeout (20 minutes in
Faust), with no error logged. A handler awaiting their acknowledgement (a changelog
write, a flush before redelivery) stops processing meanwhile.

:func:`track_used_topics` makes every send track its topic, so the refresh keeps it.
"""

from __future__ import annotations

from typing import Any

from aiokafka.client import AIOKafkaClient

_original_wait_on_metadata = AIOKafkaClient._wait_on_metadata


async def _wait_on_metadata_tracking(self: AIOKafkaClient, topic: str) -> Any:
    # Tracking a topic that already has metadata needs no refresh now; the periodic and
    # forced refreshes include it from here on.
    self._topics.add(topic)
    return await _original_wait_on_metadata(self, topic)


def track_used_topics() -> None:
    """Install the fix for every aiokafka client of this process (idempotent)."""
    AIOKafkaClient._wait_on_metadata = _wait_on_metadata_tracking  # type: ignore[method-assign]
