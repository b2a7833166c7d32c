"""The validator service: its topology, composed of one sub-topology per concern.

Every handler gets one input partition's records exactly once, in order (the engine's
:class:`~shared.engine.InputBatch`); the engine sends what it staged, waits for the
acknowledgements, and only then writes its rows with the input's next offset, changelog
first.

- :mod:`~services.validator.handlers.commands`: ``validate`` (the domain's command topic,
  ``account-commands`` for accounts) and ``redeliver`` (``retry-validator``), over the
  ``accounts`` table;
- :mod:`~services.validator.handlers.outcomes`: ``record_outcomes`` (internal
  ``…-outcomes``), over ``outcomes``;
- :mod:`~services.validator.handlers.program_listings` (the accounts domain only):
  ``route_events`` (``account-events``) and ``project`` (internal ``…-by-program``), over
  ``program-accounts``;
- :mod:`~services.validator.handlers.command_batches`: ``split_command_batches``
  (the domain's command batch topic, ``account-command-batches`` for accounts) and ``record_batch_outcomes`` (internal
  ``…-batch-outcomes``), over ``batches``.

The domain is :data:`~services.validator.domain.ACCOUNTS` unless
``STATEFLEET_VALIDATOR_DOMAIN`` names another (:func:`shared.domain.load_domain`).

Each module's docstring says what its handlers do and why their order of writes is safe.
"""

from __future__ import annotations

from typing import Any

from services.validator import DEFAULT_PORT, SERVICE
from services.validator.domain import ACCOUNTS
from services.validator.handlers.command_batches import CommandBatches
from services.validator.handlers.commands import Commands
from services.validator.handlers.outcomes import Outcomes
from services.validator.handlers.program_listings import ProgramListings
from services.validator.handlers.topics import ValidatorTopics
from shared.domain import Domain, load_domain
from shared.engine import Engine, TopicSpec
from shared.settings import Settings
from shared.topics import topic_names


def configured_domain(settings: Settings) -> Domain[Any]:
    """The domain ``STATEFLEET_VALIDATOR_DOMAIN`` names, or the bundled accounts domain.
    Raises :class:`shared.domain.DomainError` (naming the module and what is wrong) at start."""
    return load_domain(settings.validator_domain) if settings.validator_domain else ACCOUNTS


class ValidatorService:
    def __init__(self, settings: Settings, domain: Domain[Any] | None = None) -> None:
        self.settings = settings
        self.domain = domain = domain if domain is not None else configured_domain(settings)
        self.topics = topic_names(settings)
        self.own_topics = own = ValidatorTopics.of(settings, domain)
        self.engine = engine = Engine(SERVICE, settings, DEFAULT_PORT)
        self.commands = Commands(engine, settings, own, domain)
        self.outcomes = Outcomes(engine, settings, own)
        #: The category projection of the accounts domain (GET /programs/{program_id}/accounts).
        self.program_listings = ProgramListings(engine, settings, own) if domain is ACCOUNTS else None
        self.command_batches = CommandBatches(engine, settings, own, domain)
        engine.watch_trailing_holes()

    def topic_specs(self) -> list[TopicSpec]:
        n, own = self.settings.topic_partitions, self.own_topics
        return [
            *(
                TopicSpec(name, n)
                for name in (own.commands, own.events, own.rejections, own.dead_letters, own.retry, own.command_batches)
            ),
            # Its internal topics and changelogs too, so they exist before the first assignment
            # (Faust would create them at start-up, racing the group's first metadata read).
            *self.engine.internal_topic_specs(),
        ]
