# Spark jobs (spark_jobs/). Each job takes the usual spark-submit options (--master,
# --conf, --driver-memory, ...) through ARGS, e.g. `make backfill ARGS="--master spark://host:7077"`.
# Kafka and topics come from STATEFLEET_* variables; Spark from STATEFLEET_SPARK_*.

SPARK_JOIN_ARGS ?= --available-now

.PHONY: spark-join
spark-join: broker ## The join, by default the activation join (account-events x logins -> activations; ARGS= for another domain's, docs/spark.md); default --available-now, override with ARGS=
	$(PY) -m spark_jobs.activation_join $(if $(ARGS),$(ARGS),$(SPARK_JOIN_ARGS))

.PHONY: backfill
backfill: broker ## Rebuild a tallies projection (default: every program's tallies) from the full history into Parquet (ARGS="--projection pkg.module:attr --verify-against URL")
	$(PY) -m spark_jobs.backfill_tallies $(ARGS)

.PHONY: archive
archive: broker ## Archive a topic (default account-events) to Parquet by event date (ARGS="--topic T --available-now")
	$(PY) -m spark_jobs.archive_events $(ARGS)

.PHONY: replay-dead-letters
replay-dead-letters: broker ## Replay parked messages (ARGS="--error-class X --since 2024-05-01 --dry-run")
	$(PY) -m spark_jobs.replay_dead_letters $(ARGS)

.PHONY: test-spark
test-spark: broker ## Spark job tests (unit, on the real broker, and on the secure broker over SASL_SSL)
	$(VENV)/bin/pytest -q -m spark tests/unit/spark_jobs tests/integration/spark_jobs tests/integration/security

test-extra:: test-spark
