"""The validator service: its topology, composed of one sub-topology per concern.

Every handler gets one input partition's records exactly once, in order (the engine's
:class:`~shared.engine.InputBatch`); the engine sends what it staged, waits for the
acknowledgements, and only then writes its rows with the input's next offset, changelog
first.

- :mod:`~services.validator.handlers.commands`: ``validate`` (``account-commands``) and
  ``redeliver`` (``retry-validator``), over the ``accounts`` table;
- :mod:`~services.validator.handlers.outcomes`: ``record_outcomes`` (internal
  ``…-outcomes``), over ``outcomes``;
- :mod:`~services.validator.handlers.program_listings`: ``route_events``
  (``account-events``) and ``project`` (internal ``…-by-program``), over
  ``program-accounts``;
- :mod:`~services.validator.handlers.command_batches`: ``split_command_batches``
  (``account-command-batches``) and ``record_batch_outcomes`` (internal
  ``…-batch-outcomes``), over ``batches``.

Each module's docstring says what its handlers do and why their order of writes is safe.
"""

from __future__ import annotations

from services.validator import DEFAULT_PORT, SERVICE
from services.validator.handlers.command_batches import CommandBatches
from services.validator.handlers.commands import Commands
from services.validator.handlers.outcomes import Outcomes
from services.validator.handlers.program_listings import ProgramListings
from services.validator.handlers.topics import ValidatorTopics
from shared.engine import Engine, TopicSpec
from shared.settings import Settings
from shared.topics import topic_names


class ValidatorService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topics = topic_names(settings)
        self.own_topics = own = ValidatorTopics.of(settings)
        self.engine = engine = Engine(SERVICE, settings, DEFAULT_PORT)
        self.commands = Commands(engine, settings, own)
        self.outcomes = Outcomes(engine, settings, own)
        self.program_listings = ProgramListings(engine, settings, own)
        self.command_batches = CommandBatches(engine, settings, own)
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
