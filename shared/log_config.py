"""Readable logs: one line per record, with the service and instance in each line."""

from __future__ import annotations

import logging

FORMAT = "%(asctime)s %(levelname)-7s [%(service)s/%(instance)s] %(name)s: %(message)s"


class _ContextFilter(logging.Filter):
    def __init__(self, service: str, instance: str) -> None:
        super().__init__()
        self.service = service
        self.instance = instance

    def filter(self, record: logging.LogRecord) -> bool:
        record.service = self.service
        record.instance = self.instance
        return True


class _RetriedCoordinatorLookup(logging.Filter):
    """aiokafka logs every failed group-coordinator lookup as an error, then retries it. On a
    broker that has just started (its offsets topic being created) every worker's first
    lookup fails that way and the next one succeeds: an error line that means nothing. A
    lookup failing with a retriable error is logged as a warning that says it is retried;
    the others stay errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR and record.msg == "Group Coordinator Request failed: %s":
            error = record.args[0] if isinstance(record.args, tuple) and record.args else None
            if getattr(error, "retriable", False):
                record.levelno, record.levelname = logging.WARNING, "WARNING"
                record.msg = "group coordinator not found yet (%s); retrying"
        return True


class _TopicNotInMetadataYet(logging.Filter):
    """aiokafka logs an error for every topic missing from a metadata response. A worker that
    has just created its topics sees that for each of them in its first response, and the next
    refresh has them: a warning, which says so."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR and record.msg == "Topic %s not found in cluster metadata":
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg = "topic %s not in the cluster metadata yet (just created, or deleted); it is looked up again"
        return True


class _PeerProbes(logging.Filter):
    """httpx logs every request at INFO; the peer watch probes each peer's /healthz several times
    a second (shared/engine/_membership.py), which would bury everything else. Its failures
    show in what the watch itself logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (
            record.msg == 'HTTP Request: %s %s "%s %d %s"'
            and isinstance(args, tuple)
            and len(args) > 1
            and str(args[1]).endswith("/healthz")
        )


def logging_config(service: str, instance: str, level: str) -> dict[str, object]:
    """A dictConfig for Faust's worker (``loghandlers`` are not enough for its own loggers)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {
            "ctx": {"()": _ContextFilter, "service": service, "instance": instance},
            "coordinator_lookup": {"()": _RetriedCoordinatorLookup},
            "topic_not_in_metadata": {"()": _TopicNotInMetadataYet},
            "peer_probes": {"()": _PeerProbes},
        },
        "formatters": {"line": {"format": FORMAT}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "line", "filters": ["ctx"]}},
        "root": {"level": level.upper(), "handlers": ["stderr"]},
        "loggers": {
            "aiokafka": {"level": "WARNING"},
            "aiokafka.consumer.group_coordinator": {"filters": ["coordinator_lookup"]},
            "aiokafka.cluster": {"filters": ["topic_not_in_metadata"]},
            "uvicorn.access": {"level": "WARNING"},
            "httpx": {"filters": ["peer_probes"]},
        },
    }
