"""Topic names in one place. Each is configurable through the prefix."""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

from shared.settings import Settings

ACCOUNT_COMMANDS = "account-commands"
ACCOUNT_COMMAND_BATCHES = "account-command-batches"
ACCOUNT_EVENTS = "account-events"
ACCOUNT_REJECTIONS = "account-rejections"
LOGINS = "logins"
PROGRAM_TALLIES = "program-tallies"
DEAD_LETTERS = "dead-letters"
RETRY = "retry"
PARKING_LOT = "parking-lot"
RETRY_ACKS = "retry-acks"
RETRY_BLOCKED_KEYS = "retry-blocked-keys"
ACTIVATIONS = "activations"


@dataclass(frozen=True)
class TopicNames:
    prefix: str = ""

    def name(self, base: str) -> str:
        return f"{self.prefix}{base}"

    @property
    def account_commands(self) -> str:
        return self.name(ACCOUNT_COMMANDS)

    @property
    def account_command_batches(self) -> str:
        return self.name(ACCOUNT_COMMAND_BATCHES)

    @property
    def account_events(self) -> str:
        return self.name(ACCOUNT_EVENTS)

    @property
    def account_rejections(self) -> str:
        return self.name(ACCOUNT_REJECTIONS)

    @property
    def logins(self) -> str:
        return self.name(LOGINS)

    @property
    def program_tallies(self) -> str:
        return self.name(PROGRAM_TALLIES)

    @property
    def dead_letters(self) -> str:
        return self.name(DEAD_LETTERS)

    @property
    def retry(self) -> str:
        return self.name(RETRY)

    @property
    def parking_lot(self) -> str:
        return self.name(PARKING_LOT)

    @property
    def retry_acks(self) -> str:
        """Ordered retries: consumers acknowledge a redelivered head's success here."""
        return self.name(RETRY_ACKS)

    @property
    def retry_blocked_keys(self) -> str:
        """Ordered retries: compacted, the keys with a dead letter scheduled or parked and their head."""
        return self.name(RETRY_BLOCKED_KEYS)

    @property
    def activations(self) -> str:
        return self.name(ACTIVATIONS)

    def service_retry(self, service: str) -> str:
        """The retry topic a service consumes its own redelivered dead letters from."""
        return self.name(f"{RETRY}-{service}")


def topic_names(settings: Settings) -> TopicNames:
    return TopicNames(prefix=settings.topic_prefix)


def configured_name(topic: str, names: Container[str], prefix: str = "") -> str | None:
    """The name in ``names`` that a setting gives ``topic`` by: the topic's own name, or the
    name without the topic prefix (settings such as per-topic policies and ordered topics list
    topics either way). None when neither is listed."""
    if topic in names:
        return topic
    if prefix and topic.startswith(prefix) and topic[len(prefix) :] in names:
        return topic[len(prefix) :]
    return None
