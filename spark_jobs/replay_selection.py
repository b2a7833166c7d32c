"""Which parked messages a replay takes, and what it sends for each (pure functions).

A parked message is read with ``shared.dead_letters.parse_dead_letter`` (missing headers
get the contract's defaults). It is selected when it matches every given filter: origin
topic (``dlq.original.topic``), error class (``dlq.error.class``) and a time range on its
last failure (``dlq.failed.at``, ``since <= t < until``).

What is sent keeps the key, the value bytes, the message's own headers and its ``dlq.*``
headers (same ``dlq.id``, origin, error, failure times), with ``dlq.attempt`` reset to 1
so the retry scheduler starts its backoff over. It goes either to ``dead-letters`` (the
scheduler schedules it again) or straight to its retry topic (``dlq.retry.topic``). Two
headers record the replay: ``statefleet.replay.run`` (the run id) and
``statefleet.replay.source`` (``<parking-lot topic>:<partition>:<offset>``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal

from shared.dead_letters import DeadLetter, HeaderList

RUN_HEADER = "statefleet.replay.run"
SOURCE_HEADER = "statefleet.replay.source"
REPLAY_HEADERS = (RUN_HEADER, SOURCE_HEADER)

Target = Literal["dead-letters", "retry"]


@dataclass(frozen=True)
class ReplayFilter:
    origin_topics: frozenset[str] = frozenset()
    error_classes: frozenset[str] = frozenset()
    since_ms: int | None = None
    until_ms: int | None = None

    def matches(self, dl: DeadLetter) -> bool:
        if self.origin_topics and dl.original_topic not in self.origin_topics:
            return False
        if self.error_classes and dl.error_class not in self.error_classes:
            return False
        if self.since_ms is not None and dl.failed_at < self.since_ms:
            return False
        return not (self.until_ms is not None and dl.failed_at >= self.until_ms)

    def describe(self) -> str:
        parts = []
        if self.origin_topics:
            parts.append("origin topic in " + ", ".join(sorted(self.origin_topics)))
        if self.error_classes:
            parts.append("error class in " + ", ".join(sorted(self.error_classes)))
        if self.since_ms is not None:
            parts.append(f"failed at >= {self.since_ms}")
        if self.until_ms is not None:
            parts.append(f"failed at < {self.until_ms}")
        return "; ".join(parts) if parts else "every parked message"


def origin_names(names: Iterable[str], prefix: str) -> frozenset[str]:
    """Origin topics as given and with the topic prefix, so ``logins`` also matches ``<prefix>logins``."""
    out: set[str] = set()
    for name in names:
        out.add(name)
        if prefix and not name.startswith(prefix):
            out.add(prefix + name)
    return frozenset(out)


def source_of(topic: str, partition: int, offset: int) -> str:
    return f"{topic}:{partition}:{offset}"


@dataclass(frozen=True)
class Replay:
    """One message to send: where, and with which headers."""

    dead_letter: DeadLetter
    target_topic: str
    headers: HeaderList
    source: str


def replay_for(dl: DeadLetter, target: Target, dead_letters_topic: str, run_id: str, source: str) -> Replay:
    reset = replace(dl, attempt=1, other_headers=[(k, v) for k, v in dl.other_headers if k not in REPLAY_HEADERS])
    headers = [*reset.headers(), (RUN_HEADER, run_id.encode()), (SOURCE_HEADER, source.encode())]
    topic = dead_letters_topic if target == "dead-letters" else dl.retry_topic
    return Replay(dead_letter=dl, target_topic=topic, headers=headers, source=source)
