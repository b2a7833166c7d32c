"""The workers' log configuration: aiokafka's retried coordinator lookups are not errors."""

from __future__ import annotations

import logging
import logging.config
from collections.abc import Iterator

import pytest
from aiokafka import errors

from shared.log_config import logging_config


@pytest.fixture
def coordinator_log(caplog: pytest.LogCaptureFixture) -> Iterator[logging.Logger]:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    logger = logging.getLogger("aiokafka.consumer.group_coordinator")
    logging.config.dictConfig(logging_config("svc", "a", "INFO"))
    root.handlers = [caplog.handler]  # the config's stderr handler would outlive pytest's stream
    try:
        yield logger
    finally:
        root.handlers, level = saved
        root.setLevel(level)
        logger.filters.clear()
        logging.getLogger("aiokafka.cluster").filters.clear()
        logging.getLogger("httpx").filters.clear()


def test_a_retriable_coordinator_lookup_failure_is_a_warning(
    coordinator_log: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    coordinator_log.error("Group Coordinator Request failed: %s", errors.CoordinatorNotAvailableError())
    [record] = [r for r in caplog.records if r.name == coordinator_log.name]
    assert record.levelname == "WARNING"
    assert "retrying" in record.getMessage()


def test_other_coordinator_errors_stay_errors(coordinator_log: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    coordinator_log.error("Group Coordinator Request failed: %s", errors.GroupAuthorizationFailedError())
    coordinator_log.error("Heartbeat session expired - marking coordinator dead")
    levels = [r.levelname for r in caplog.records if r.name == coordinator_log.name]
    assert levels == ["ERROR", "ERROR"]


def test_a_topic_missing_from_one_metadata_response_is_a_warning(
    coordinator_log: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    cluster_log = logging.getLogger("aiokafka.cluster")
    cluster_log.error("Topic %s not found in cluster metadata", "p.account-events")
    [record] = [r for r in caplog.records if r.name == cluster_log.name]
    assert record.levelname == "WARNING"
    assert "p.account-events" in record.getMessage()


def test_peer_probes_are_not_logged_other_requests_are(coordinator_log: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    httpx_log = logging.getLogger("httpx")
    line = 'HTTP Request: %s %s "%s %d %s"'
    httpx_log.info(line, "GET", "http://10.0.0.2:8002/healthz", "HTTP/1.1", 200, "OK")
    httpx_log.info(line, "GET", "http://10.0.0.2:8002/tallies/p-1", "HTTP/1.1", 200, "OK")
    assert [r.getMessage() for r in caplog.records if r.name == "httpx"] == [
        'HTTP Request: GET http://10.0.0.2:8002/tallies/p-1 "HTTP/1.1 200 OK"'
    ]
