"""Create the fleet's topics from a JSON list: what the Helm chart's topic Job runs.

    python -m services.topics [--spec JSON] [--print]

The list comes from ``--spec`` or from STATEFLEET_TOPIC_SPECS (the chart renders
it from values.yaml): ``[{"name": "prod.program-tallies", "partitions": 8,
"configs": {"cleanup.policy": "compact"}}, ...]``; names already carry the
prefix. The Kafka connection (bootstrap servers, SASL, TLS files) and the
replication factor come from the usual STATEFLEET_ settings. Missing topics are
created with their configs; existing ones are left as they are, with a warning
when their partition count differs.

The chart's list holds the bundled accounts domain's topics. A release that names a
domain (STATEFLEET_VALIDATOR_DOMAIN) or a projection (STATEFLEET_TALLIES_PROJECTION)
gets theirs instead, read from the modules themselves through the services' own loaders
(:func:`for_release`): the accounts topics neither uses are left out, and the domain's
and projection's topics the list does not name are added with the configs of
STATEFLEET_TOPIC_DEFAULT_CONFIGS (a JSON object; compacted where the service compacts).
A module that cannot be loaded fails the Job with the loader's message, before any
service starts. ``--print`` prints the resulting list as JSON and creates nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
from typing import Any

from shared.domain import Domain, DomainError
from shared.engine.clients import TopicSpec, ensure_topics_async
from shared.projection import Projection, ProjectionError
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


def parse_default_configs(text: str) -> dict[str, str]:
    """The configs of every created topic (the chart's topics.create.defaultConfigs), from JSON."""
    if not text:
        return {}
    try:
        raw: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"default topic configs are not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise SpecError("default topic configs must be a JSON object")
    return {str(k): _config_value(v) for k, v in raw.items()}


def domain_topics(settings: Settings, domain: Domain[Any], projection: Projection) -> dict[str, bool]:
    """The topics a release of ``domain`` on the validator and ``projection`` on the tallies
    needs created beside the fleet's own (dead letters, retries), each with whether it is
    compacted: the domain's command, command batch, event and rejection topics; the
    projection's inputs, its output, the tallies' retry topic and table changelogs (named
    after the projection, as the service names them)."""
    from services.tallies.app import TABLES
    from services.tallies.state import service_name
    from services.validator.handlers.topics import ValidatorTopics
    from shared.engine import app_id
    from shared.topics import topic_names

    own, topics, service = ValidatorTopics.of(settings, domain), topic_names(settings), service_name(projection)
    wanted = dict.fromkeys((own.commands, own.command_batches, own.events, own.rejections), False)
    wanted.update(dict.fromkeys((topics.name(i.topic) for i in projection.inputs), False))
    wanted[topics.name(projection.output_topic)] = True
    wanted[topics.service_retry(service)] = False
    wanted.update(dict.fromkeys((f"{app_id(service, settings)}-{table}-changelog" for table in TABLES), True))
    return wanted


def for_release(specs: list[TopicSpec], settings: Settings, default_configs: dict[str, str]) -> list[TopicSpec]:
    """``specs`` (the chart's list, made for the accounts domain) for the domain and projection
    ``settings`` name: unchanged when they name neither; else without the accounts topics
    neither uses, and with the named ones' topics the list lacks. Raises
    :class:`~shared.domain.DomainError` or :class:`~shared.projection.ProjectionError` (naming
    the module and what is wrong) when one cannot be loaded."""
    if not settings.validator_domain and not settings.tallies_projection:
        return specs
    from services.tallies.app import configured_projection
    from services.tallies.domain import PROJECTION as ACCOUNT_TALLIES
    from services.validator.app import configured_domain
    from services.validator.domain import ACCOUNTS

    wanted = domain_topics(settings, configured_domain(settings), configured_projection(settings))
    unused = domain_topics(settings, ACCOUNTS, ACCOUNT_TALLIES).keys() - wanted.keys()
    kept = [spec for spec in specs if spec.name not in unused]
    listed = {spec.name for spec in kept}
    n = settings.topic_partitions
    added = [
        TopicSpec(
            name, n, compacted=compacted, config={**default_configs, **({"cleanup.policy": "compact"} if compacted else {})}
        )
        for name, compacted in wanted.items()
        if name not in listed
    ]
    if unused & {spec.name for spec in specs} or added:
        log.info(
            "topics of domain %s and projection %s: leaving out %s; adding %s",
            settings.validator_domain or "accounts",
            settings.tallies_projection or "accounts",
            ", ".join(sorted(unused & {spec.name for spec in specs})) or "none",
            ", ".join(spec.name for spec in added) or "none",
        )
    return kept + added


def spec_json(specs: list[TopicSpec]) -> str:
    """``specs`` as the JSON list STATEFLEET_TOPIC_SPECS takes."""
    return json.dumps([{"name": s.name, "partitions": s.partitions, "configs": s.config} for s in specs], indent=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", help="JSON topic list (default: $STATEFLEET_TOPIC_SPECS)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the brokers")
    parser.add_argument("--print", action="store_true", help="print the topic list as JSON and create nothing")
    args = parser.parse_args(argv)
    settings = Settings()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    text = args.spec if args.spec is not None else os.environ.get("STATEFLEET_TOPIC_SPECS", "")
    try:
        specs = parse_specs(text)
        default_configs = parse_default_configs(os.environ.get("STATEFLEET_TOPIC_DEFAULT_CONFIGS", ""))
        specs = for_release(specs, settings, default_configs)
    except (SpecError, DomainError, ProjectionError) as exc:
        log.error("%s", exc)
        return 2
    if args.print:
        print(spec_json(specs))
        return 0
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
