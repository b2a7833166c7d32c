"""State comes back from the changelog: after the local data dir is deleted, a restarted
scheduler holds exactly the entries not yet redelivered (deletes reached the changelog)."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from shared import dead_letters as dl
from tests.integration.retry_scheduler.helpers import letter_headers, own_topics, start_scheduler, wait_for_a_tick_everywhere
from tests.support.kafka import produce, read_all
from tests.support.services import wait_for
from tools import web

pytestmark = pytest.mark.integration


def test_restore_after_deleting_the_data_dir_brings_back_only_what_was_not_redelivered(
    kafka_bootstrap: str, prefix: str, tmp_path: Path
) -> None:
    topics = own_topics(kafka_bootstrap, tmp_path, "restore", prefix)
    dead, retry, data, env = topics.dead_letters, topics.retry, topics.data, topics.env
    proc = start_scheduler(env, tmp_path)
    try:
        fast = [f"fast-{i}-{uuid.uuid4().hex[:6]}" for i in range(30)]
        slow = [f"slow-{i}-{uuid.uuid4().hex[:6]}" for i in range(30)]
        for dlq_id in fast:
            produce(dead, [(dlq_id.encode(), b"f")], headers=letter_headers(dlq_id, retry, origin="orders"))
        for dlq_id in slow:
            produce(dead, [(dlq_id.encode(), b"s")], headers=letter_headers(dlq_id, retry, origin="slow"))

        def redelivered() -> set[str]:
            return {dict(r.headers)[dl.ID].decode() for r in read_all(retry)}

        wait_for(lambda: redelivered() == set(fast), timeout=30, message="the fast ones redelivered")
        wait_for(lambda: proc_scheduled(proc.url) == len(slow), timeout=10, message="slow ones scheduled")
        proc.stop()
        shutil.rmtree(data)

        # The whole changelog (rows and their deletes) through the bulk reader.
        bulk = {"STATEFLEET_BULK_RESTORE": "true", "STATEFLEET_BULK_RESTORE_MIN_LAG": "1"}
        proc = start_scheduler({**env, **bulk}, tmp_path, port=proc.port)
        assert sorted(item["id"] for item in list_all(proc.url)) == sorted(slow)
        wait_for_a_tick_everywhere(proc.url)  # nothing redelivered a second time
        records = read_all(retry)
        assert len(records) == len(fast)
        assert {dict(r.headers)[dl.ID].decode() for r in records} == set(fast)
    finally:
        proc.kill()


def proc_scheduled(url: str) -> int:
    return int(web.get(url + "/retries/stats", timeout=10).json()["scheduled"])


def list_all(url: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        params = {"limit": 7, **({"cursor": cursor} if cursor else {})}
        page = web.get(url + "/retries", params=params, timeout=10).json()
        items.extend(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            return items
