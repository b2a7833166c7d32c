"""The retry scheduler on a data dir kept from topics since deleted and created again: it
discards that state and lists the dead letters of the topics there are now, never one of the
old ones (docs/contract.md, "Local state"; the tallies' cases are in tests/e2e/tallies/test_state_identity.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.retry_scheduler.test_two_instances import list_all
from tests.e2e.tallies.test_state_identity import DISCARDED, discarded, log_of, recreate
from tests.integration.retry_scheduler.helpers import letter_headers, scheduler_env, start_scheduler
from tests.support.kafka import BOOTSTRAP, create_topics, produce
from tests.support.services import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_a_scheduler_lists_the_letters_of_the_recreated_topics_only(kafka_bootstrap: str, prefix: str, tmp_path: Path) -> None:
    dead, retry = f"{prefix}dead-letters", f"{prefix}retry-later"
    names = [dead, retry, f"{prefix}parking-lot"]
    # Long backoffs: every letter stays scheduled while the test looks.
    env = scheduler_env(
        kafka_bootstrap, prefix, tmp_path / "data", retry_base_delay_ms=600000, retry_max_delay_ms=600000, bulk_restore_min_lag=1
    )
    create_topics(names)

    def scheduled_and_stopped(instance: str, ids: list[str]) -> None:
        """Instance ``instance`` schedules a dead letter of each of ``ids``, and stops."""
        proc = start_scheduler(env, tmp_path, instance=instance)
        for dlq_id in ids:
            produce(dead, [(dlq_id.encode(), b"v")], headers=letter_headers(dlq_id, retry, origin="slow"))
        wait_for(lambda: sorted(list_all(proc.url, "/retries")) == sorted(ids), timeout=60, message=f"{ids[0]}… scheduled")
        proc.stop()

    scheduled_and_stopped("a", [f"old-{i}" for i in range(30)])
    recreate(BOOTSTRAP, prefix, dict.fromkeys(names, False))
    new_ids = [f"new-{i}" for i in range(12)]
    scheduled_and_stopped("b", new_ids)

    back = start_scheduler(env, tmp_path, instance="a")
    try:
        wait_for(lambda: sorted(list_all(back.url, "/retries")) == sorted(new_ids), timeout=60, message="only the new letters")
        log = log_of(back)
        assert DISCARDED in log and "deleted and created again" in log, [
            line for line in log.splitlines() if "restore" in line or "topic ids" in line or "local state" in line
        ]
        assert discarded(back).get("topic_recreated", 0) >= 1
    finally:
        back.kill()
