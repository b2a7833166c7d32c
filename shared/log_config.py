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


def logging_config(service: str, instance: str, level: str) -> dict[str, object]:
    """A dictConfig for Faust's worker (``loghandlers`` are not enough for its own loggers)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"ctx": {"()": _ContextFilter, "service": service, "instance": instance}},
        "formatters": {"line": {"format": FORMAT}},
        "handlers": {
            "stderr": {"class": "logging.StreamHandler", "formatter": "line", "filters": ["ctx"]},
        },
        "root": {"level": level.upper(), "handlers": ["stderr"]},
        "loggers": {
            "aiokafka": {"level": "WARNING"},
            "uvicorn.access": {"level": "WARNING"},
        },
    }
