"""Create the fleet's topics from a JSON list: what the Helm chart's topic Job runs.

    python -m tools.helm_topics [--spec JSON]

The list comes from ``--spec`` or from STATEFLEET_TOPIC_SPECS (the chart renders
it from values.yaml): ``[{"name": "prod.program-tallies", "partitions": 8,
"configs": {"cleanup.policy": "compact"}}, ...]``; names already carry the
prefix. The Kafka connection (bootstrap servers, SASL, TLS files) and the
replication factor come from the usual STATEFLEET_ settings. Missing topics are
created with their configs; existing ones are left as they are, with a warning
when their partition count differs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import sys
from typing import Any

from shared.engine.clients import TopicSpec, ensure_topics_async
from shared.settings import Settings

log = logging.getLogger("statefleet.topics")
TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


class SpecError(ValueError):
    """The topic list is malformed; the message says which entry and why."""


def parse_specs(text: str) -> list[TopicSpec]:
    try:
        raw: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"topic list is not JSON: {exc}") from exc
    if not isinstance(raw, list) or not raw:
        raise SpecError("topic list must be a non-empty JSON array")
    specs: list[TopicSpec] = []
    seen: set[str] = set()
    for n, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise SpecError(f"entry {n} is not an object")
        name = entry.get("name")
        if not isinstance(name, str) or not TOPIC_NAME.match(name):
            raise SpecError(f"entry {n}: name {name!r} is not a valid topic name")
        if name in seen:
            raise SpecError(f"entry {n}: topic {name} is listed twice")
        seen.add(name)
        partitions = entry.get("partitions")
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise SpecError(f"topic {name}: partitions must be a positive integer, got {partitions!r}")
        configs = entry.get("configs") or {}
        if not isinstance(configs, dict):
            raise SpecError(f"topic {name}: configs must be an object")
        config = {str(k): _config_value(v) for k, v in configs.items()}
        specs.append(TopicSpec(name, partitions, compacted=config.get("cleanup.policy") == "compact", config=config))
    return specs


def _config_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", help="JSON topic list (default: $STATEFLEET_TOPIC_SPECS)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the brokers")
    args = parser.parse_args(argv)
    settings = Settings()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    text = args.spec if args.spec is not None else os.environ.get("STATEFLEET_TOPIC_SPECS", "")
    try:
        specs = parse_specs(text)
    except SpecError as exc:
        log.error("%s", exc)
        return 2
    log.info(
        "ensuring %d topics on %s (replication factor %s)",
        len(specs),
        settings.kafka_bootstrap_servers,
        settings.topic_replication_factor or "of the brokers' default.replication.factor",
    )
    try:
        asyncio.run(asyncio.wait_for(ensure_topics_async(settings, specs), args.timeout))
    except TimeoutError:
        log.error(
            "could not create the topics: no broker of %s answered within %.0fs", settings.kafka_bootstrap_servers, args.timeout
        )
        return 1
    except Exception as exc:  # the Job's log is where an operator looks: one line, then a non-zero exit
        log.error("could not create the topics: %s: %s", type(exc).__name__, exc)
        return 1
    log.info("all %d topics exist", len(specs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
