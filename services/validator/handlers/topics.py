"""The topics the validator's handlers read and write: its domain's (the contract's, for the
accounts domain), and its own internal ones."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.validator import SERVICE
from shared.domain import Domain
from shared.engine import DeadLetterRoute, app_id
from shared.settings import Settings
from shared.topics import topic_names


@dataclass(frozen=True)
class ValidatorTopics:
    commands: str
    command_batches: str
    events: str
    rejections: str
    dead_letters: str
    #: Dead letters the retry scheduler sends back to this service.
    retry: str
    #: Internal, keyed by command_id: the records behind GET /commands/{command_id}.
    outcomes: str
    #: Internal, keyed by batch_id: each batch item's outcome (GET /batches/{batch_id}).
    batch_outcomes: str
    #: Internal, keyed by program_id: the category projection's second hop (accounts only).
    by_program: str

    @classmethod
    def of(cls, settings: Settings, domain: Domain[Any]) -> ValidatorTopics:
        topics, internal = topic_names(settings), app_id(SERVICE, settings)
        return cls(
            commands=topics.name(domain.topics.commands),
            command_batches=topics.name(domain.topics.command_batches),
            events=topics.name(domain.topics.events),
            rejections=topics.name(domain.topics.rejections),
            dead_letters=topics.dead_letters,
            retry=topics.service_retry(SERVICE),
            outcomes=f"{internal}-outcomes",
            batch_outcomes=f"{internal}-batch-outcomes",
            by_program=f"{internal}-by-program",
        )

    def dead_letter_route(self) -> DeadLetterRoute:
        return DeadLetterRoute(SERVICE, self.dead_letters, self.retry)
