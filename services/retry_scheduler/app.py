"""The retry scheduler service: its topology, composed of one sub-topology per concern.

Two hops, so that everything about one ``dlq.id`` lives in one partition:

1. :mod:`~services.retry_scheduler.handlers.routing`: ``route`` reads ``dead-letters``,
   decides each message's fate and forwards it to the internal ``…-inbox`` topic,
   partitioned by ``dlq.id`` (a batch's letters for one partition packed in one record). It
   keeps no state.
2. :mod:`~services.retry_scheduler.handlers.inbox`: ``process_inbox`` is the only handler
   that changes state (the ``schedule``, ``index``, ``expiry`` and ``parked`` tables of
   :mod:`~services.retry_scheduler.handlers.inbox_state`). Dead letters, ticks and the
   HTTP API's commands all travel through the inbox, because a table can only be changed
   from the handler that owns the partition: one partition's work is serialised.

Around them: :mod:`~services.retry_scheduler.handlers.ticks` (the timer, and redelivering
what is due), :mod:`~services.retry_scheduler.handlers.parking` (replaying and cancelling
parked messages), :mod:`~services.retry_scheduler.handlers.commands` (the HTTP API's
commands, sent through the inbox and answered once committed) and
:mod:`~services.retry_scheduler.handlers.stats` (what the API reads, and the counts
loaded from each partition's ``!counts`` row after a recovery). For the origin topics in
``STATEFLEET_RETRY_ORDERED_TOPICS``, :mod:`~services.retry_scheduler.handlers.ordered`
keeps per-key order (letters placed by lane, held records, release on the consumers'
acknowledgements, which :mod:`~services.retry_scheduler.handlers.acks` forwards to the inbox).
"""

from __future__ import annotations

from services.retry_scheduler import DEFAULT_PORT, SERVICE
from services.retry_scheduler.handlers.acks import Acks
from services.retry_scheduler.handlers.commands import HttpCommands
from services.retry_scheduler.handlers.inbox import Inbox
from services.retry_scheduler.handlers.inbox_state import InboxState
from services.retry_scheduler.handlers.ordered import OrderedLanes
from services.retry_scheduler.handlers.parking import ParkedRetention, Parking
from services.retry_scheduler.handlers.routing import Routing
from services.retry_scheduler.handlers.stats import Stats
from services.retry_scheduler.handlers.ticks import Ticks
from services.retry_scheduler.metrics import ORIGIN_TOPICS
from services.retry_scheduler.tokens import TokenBook, build_token_book
from shared.engine import Engine, TopicSpec, app_id
from shared.settings import Settings
from shared.topics import TopicNames, topic_names


class RetrySchedulerService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topics: TopicNames = topic_names(settings)
        self.engine = engine = Engine(SERVICE, settings, DEFAULT_PORT)
        self.inbox_topic_name = inbox_topic = f"{app_id(SERVICE, settings)}-inbox"

        ORIGIN_TOPICS.configure(settings.retry_metrics_origin_topics)
        #: The API's tokens (raises TokenError, naming the entry, for a bad tokens file).
        self.tokens: TokenBook = build_token_book(settings.admin_token, settings.tokens_file)
        self.state = state = InboxState(engine, settings, self.topics)
        self.routing = routing = Routing(engine, settings, self.topics, inbox_topic)
        state.decide_fate = routing.decide_fate  # a re-failure's next attempt is decided like any letter
        self.ticks = ticks = Ticks(engine, settings, state, inbox_topic)
        self.parking = parking = Parking(state, inbox_topic)
        self.ordered = ordered = OrderedLanes(settings, self.topics, state, parking)
        self.commands = commands = HttpCommands(engine, state, parking, ordered, inbox_topic)
        self.retention = retention = ParkedRetention(
            settings, state, parking, lambda batch, entry: ordered.lane_headed_by(batch, entry) is not None
        )
        if retention.enabled:
            ticks.sweep_parked = retention.sweep
        self.inbox = Inbox(engine, state, routing, ticks, commands, ordered, inbox_topic, settings.topic_partitions)
        # Acknowledgements are read only where ordered retries are on: unordered, nothing changes.
        self.acks = Acks(engine, settings, self.topics, inbox_topic) if routing.ordered_topics else None
        self.stats = Stats(engine, state, ticks)
        engine.watch_trailing_holes()

    def topic_specs(self) -> list[TopicSpec]:
        n = self.settings.topic_partitions
        ordered = (
            [TopicSpec(self.topics.retry_acks, n), TopicSpec(self.topics.retry_blocked_keys, n, compacted=True)]
            if self.acks is not None
            else []
        )
        return [
            TopicSpec(self.topics.dead_letters, n),
            TopicSpec(self.topics.retry, n),
            TopicSpec(self.topics.parking_lot, n),
            *ordered,
            # Its changelogs and Faust's leader topic: Faust creates no topic itself.
            *self.engine.internal_topic_specs(),
        ]
