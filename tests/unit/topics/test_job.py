"""The chart's topic Job (services/topics/job.py) for a release that names a domain or a
projection: the topics it creates are theirs, as the services themselves name them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from examples.orders.domain import ORDERS
from examples.orders.projection import PROJECTION as ORDER_TALLIES
from services.tallies.app import TalliesService
from services.topics.job import SpecError, for_release, main, parse_default_configs, parse_specs
from services.validator.app import ValidatorService
from shared.engine import TopicSpec
from shared.settings import Settings
from tests.support.accounts import ACCOUNT_TOPICS
from tests.support.orders import ORDER_TOPICS

#: What the chart renders for the accounts domain (topics.create, prefix "shop."), trimmed to
#: one fleet topic and the accounts ones.
CHART = [
    {"name": f"shop.{name}", "partitions": 8, "configs": {"min.insync.replicas": "2"}}
    for name in (
        *ACCOUNT_TOPICS,
        "dead-letters",
        "retry-tallies",
        "retry-validator",
        "statefleet-tallies-memberships-changelog",
        "statefleet-tallies-last-logins-changelog",
        "statefleet-tallies-published-tallies-changelog",
    )
]
ORDERS_SPEC = "examples.orders.domain:ORDERS"
ORDER_TALLIES_SPEC = "examples.orders.projection:PROJECTION"
DEFAULTS = {"min.insync.replicas": "2"}


def chart_specs(**configs: dict[str, str]) -> list[TopicSpec]:
    """The chart's list, with ``configs`` of topics of their own (by name without the prefix)."""
    extra = [{"name": f"shop.{name}", "partitions": 8, "configs": c} for name, c in configs.items()]
    return parse_specs(json.dumps(CHART + extra))


def names(specs: list[TopicSpec]) -> list[str]:
    return [s.name.removeprefix("shop.") for s in specs]


def test_a_release_of_the_accounts_domain_gets_the_list_as_it_is() -> None:
    specs = chart_specs()
    assert for_release(specs, Settings(topic_prefix="shop."), DEFAULTS) is specs


def test_a_named_domain_and_projection_get_their_topics_instead_of_the_accounts_ones(tmp_path: Path) -> None:
    settings = Settings(
        topic_prefix="shop.", topic_partitions=12, validator_domain=ORDERS_SPEC, tallies_projection=ORDER_TALLIES_SPEC
    )
    specs = for_release(chart_specs(), settings, DEFAULTS)
    assert names(specs) == ["dead-letters", "retry-validator", *ORDER_TOPICS]
    added = {s.name: s for s in specs if s.partitions == 12}
    assert len(added) == 9 and all(s.config["min.insync.replicas"] == "2" for s in added.values())
    # As the services name and compact them: every topic of theirs the Job creates is one
    # they create themselves at start, compacted alike.
    own = Settings(topic_prefix="shop.", data_dir=tmp_path)
    theirs = {
        s.name: s.compacted
        for s in [*ValidatorService(own, ORDERS).topic_specs(), *TalliesService(own, ORDER_TALLIES).topic_specs()]
    }
    for spec in specs:
        assert spec.name in theirs, spec.name
        assert (spec.config.get("cleanup.policy") == "compact") is theirs[spec.name], spec.name


def test_only_what_neither_uses_is_left_out() -> None:
    domain_only = for_release(chart_specs(), Settings(topic_prefix="shop.", validator_domain=ORDERS_SPEC), DEFAULTS)
    assert "account-commands" not in names(domain_only)
    # The accounts tallies still read account-events and logins.
    assert {"account-events", "logins", "program-tallies", "retry-tallies"} <= set(names(domain_only))
    assert {"order-commands", "order-events"} <= set(names(domain_only))

    projection_only = for_release(chart_specs(), Settings(topic_prefix="shop.", tallies_projection=ORDER_TALLIES_SPEC), DEFAULTS)
    assert {"account-commands", "account-events", "account-rejections"} <= set(names(projection_only))
    assert not {"logins", "program-tallies", "retry-tallies"} & set(names(projection_only))
    assert "order-tallies" in names(projection_only)


def test_a_topic_of_theirs_the_chart_lists_keeps_its_configs() -> None:
    settings = Settings(topic_prefix="shop.", validator_domain=ORDERS_SPEC, tallies_projection=ORDER_TALLIES_SPEC)
    specs = for_release(chart_specs(**{"order-events": {"retention.ms": "-1"}}), settings, DEFAULTS)
    (events,) = [s for s in specs if s.name == "shop.order-events"]
    assert events.config == {"retention.ms": "-1"}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"STATEFLEET_VALIDATOR_DOMAIN": "team.nope:DOMAIN"},
            "domain module 'team.nope' cannot be imported: ModuleNotFoundError",
        ),
        ({"STATEFLEET_VALIDATOR_DOMAIN": "examples.orders.domain:TOPICS"}, "not a shared.domain.Domain"),
        ({"STATEFLEET_TALLIES_PROJECTION": "team.nope:PROJECTION"}, "cannot import projection module 'team.nope'"),
        ({"STATEFLEET_TOPIC_DEFAULT_CONFIGS": "[1]"}, "default topic configs must be a JSON object"),
    ],
)
def test_a_module_that_cannot_be_loaded_fails_the_job_with_the_loaders_message(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    env: dict[str, str],
    message: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["--spec", json.dumps(CHART), "--print"]) == 2
    assert message in caplog.text
    assert capsys.readouterr().out == ""


def test_print_shows_the_list_and_creates_nothing(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("STATEFLEET_TOPIC_PREFIX", "shop.")
    monkeypatch.setenv("STATEFLEET_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")  # nothing listens: it must not connect
    monkeypatch.setenv("STATEFLEET_VALIDATOR_DOMAIN", ORDERS_SPEC)
    assert main(["--spec", json.dumps(CHART), "--print"]) == 0
    printed = parse_specs(capsys.readouterr().out)
    assert "shop.order-commands" in [s.name for s in printed] and "shop.account-commands" not in [s.name for s in printed]


def test_default_configs_are_a_json_object() -> None:
    assert parse_default_configs("") == {}
    assert parse_default_configs('{"min.insync.replicas": 2, "unclean.leader.election.enable": false}') == {
        "min.insync.replicas": "2",
        "unclean.leader.election.enable": "false",
    }
    with pytest.raises(SpecError, match="not JSON"):
        parse_default_configs("{")
