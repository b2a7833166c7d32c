"""Policy rules: origin topic and error class together, first match wins, from YAML or the environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from services.retry_scheduler.domain import (
    Policy,
    PolicyBook,
    PolicyError,
    build_policy_book,
    class_matches,
    parse_overrides,
    parse_policy_document,
    parse_rules,
)
from services.retry_scheduler.handlers.routing import read_policy_file

KAFKA_TIMEOUT = "org.apache.kafka.common.errors.TimeoutException"


@pytest.mark.parametrize(
    ("pattern", "error_class", "matches"),
    [
        (KAFKA_TIMEOUT, KAFKA_TIMEOUT, True),
        ("TimeoutException", KAFKA_TIMEOUT, True),  # simple name
        ("TimeoutException", "TimeoutException", True),
        ("TimeoutException", "java.net.SocketTimeoutException", False),
        ("java.net.*", "java.net.SocketTimeoutException", True),
        ("java.net.*", "java.io.IOException", False),
        ("*TimeoutException", "java.net.SocketTimeoutException", True),
        ("*Timeout*", "asyncio.exceptions.TimeoutError", True),
        ("org.apache.kafka.*.TimeoutException", KAFKA_TIMEOUT, True),
        ("common.errors.TimeoutException", KAFKA_TIMEOUT, False),  # a qualified name is matched whole
        ("Inner", "com.acme.Outer$Inner", True),  # a Java nested class's simple name
        ("timeoutexception", KAFKA_TIMEOUT, False),  # case counts
    ],
)
def test_error_classes_match_by_qualified_name_simple_name_or_glob(pattern: str, error_class: str, matches: bool) -> None:
    assert class_matches(pattern, error_class) is matches


def book(rules: str = "", overrides: str = "", topic_prefix: str = "t1.") -> PolicyBook:
    sections = parse_policy_document(yaml.safe_load(rules), "policy.yaml") if rules else None
    return build_policy_book(
        max_attempts=5,
        base_delay_ms=1000,
        max_delay_ms=60_000,
        jitter="equal",
        overrides=overrides,
        topic_prefix=topic_prefix,
        file_sections=sections,
    )


RULES = """
rules:
  - name: payments-timeouts
    origin_topic: payments
    error_class: [TimeoutException, "java.net.*"]
    max_attempts: 10
    base_delay_ms: 200
  - name: payments
    origin_topic: "payments*"
    max_attempts: 3
    redeliver_to: origin
  - name: network-anywhere
    error_class: "java.net.*"
    jitter: full
"""


def test_the_first_rule_matching_topic_and_class_together_wins() -> None:
    b = book(RULES)
    assert b.policy_for("payments", KAFKA_TIMEOUT) == Policy(10, 200, 60_000, "equal")
    assert b.policy_for("t1.payments", "java.net.ConnectException") == Policy(10, 200, 60_000, "equal")
    # same topic, another class: the second rule (a glob on the topic)
    assert b.policy_for("payments", "IllegalStateException") == Policy(3, 1000, 60_000, "equal", "origin")
    assert b.policy_for("payments-eu", KAFKA_TIMEOUT) == Policy(3, 1000, 60_000, "equal", "origin")
    # another topic: only the third rule's class matches, and only its fields apply
    assert b.policy_for("orders", "java.net.SocketTimeoutException") == Policy(5, 1000, 60_000, "full")
    assert b.policy_for("orders", KAFKA_TIMEOUT) == Policy(5, 1000, 60_000, "equal")
    assert b.rule_for("orders", KAFKA_TIMEOUT) is None
    rule = b.rule_for("payments", KAFKA_TIMEOUT)
    assert rule is not None and rule.name == "payments-timeouts"


def test_a_topic_rule_keeps_the_built_in_never_retried_classes_and_a_class_rule_changes_them() -> None:
    b = book(RULES)
    # "payments" sets max_attempts 3 for every class, but a malformed message is still not retried
    assert b.policy_for("payments", "pydantic_core._pydantic_core.ValidationError").max_attempts == 1
    assert b.policy_for("payments", "ValidationError").redeliver_to == "origin"
    named = book("rules: [{origin_topic: payments, error_class: DecodeError, max_attempts: 4}]")
    assert named.policy_for("payments", "DecodeError").max_attempts == 4
    assert named.policy_for("orders", "DecodeError").max_attempts == 1


def test_rules_and_overrides_combine_and_the_environment_s_rules_come_first() -> None:
    b = book(
        RULES,
        overrides='{"origin_topic": {"orders": {"max_attempts": 7}},'
        ' "rules": [{"name": "incident", "origin_topic": "payments", "max_attempts": 20}]}',
    )
    assert b.policy_for("payments", KAFKA_TIMEOUT).max_attempts == 20
    assert b.policy_for("orders", "java.net.ConnectException") == Policy(7, 1000, 60_000, "full")
    assert [r["name"] for r in b.to_json()["rules"]] == ["incident", "payments-timeouts", "payments", "network-anywhere"]


def test_the_existing_json_format_reads_as_before() -> None:
    by_topic, by_class = parse_overrides('{"origin_topic": {"a": {"max_attempts": 2}}, "error_class": {"E": {"jitter": "none"}}}')
    assert by_topic == {"a": {"max_attempts": 2}} and by_class == {"E": {"jitter": "none"}}
    b = book(overrides='{"error_class": {"TimeoutException": {"max_attempts": 9}}}')
    assert b.policy_for("x", "TimeoutException").max_attempts == 9
    assert b.policy_for("x", KAFKA_TIMEOUT).max_attempts == 9  # by simple name too


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ("[{name: a, origin_topic: x, max_attempts: 0}]", r"rule 1 \(a\): max_attempts: must be an integer >= 1, got 0"),
        ("[{origin_topic: x}, {name: b, error_class: E, jitter: half}]", r"rule 2 \(b\): jitter: must be one of"),
        ("[{name: c, origin_topic: x, max_attempt: 3}]", r"rule 1 \(c\): unknown fields \['max_attempt'\]"),
        ("[{name: d, origin_topic: 'no spaces'}]", r"rule 1 \(d\): origin_topic: 'no spaces' is not a topic name or glob"),
        ("[{name: e, origin_topic: []}]", r"rule 1 \(e\): origin_topic: expected a name or pattern"),
        ("[{name: f, error_class: ''}]", r"rule 1 \(f\): error_class: expected a non-empty name"),
        ("[{name: g, error_class: 'a b'}]", r"rule 1 \(g\): error_class: 'a b' is not a class name"),
        ("[{name: h, max_attempts: 2}, {name: i, origin_topic: x}]", r"rule 2 \(i\) is never used: rule 1 \(h\) before it"),
        ("[{name: j, origin_topic: x}, {name: j, origin_topic: y}]", r"rule 2 \(j\): name 'j' is already the name of rule 1"),
        ("[{name: '', origin_topic: x}]", r"rule 1: name: expected a non-empty string"),
        ("[3]", r"rule 1: expected a mapping"),
        ("{a: 1}", r"rules: expected a list of rules"),
        ("[{name: k, origin_topic: x, base_delay_ms: '10'}]", r"rule 1 \(k\): base_delay_ms: must be an integer >= 0"),
    ],
)
def test_a_bad_rule_is_refused_naming_the_rule_and_what_is_wrong(rules: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_rules(yaml.safe_load(rules), "policy.yaml")


def test_an_environment_catch_all_rule_would_hide_the_file_s_rules() -> None:
    with pytest.raises(
        PolicyError, match=r"rule 1 \(all\) matches every origin topic .* never used \(rule 1 \(payments-timeouts\)"
    ):
        book(RULES, overrides='{"rules": [{"name": "all", "max_attempts": 2}]}')


def test_a_rule_name_is_unique_across_the_file_and_the_environment() -> None:
    with pytest.raises(PolicyError, match=r"rule 2 \(payments\): name 'payments' is already the name of rule 1 \(payments\)"):
        book(RULES, overrides='{"rules": [{"name": "payments", "origin_topic": "x", "max_attempts": 2}]}')


def test_read_policy_file(tmp_path: Path) -> None:
    assert read_policy_file("") is None
    good = tmp_path / "policy.yaml"
    good.write_text(RULES)
    sections = read_policy_file(str(good))
    assert sections is not None and [r.name for r in sections.rules] == ["payments-timeouts", "payments", "network-anywhere"]
    empty = tmp_path / "empty.yaml"
    empty.write_text("# no rules yet\n")
    assert read_policy_file(str(empty)) == parse_policy_document(None, "x")
    with pytest.raises(PolicyError, match=r"policy file .*missing.yaml: cannot be read: No such file"):
        read_policy_file(str(tmp_path / "missing.yaml"))
    broken = tmp_path / "broken.yaml"
    broken.write_text("rules: [\n")
    with pytest.raises(PolicyError, match="is not valid YAML"):
        read_policy_file(str(broken))
    other = tmp_path / "other.yaml"
    other.write_text("rule: []\n")
    with pytest.raises(PolicyError, match=r"unknown sections \['rule'\]; use origin_topic, error_class, rules"):
        read_policy_file(str(other))


def test_a_bad_policy_stops_the_worker_with_a_message_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text(
        "rules:\n  - name: ok\n    origin_topic: a\n  - name: net\n    error_class: 'java.net.*'\n    max_attempts: 0\n"
    )
    env = {"STATEFLEET_RETRY_POLICY_FILE": str(bad), "STATEFLEET_DATA_DIR": str(tmp_path / "data"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "services.retry_scheduler"],
        env=env,
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().endswith(
        f"error: retry_scheduler cannot start: the retry policy is not valid: retry policy file {bad}: "
        "rule 2 (net): max_attempts: must be an integer >= 1, got 0"
    )
