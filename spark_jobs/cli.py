"""Command-line pieces every job shares: Spark options, durations, times, logging."""

from __future__ import annotations

import argparse
import logging
import re
import sys
from datetime import UTC, datetime

#: spark-submit style options and the Spark settings they set.
SPARK_OPTIONS = {
    "driver_memory": "spark.driver.memory",
    "executor_memory": "spark.executor.memory",
    "executor_cores": "spark.executor.cores",
    "num_executors": "spark.executor.instances",
    "deploy_mode": "spark.submit.deployMode",
    "queue": "spark.yarn.queue",
}

_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


class UsageError(ValueError):
    """A command-line value that cannot be used; the message says what is expected."""


def parse_duration_ms(text: str) -> int:
    """``"3d"``, ``"72h"``, ``"90m"``, ``"30s"``, ``"500ms"`` to milliseconds."""
    match = _DURATION.match(text)
    if match is None:
        raise UsageError(f"cannot read duration {text!r}: use a number and a unit, e.g. 3d, 12h, 30m, 10s, 500ms")
    return int(match.group(1)) * _UNIT_MS[match.group(2)]


def duration_arg(text: str) -> int:
    try:
        return parse_duration_ms(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def parse_time_ms(text: str) -> int:
    """Epoch milliseconds, or an ISO-8601 date/time (UTC unless it names a zone)."""
    stripped = text.strip()
    if stripped.lstrip("-").isdigit():
        return int(stripped)
    try:
        parsed = datetime.fromisoformat(stripped.replace("Z", "+00:00"))
    except ValueError as exc:
        raise UsageError(
            f"cannot read time {text!r}: use epoch milliseconds or ISO-8601, e.g. 2024-05-01 or 2024-05-01T12:00:00Z"
        ) from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


def time_arg(text: str) -> int:
    try:
        return parse_time_ms(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--conf takes KEY=VALUE, got {text!r}")
    return key.strip(), value


def add_spark_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Spark (as with spark-submit)")
    group.add_argument("--master", help="Spark master URL (default STATEFLEET_SPARK_MASTER, local[2])")
    group.add_argument(
        "--conf", type=conf_pair, action="append", default=[], metavar="KEY=VALUE", help="any Spark setting; repeatable"
    )
    group.add_argument("--driver-memory", help="e.g. 2g")
    group.add_argument("--executor-memory", help="e.g. 4g")
    group.add_argument("--executor-cores", help="cores per executor")
    group.add_argument("--num-executors", help="executors to request (YARN, Kubernetes)")
    group.add_argument("--deploy-mode", choices=["client"], help="only client mode: the job's driver is this process")
    group.add_argument("--queue", help="YARN queue")


def spark_conf(args: argparse.Namespace) -> dict[str, str]:
    conf = {setting: str(getattr(args, name)) for name, setting in SPARK_OPTIONS.items() if getattr(args, name, None) is not None}
    conf.update(dict(args.conf or []))
    return conf


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)-7s [spark-jobs] %(name)s: %(message)s"
    )
    for noisy in ("py4j", "aiokafka", "kafka", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def fail(message: str) -> int:
    """Print a one-paragraph error for the user and return the exit status."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    return 2
