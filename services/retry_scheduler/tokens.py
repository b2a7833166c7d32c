"""Named bearer tokens of the retry scheduler's API, each scoped to origin topics and to what it may do.

A shared scheduler serves many teams: each gets a token of its own, which covers the origin
topics of its services (names or globs, with or without the topic prefix, as the policy's
rules match them) and some of:

- ``read``: read the messages' payloads (key, value, headers) where
  ``STATEFLEET_PAYLOADS_REQUIRE_TOKEN`` puts them behind a token;
- ``act``: replay, cancel, unpark, delete, act on a group of parked messages or on a blocked
  key of an ordered topic;
- ``admin``: both.

Tokens are configured in a YAML (or JSON) file, ``STATEFLEET_TOKENS_FILE``::

    tokens:
      - name: orders-team
        secret_env: STATEFLEET_TOKEN_ORDERS      # or secret: <the secret itself>
        topics: ["orders-*"]
        scopes: [read, act]

The admin token (``STATEFLEET_ADMIN_TOKEN``) is always the token named ``admin``, with every
scope on every topic. A token's name is what the history of a message records as its actor.
Secrets are compared in constant time (as SHA-256 digests, so their lengths do not show) and
never logged or kept in the clear here.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from services.retry_scheduler.domain import topic_matches
from shared.yaml_files import load_yaml_file

Scope = Literal["read", "act", "admin"]
READ: Scope = "read"
ACT: Scope = "act"
ADMIN: Scope = "admin"
SCOPES: tuple[Scope, ...] = (READ, ACT, ADMIN)
#: The name of the token STATEFLEET_ADMIN_TOKEN holds.
ADMIN_NAME = "admin"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_ENTRY_KEYS = frozenset({"name", "secret", "secret_env", "topics", "scopes"})


class TokenError(ValueError):
    """The tokens file is not valid; the message names the entry and what is wrong."""


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", errors="surrogatepass")).digest()


@dataclass(frozen=True, slots=True)
class Token:
    """One named token: the origin topics it covers and what it may do there."""

    name: str
    topics: tuple[str, ...]
    scopes: frozenset[str]
    digest: bytes

    def covers(self, topic: str, prefix: str = "") -> bool:
        """Whether ``topic`` (an origin topic as the letters name it) is one of this token's."""
        return any(topic_matches(p, topic, prefix) for p in self.topics)

    def has(self, scope: Scope) -> bool:
        return scope in self.scopes or ADMIN in self.scopes

    def may(self, scope: Scope, topic: str, prefix: str = "") -> bool:
        """Whether this token may ``scope`` (read or act) on messages of origin topic ``topic``."""
        return self.has(scope) and self.covers(topic, prefix)

    def describe(self) -> dict[str, Any]:
        """What an answer may say of the token: never its secret."""
        return {"name": self.name, "topics": list(self.topics), "scopes": sorted(self.scopes)}


@dataclass(frozen=True, slots=True)
class TokenBook:
    """Every token in force; the admin token first."""

    tokens: tuple[Token, ...]

    def find(self, presented: str) -> Token | None:
        """The token whose secret is ``presented``, or None. Every secret is compared, each in
        constant time, whichever matches: the time taken does not say which one did, or how
        much of one matched."""
        digest = _digest(presented)
        found: Token | None = None
        for token in self.tokens:
            if hmac.compare_digest(digest, token.digest) and found is None:
                found = token
        return found


def admin_token(secret: str) -> Token:
    return Token(ADMIN_NAME, ("*",), frozenset({ADMIN}), _digest(secret))


def build_token_book(admin_secret: str, path: str = "", environ: Mapping[str, str] | None = None) -> TokenBook:
    """The admin token, and the tokens of the file at ``path`` (none when empty).

    Raises :class:`TokenError` naming the file and the entry when the file is not valid."""
    tokens = [admin_token(admin_secret)]
    if path:
        tokens += read_tokens_file(path, os.environ if environ is None else environ)
    seen: dict[bytes, str] = {}
    for token in tokens:
        other = seen.get(token.digest)
        if other is not None:
            raise TokenError(
                f"tokens file {path}: token {token.name!r} has the same secret as {other!r}: each token needs a secret "
                "of its own (its name is the actor recorded in a message's history)"
            )
        seen[token.digest] = token.name
    return TokenBook(tuple(tokens))


def read_tokens_file(path: str, environ: Mapping[str, str]) -> list[Token]:
    source = f"tokens file {path}"
    # yaml's message quotes the lines around the error, which may hold a secret: only where it is.
    raw = load_yaml_file(path, source, TokenError, quote_errors=False)
    return parse_tokens(raw, source, environ)


def parse_tokens(raw: Any, source: str, environ: Mapping[str, str]) -> list[Token]:
    """The tokens of a parsed tokens document (``{"tokens": [entry, ...]}``)."""
    if not isinstance(raw, dict) or set(raw) != {"tokens"}:
        raise TokenError(f"{source}: must be a mapping with one key, tokens (a list of tokens)")
    entries = raw["tokens"]
    if not isinstance(entries, list):
        raise TokenError(f"{source}: tokens must be a list")
    tokens: list[Token] = []
    names: set[str] = {ADMIN_NAME}
    for i, entry in enumerate(entries):
        token = _parse_entry(entry, source, i, environ)
        if token.name in names:
            why = "is the admin token's (STATEFLEET_ADMIN_TOKEN)" if token.name == ADMIN_NAME else "is taken by an earlier token"
            raise TokenError(f"{source}: token {token.name!r} (tokens[{i}]): the name {why}")
        names.add(token.name)
        tokens.append(token)
    return tokens


def _parse_entry(entry: Any, source: str, i: int, environ: Mapping[str, str]) -> Token:
    where = f"{source}: tokens[{i}]"
    if not isinstance(entry, dict):
        raise TokenError(f"{where}: must be a mapping with name, secret or secret_env, topics and scopes")
    name = entry.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise TokenError(
            f"{where}: name must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit; got {name!r}"
        )
    where = f"{source}: token {name!r} (tokens[{i}])"
    unknown = sorted(set(map(str, entry)) - _ENTRY_KEYS)
    if unknown:
        raise TokenError(f"{where}: unknown field(s) {', '.join(unknown)}; a token has {', '.join(sorted(_ENTRY_KEYS))}")
    secret = _secret_of(entry, where, environ)
    topics = _strings(entry.get("topics"), where, "topics", 'origin topic names or globs, e.g. ["orders-*"]')
    scopes = _strings(entry.get("scopes"), where, "scopes", f"some of {', '.join(SCOPES)}")
    bad = [s for s in scopes if s not in SCOPES]
    if bad:
        raise TokenError(f"{where}: unknown scope(s) {', '.join(map(repr, bad))}; scopes are {', '.join(SCOPES)}")
    return Token(name, tuple(topics), frozenset(scopes), _digest(secret))


def _secret_of(entry: dict[str, Any], where: str, environ: Mapping[str, str]) -> str:
    if ("secret" in entry) == ("secret_env" in entry):
        raise TokenError(f"{where}: needs exactly one of secret (the secret itself) and secret_env (a variable holding it)")
    if "secret" in entry:
        secret = entry["secret"]
        if not isinstance(secret, str) or not secret.strip():
            raise TokenError(f"{where}: secret must be a non-empty string")
        return secret.strip()
    var = entry["secret_env"]
    if not isinstance(var, str) or not var:
        raise TokenError(f"{where}: secret_env must name an environment variable")
    value = environ.get(var, "")
    if not value.strip():
        raise TokenError(f"{where}: secret_env names {var}, which is {'empty' if var in environ else 'not set'}")
    return value.strip()


def _strings(value: Any, where: str, field: str, what: str) -> list[str]:
    items: Iterable[Any] = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    out = [v for v in items if isinstance(v, str) and v]
    if not out or len(out) != len(list(items)):
        raise TokenError(f"{where}: {field} must be a non-empty list of {what}; got {value!r}")
    return out
