"""The tallies service: its topology on the engine, for the projection
it runs (:mod:`shared.projection`; by default the accounts tallies of
:mod:`services.tallies.domain`, in whose words this is written: a program is the
projection's category, an account its entity, a login's ts its mark).

Two hops, because inputs are keyed by account and tallies by program:

1. ``route_inputs`` reads the projection's input topics (``account-events``, ``logins``) and
   the service's retry topic, validates each record with the projection's reader (events as
   every reader of ``account-events`` does, through :func:`shared.accounts.parse_event`; bad
   ones become dead letters, with the original
   topic, partition and offset, and are never counted), and forwards them to the internal ``…-by-program`` topic,
   packed: one record per program partition per batch (:class:`PackedInputs`).
2. ``apply_inputs`` reads that topic. Per program partition it holds the memberships
   table (the state), the last-logins table and the published-tallies table (the tally
   last published per program), updates the derived counts and publishes the tallies.

The engine hands each handler one input partition's records exactly once, in order, and
commits what the handler staged: sends acknowledged first, then the rows with the
input's next offset (changelog, then RocksDB). ``apply_inputs`` moves the in-memory
counts once its rows are in the local tables. Its input resumes from the smallest of the
three tables' next-offset copies, so a crash that left one table's rows in its changelog
and not another's re-applies the difference, which the version check (memberships), the
maximum (last logins) and the comparison with the published tally make harmless. So
after a SIGKILL, with the local state kept or restored from the changelogs alone, every
input record is applied exactly once in effect: none is skipped, none counts twice.

Tallies go to ``program-tallies`` from the by-program handler itself, in a batch, so that
they commit with the batch's rows (under exactly_once, in its Kafka transaction).
Applied changes mark their programs dirty, per partition. Every
``tally_publish_interval_s`` a timer sends a publish tick (:data:`PUBLISH_TICK`) onto each
owned by-program partition that has dirty programs (at most one outstanding per
partition). A batch holding a tick applies its other records as usual, then stages, for
each dirty program of its partition and each program it changed, the tally as it is after
the batch, but only when it differs from the program's row of ``published-tallies`` (the
tally last published), which it rewrites in the same batch. So a changed tally is
published once, at most once per tick per program: a batch cut short publishes nothing
that a committed reader sees (exactly_once) and is redone whole. After every rebalance, counts are rebuilt from the restored
memberships and every owned program is marked dirty, so nothing a crash interrupted stays
unpublished; the comparison with ``published-tallies`` keeps what was published already
from going out again. (Under at_least_once the engine sends a batch's records before its
rows are written: a crash in between publishes those tallies again.)
"""

from __future__ import annotations

from services.tallies import DEFAULT_PORT
from services.tallies.domain import PROJECTION
from services.tallies.handlers.by_program import ByProgram
from services.tallies.handlers.inputs import Inputs
from services.tallies.state import ProgramCounts, cached, service_name
from shared.engine import Engine, TopicSpec, app_id
from shared.projection import Projection, load_projection
from shared.settings import Settings
from shared.topics import topic_names

#: The service's tables, each with its changelog ``<app id>-<table>-changelog`` (compacted):
#: the chart's topic Job creates them for any projection (services/topics/job.py).
MEMBERSHIPS, LAST_LOGINS, PUBLISHED_TALLIES = TABLES = ("memberships", "last-logins", "published-tallies")


def configured_projection(settings: Settings) -> Projection:
    """The projection ``STATEFLEET_TALLIES_PROJECTION`` names, else the accounts tallies."""
    return load_projection(settings.tallies_projection) if settings.tallies_projection else PROJECTION


class TalliesService:
    """The tallies' topology: three tables and two hops (:mod:`services.tallies.handlers`)."""

    def __init__(self, settings: Settings, projection: Projection | None = None) -> None:
        self.settings = settings
        self.projection = projection = projection if projection is not None else configured_projection(settings)
        self.name = name = service_name(projection)
        self.topics = topics = topic_names(settings)
        self.input_topics = [topics.name(i.topic) for i in projection.inputs]
        self.output_topic = topics.name(projection.output_topic)
        self.engine = engine = Engine(name, settings, DEFAULT_PORT)
        self.partitions = settings.topic_partitions
        self.by_program_topic_name = f"{app_id(name, settings)}-by-program"
        self.retry_topic_name = topics.service_retry(name)

        self.memberships_store = engine.table(MEMBERSHIPS)
        self.logins_store = engine.table(LAST_LOGINS)
        #: Per program, the tally last staged for ``program-tallies`` (its JSON).
        # Added after deployments ran the by-program handler; a row lost with a cut-short batch
        # only republishes that tally (see ByProgram.rebuild_counts).
        self.published_store = engine.table(PUBLISHED_TALLIES, added_later=True)
        # Every read of a status's contribution goes through the counts' cache of it.
        self.counts = ProgramCounts(contribution=cached(projection.contribution))
        self.inputs = Inputs(
            engine,
            topics,
            projection,
            input_topics=self.input_topics,
            retry_topic=self.retry_topic_name,
            by_program_topic=self.by_program_topic_name,
            memberships=self.memberships_store,
            counts=self.counts,
            partitions=self.partitions,
        )
        self.by_program = ByProgram(
            engine,
            settings,
            projection,
            by_program_topic=self.by_program_topic_name,
            output_topic=self.output_topic,
            memberships=self.memberships_store,
            logins=self.logins_store,
            published=self.published_store,
            counts=self.counts,
        )
        engine.watch_trailing_holes()

    def topic_specs(self) -> list[TopicSpec]:
        n = self.settings.topic_partitions
        return [
            *(TopicSpec(topic, n) for topic in self.input_topics),
            TopicSpec(self.retry_topic_name, n),
            TopicSpec(self.topics.dead_letters, n),
            TopicSpec(self.output_topic, n, compacted=True),
            *self.engine.internal_topic_specs(),
        ]
