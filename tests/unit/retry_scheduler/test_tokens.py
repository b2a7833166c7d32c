"""Named tokens of the retry scheduler's API: what each covers, and the tokens file, read or refused naming the entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.retry_scheduler.runtime import build
from services.retry_scheduler.tokens import ADMIN_NAME, TokenBook, TokenError, build_token_book, parse_tokens
from shared.settings import Settings

ADMIN = "the-admin-secret"
FILE = """
tokens:
  - name: orders-team
    secret_env: TOKEN_ORDERS
    topics: ["orders-*", "returns"]
    scopes: [read, act]
  - name: auditor
    secret: auditor-secret
    topics: ["*"]
    scopes: [read]
  - name: billing-ops
    secret: billing-secret
    topics: billing
    scopes: [admin]
"""


def book(tmp_path: Path, text: str = FILE, env: dict[str, str] | None = None) -> TokenBook:
    path = tmp_path / "tokens.yaml"
    path.write_text(text)
    return build_token_book(ADMIN, str(path), {"TOKEN_ORDERS": "orders-secret"} if env is None else env)


def test_each_secret_finds_its_token_and_nothing_else_does(tmp_path: Path) -> None:
    tokens = book(tmp_path)
    assert [t.name for t in tokens.tokens] == [ADMIN_NAME, "orders-team", "auditor", "billing-ops"]
    assert [getattr(tokens.find(s), "name", None) for s in (ADMIN, "orders-secret")] == [ADMIN_NAME, "orders-team"]
    assert tokens.find(" orders-secret") is None  # the API strips the header's token, not this
    for wrong in ("", "orders-secre", "orders-secrett", "auditor", "TOKEN_ORDERS"):
        assert tokens.find(wrong) is None, wrong


def test_scopes_cover_their_topics_by_name_or_glob_with_or_without_the_prefix(tmp_path: Path) -> None:
    tokens = {t.name: t for t in book(tmp_path).tokens}
    orders, auditor, billing, admin = tokens["orders-team"], tokens["auditor"], tokens["billing-ops"], tokens[ADMIN_NAME]
    assert orders.may("act", "orders-x") and orders.may("read", "orders-x") and orders.may("act", "returns")
    assert not orders.may("act", "billing") and not orders.may("act", "orders") and not orders.may("act", "returns-eu")
    assert orders.may("act", "p.orders-x", prefix="p.") and not orders.may("act", "q.orders-x", prefix="p.")
    assert auditor.may("read", "billing") and not auditor.may("act", "billing")  # read-only
    assert billing.may("act", "billing") and billing.may("read", "billing") and not billing.may("read", "orders-x")
    assert admin.may("act", "anything") and admin.may("read", "p.anything", prefix="p.")
    assert "secret" not in repr(orders.describe()) and orders.describe() == {
        "name": "orders-team",
        "topics": ["orders-*", "returns"],
        "scopes": ["act", "read"],
    }


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ("tokens: {}", {}, "tokens must be a list"),
        ("- name: a", {}, "must be a mapping with one key, tokens"),
        ("tokens: [{name: 'a b', secret: s, topics: [x], scopes: [read]}]", {}, "tokens[0]: name must be"),
        ("tokens: [{name: t1, topics: [x], scopes: [read]}]", {}, "token 't1' (tokens[0]): needs exactly one of secret"),
        ("tokens: [{name: t1, secret: s, secret_env: V, topics: [x], scopes: [read]}]", {}, "needs exactly one of secret"),
        ("tokens: [{name: t1, secret_env: V, topics: [x], scopes: [read]}]", {}, "secret_env names V, which is not set"),
        ("tokens: [{name: t1, secret_env: V, topics: [x], scopes: [read]}]", {"V": " "}, "secret_env names V, which is empty"),
        ("tokens: [{name: t1, secret: s, scopes: [read]}]", {}, "token 't1' (tokens[0]): topics must be a non-empty list"),
        ("tokens: [{name: t1, secret: s, topics: [x], scopes: []}]", {}, "scopes must be a non-empty list"),
        ("tokens: [{name: t1, secret: s, topics: [x], scopes: [write]}]", {}, "unknown scope(s) 'write'; scopes are read, act"),
        ("tokens: [{name: t1, secret: s, topics: [x], scopes: [read], team: a}]", {}, "unknown field(s) team"),
        ("tokens: [{name: admin, secret: s, topics: [x], scopes: [read]}]", {}, "the name is the admin token's"),
        (
            "tokens: [{name: t1, secret: s, topics: [x], scopes: [read]}, {name: t1, secret: z, topics: [x], scopes: [act]}]",
            {},
            "token 't1' (tokens[1]): the name is taken by an earlier token",
        ),
        (
            "tokens: [{name: t1, secret: s, topics: [x], scopes: [read]}, {name: t2, secret: s, topics: [y], scopes: [act]}]",
            {},
            "token 't2' has the same secret as 't1'",
        ),
        (
            f"tokens: [{{name: t1, secret: {ADMIN}, topics: [x], scopes: [read]}}]",
            {},
            "token 't1' has the same secret as 'admin'",
        ),
    ],
)
def test_a_bad_tokens_file_is_refused_naming_the_entry(tmp_path: Path, text: str, env: dict[str, str], message: str) -> None:
    with pytest.raises(TokenError) as refused:
        book(tmp_path, text, env)
    assert message in str(refused.value)
    assert "tokens file " in str(refused.value)
    assert ADMIN not in str(refused.value) and "'s'" not in str(refused.value)  # no secret in the message


def test_a_file_that_is_not_yaml_is_refused_without_quoting_it(tmp_path: Path) -> None:
    with pytest.raises(TokenError) as refused:
        book(tmp_path, "tokens:\n  - name: t1\n    secret: 'leaked-secret\n  bad: [", {})
    assert str(refused.value).endswith("is not valid YAML") and "leaked" not in str(refused.value)
    with pytest.raises(TokenError, match="cannot be read"):
        build_token_book(ADMIN, str(tmp_path / "missing.yaml"), {})


def test_without_a_file_the_admin_token_is_the_only_one() -> None:
    tokens = build_token_book(ADMIN)
    assert [t.describe() for t in tokens.tokens] == [{"name": "admin", "topics": ["*"], "scopes": ["admin"]}]
    assert parse_tokens({"tokens": []}, "x", {}) == []


def test_the_worker_refuses_to_start_with_a_bad_tokens_file_naming_the_entry(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text("tokens:\n  - name: orders-team\n    secret: s3cret\n    topics: [orders-*]\n    scopes: [read, write]\n")
    with pytest.raises(SystemExit) as exited:
        build(Settings(tokens_file=str(path), data_dir=tmp_path / "data"))
    message = str(exited.value)
    assert message.startswith("error: retry_scheduler cannot start: the tokens are not valid: ")
    assert f"tokens file {path}: token 'orders-team' (tokens[0]): unknown scope(s) 'write'" in message
    assert "s3cret" not in message
