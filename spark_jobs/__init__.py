"""Spark jobs over the fleet's topics: the activation join, tally backfills, the event
archive and dead-letter replays. Each job is a module with ``main(argv)``::

    python -m spark_jobs.activation_join --available-now
    python -m spark_jobs.backfill_tallies --verify-against http://127.0.0.1:8002
    python -m spark_jobs.archive_events --available-now
    python -m spark_jobs.replay_dead_letters --error-class TimeoutError --dry-run

Kafka and topic settings come from ``shared.settings.Settings`` (``STATEFLEET_*``);
Spark settings from :class:`spark_jobs.config.SparkSettings` (``STATEFLEET_SPARK_*``).
"""
