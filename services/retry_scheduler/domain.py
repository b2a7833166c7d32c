"""Retry policy, as pure functions: when a dead letter is due again, or whether it is parked.

Attempts
    ``dlq.attempt`` counts the failed processing attempts so far, from 1. A dead letter
    whose attempt has reached the policy's ``max_attempts`` is parked (published to
    ``parking-lot``); otherwise it is redelivered to its retry topic after a backoff.
    With ``max_attempts = 5`` a message is processed at most five times: the first try
    and four redeliveries. ``max_attempts = 1`` means never retried.

Backoff
    The delay before redelivering attempt ``n`` is capped exponential:
    ``cap(n) = min(max_delay_ms, base_delay_ms * 2 ** (n - 1))``, with jitter:

    - ``full``:  uniform in ``[0, cap(n))``
    - ``equal``: ``cap(n) / 2`` plus uniform in ``[0, cap(n) / 2)``
    - ``none``:  exactly ``cap(n)``

    The jitter is a pure function of ``(dlq.id, attempt)``, so a duplicated or replayed
    dead letter is due at exactly the same time as the original. The delay counts from
    ``dlq.failed.at`` (clamped to the time it is scheduled, so a clock ahead of ours
    cannot push it further out).

Redelivery topic
    A dead letter names its retry topic (``dlq.retry.topic``). One that does not (written by
    Spring Kafka, Kafka Connect, Kafka Streams, or with no headers) goes where its policy's
    ``redeliver_to`` says: ``retry`` (the default retry topic, the default) or ``origin``
    (the origin topic itself, for consumers that read nothing else).

Overrides
    Per origin topic and per error class, any of ``max_attempts``, ``base_delay_ms``,
    ``max_delay_ms``, ``jitter`` and ``redeliver_to`` can be overridden (``STATEFLEET_RETRY_POLICY_OVERRIDES``,
    JSON). Fields are applied in order: defaults, then the origin topic's override, then
    the error class's override. Error classes that mean the message itself is bad
    (:data:`NEVER_RETRIED`) are parked at once unless an override says otherwise.

Rules
    A ``rules`` list (in the YAML file ``STATEFLEET_RETRY_POLICY_FILE``, or in the JSON of
    ``STATEFLEET_RETRY_POLICY_OVERRIDES``) matches origin topic and error class together; the
    first rule that matches a message sets its fields. An origin topic is matched by name or
    glob (with or without the topic prefix); an error class by fully qualified name, by simple
    name (``TimeoutException`` matches ``org.apache.kafka.common.errors.TimeoutException``) or by
    glob (``java.net.*``). A rule that names error classes is applied after the error-class
    override (so it can change a built-in one); a rule for every error class before it (so a
    team's topic rule does not retry messages that cannot get better).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from functools import lru_cache
from typing import Any, Literal

import orjson

from shared.accounts import InvalidEvent
from shared.topics import configured_name

Jitter = Literal["full", "equal", "none"]
JITTERS: tuple[Jitter, ...] = ("full", "equal", "none")

#: Largest due time representable in a schedule key (about 2.28 million years of epoch ms).
MAX_DUE_MS = (1 << 56) - 1
#: Beyond this many doublings the cap is reached anyway; keeps ``2 ** n`` small.
_MAX_DOUBLINGS = 62

#: Error classes that say the message itself is malformed: retrying cannot help. Among them
#: an ``account-events`` record that breaks the Event shape (``InvalidEvent`` from the
#: validator, ``InvalidInput`` from the tallies): every reader refuses it alike, every time.
NEVER_RETRIED: Mapping[str, Mapping[str, Any]] = {
    "ValidationError": {"max_attempts": 1},
    "InvalidInput": {"max_attempts": 1},
    "InvalidCommand": {"max_attempts": 1},
    InvalidEvent.__name__: {"max_attempts": 1},
    "DecodeError": {"max_attempts": 1},
}

_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
_POLICY_FIELDS = ("max_attempts", "base_delay_ms", "max_delay_ms", "jitter", "redeliver_to")
RedeliverTo = Literal["retry", "origin"]
REDELIVER_TO: tuple[RedeliverTo, ...] = ("retry", "origin")


class PolicyError(ValueError):
    """The configured policy overrides or rules are not valid."""


@dataclass(frozen=True, slots=True)
class Policy:
    max_attempts: int = 5
    base_delay_ms: int = 1000
    max_delay_ms: int = 3_600_000
    jitter: Jitter = "equal"
    #: Where a dead letter without ``dlq.retry.topic`` is redelivered: the default retry topic or its origin topic.
    redeliver_to: RedeliverTo = "retry"

    def cap_ms(self, attempt: int) -> int:
        """The capped exponential delay of ``attempt`` (before jitter)."""
        doublings = min(max(attempt, 1) - 1, _MAX_DOUBLINGS)
        return min(self.max_delay_ms, self.base_delay_ms * (1 << doublings))

    def delay_bounds(self, attempt: int) -> tuple[int, int]:
        """The smallest and largest delay jitter can give ``attempt`` (inclusive)."""
        cap = self.cap_ms(attempt)
        if self.jitter == "full":
            return 0, cap
        if self.jitter == "equal":
            return cap // 2, cap
        return cap, cap

    def delay_ms(self, dlq_id: str, attempt: int) -> int:
        """The backoff before redelivering ``attempt`` of ``dlq_id``: deterministic per (id, attempt)."""
        cap = self.cap_ms(attempt)
        if self.jitter == "none":
            return cap
        fraction = jitter_fraction(dlq_id, attempt)
        if self.jitter == "full":
            return int(cap * fraction)
        half = cap // 2
        return half + int((cap - half) * fraction)

    def to_json(self) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "max_attempts": self.max_attempts,
            "base_delay_ms": self.base_delay_ms,
            "max_delay_ms": self.max_delay_ms,
            "jitter": self.jitter,
        }
        if self.redeliver_to != "retry":  # shown only where it is not the default
            fields["redeliver_to"] = self.redeliver_to
        return fields

    def retry_topic(self, origin_topic: str, default_retry_topic: str) -> str:
        """Where a dead letter that names no retry topic is redelivered."""
        return origin_topic if self.redeliver_to == "origin" else default_retry_topic


def jitter_fraction(dlq_id: str, attempt: int) -> float:
    """A number in ``[0, 1)`` that depends only on ``(dlq_id, attempt)``."""
    digest = hashlib.blake2b(f"{attempt}\x00{dlq_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / float(1 << 64)


def _validate_fields(where: str, raw: Any, sep: str = ".") -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{where}: expected an object of policy fields, got {type(raw).__name__}")
    unknown = set(raw) - set(_POLICY_FIELDS)
    if unknown:
        raise PolicyError(f"{where}: unknown fields {sorted(unknown)}; allowed: {list(_POLICY_FIELDS)}")
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if name == "jitter":
            if value not in JITTERS:
                raise PolicyError(f"{where}{sep}jitter: must be one of {list(JITTERS)}, got {value!r}")
        elif name == "redeliver_to":
            if value not in REDELIVER_TO:
                raise PolicyError(f"{where}{sep}redeliver_to: must be one of {list(REDELIVER_TO)}, got {value!r}")
        else:
            minimum = 1 if name == "max_attempts" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise PolicyError(f"{where}{sep}{name}: must be an integer >= {minimum}, got {value!r}")
        out[name] = value
    return out


# -- rules: origin topic and error class together, first match wins ----------------------------

_RULE_KEYS = ("name", "origin_topic", "error_class")
_GLOB_CHARS = frozenset("*?[")
#: An origin-topic pattern: a topic name, possibly with glob characters.
_TOPIC_PATTERN = re.compile(r"^[a-zA-Z0-9._*?!\[\]-]{1,249}$")


def simple_class_name(error_class: str) -> str:
    """The class name without its package (and, for a Java nested class, its outer class)."""
    return re.split(r"[.$]", error_class)[-1]


def class_matches(pattern: str, error_class: str) -> bool:
    """Whether ``error_class`` is the class ``pattern`` names: its fully qualified name, its simple
    name (a pattern without a package matches the class in any package), or a glob (``java.net.*``;
    a glob without a dot is matched against the simple name too)."""
    qualified = "." in pattern or "$" in pattern
    if _GLOB_CHARS.intersection(pattern):
        return fnmatchcase(error_class, pattern) or (not qualified and fnmatchcase(simple_class_name(error_class), pattern))
    return pattern == error_class or (not qualified and pattern == simple_class_name(error_class))


def topic_matches(pattern: str, topic: str, prefix: str = "") -> bool:
    """Whether ``topic`` is the origin topic ``pattern`` names (name or glob), with or without the topic prefix."""
    if fnmatchcase(topic, pattern):
        return True
    return bool(prefix) and topic.startswith(prefix) and fnmatchcase(topic[len(prefix) :], pattern)


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule: the origin topics and error classes it matches (empty: any) and the fields it sets."""

    label: str
    origin_topics: tuple[str, ...] = ()
    error_classes: tuple[str, ...] = ()
    fields: Mapping[str, Any] = field(default_factory=dict)
    name: str | None = None

    def matches(self, origin_topic: str, error_class: str, topic_prefix: str = "") -> bool:
        if self.origin_topics and not any(topic_matches(p, origin_topic, topic_prefix) for p in self.origin_topics):
            return False
        return not self.error_classes or any(class_matches(p, error_class) for p in self.error_classes)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.name is not None:
            out["name"] = self.name
        if self.origin_topics:
            out["origin_topic"] = list(self.origin_topics)
        if self.error_classes:
            out["error_class"] = list(self.error_classes)
        out.update(self.fields)
        return out


def _patterns(where: str, key: str, raw: Any, valid: re.Pattern[str] | None) -> tuple[str, ...]:
    values = [raw] if isinstance(raw, str) else raw
    if not isinstance(values, list) or not values:
        raise PolicyError(f"{where}: {key}: expected a name or pattern, or a non-empty list of them, got {raw!r}")
    for value in values:
        if not isinstance(value, str) or not value.strip() or value != value.strip():
            raise PolicyError(f"{where}: {key}: expected a non-empty name or pattern without spaces around it, got {value!r}")
        if valid is not None and not valid.match(value):
            raise PolicyError(
                f"{where}: {key}: {value!r} is not a topic name or glob (letters, digits, '.', '_', '-' and * ? [ ] !)"
            )
        if valid is None and any(c.isspace() for c in value):
            raise PolicyError(f"{where}: {key}: {value!r} is not a class name or glob (it has spaces)")
    return tuple(values)


def parse_rule(index: int, raw: Any, source: str = "rules") -> Rule:
    """One entry of a ``rules`` list (``index`` counts from 1), validated; a :class:`PolicyError` names it."""
    where = f"{source}: rule {index}"
    if isinstance(raw, Mapping) and isinstance(raw.get("name"), str) and raw["name"].strip():
        where += f" ({raw['name']})"
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{where}: expected a mapping of name, origin_topic, error_class and policy fields, got {raw!r}")
    unknown = sorted(str(k) for k in set(raw) - set(_RULE_KEYS) - set(_POLICY_FIELDS))
    if unknown:
        raise PolicyError(f"{where}: unknown fields {unknown}; allowed: {list(_RULE_KEYS + _POLICY_FIELDS)}")
    name = raw.get("name")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise PolicyError(f"{where}: name: expected a non-empty string, got {name!r}")
    topics = _patterns(where, "origin_topic", raw["origin_topic"], _TOPIC_PATTERN) if "origin_topic" in raw else ()
    classes = _patterns(where, "error_class", raw["error_class"], None) if "error_class" in raw else ()
    fields = _validate_fields(where, {k: v for k, v in raw.items() if k in _POLICY_FIELDS}, sep=": ")
    return Rule(label=where.split(": ", 1)[1], origin_topics=topics, error_classes=classes, fields=fields, name=name)


def parse_rules(raw: Any, source: str = "rules") -> tuple[Rule, ...]:
    """A ``rules`` list: each rule valid, names unique, and none unreachable behind a rule that matches everything."""
    if not isinstance(raw, Sequence) or isinstance(raw, str | bytes):
        raise PolicyError(f"{source}: rules: expected a list of rules, got {type(raw).__name__}")
    rules = tuple(parse_rule(i, entry, source) for i, entry in enumerate(raw, start=1))
    seen: dict[str, str] = {}
    catch_all: Rule | None = None
    for rule in rules:
        if catch_all is not None:
            raise PolicyError(
                f"{source}: {rule.label} is never used: {catch_all.label} before it matches every origin topic and error class"
            )
        if rule.name is not None:
            if rule.name in seen:
                raise PolicyError(f"{source}: {rule.label}: name {rule.name!r} is already the name of {seen[rule.name]}")
            seen[rule.name] = rule.label
        if not rule.origin_topics and not rule.error_classes:
            catch_all = rule
    return rules


@dataclass(frozen=True)
class PolicySections:
    """A policy document: the per-topic and per-class overrides and the rules."""

    by_origin_topic: dict[str, dict[str, Any]] = field(default_factory=dict)
    by_error_class: dict[str, dict[str, Any]] = field(default_factory=dict)
    rules: tuple[Rule, ...] = ()


def parse_policy_document(raw: Any, source: str) -> PolicySections:
    """``{"origin_topic": {topic: fields}, "error_class": {class: fields}, "rules": [rule, ...]}``, each optional,
    as read from JSON or YAML; ``source`` names where it came from in error messages."""
    if raw is None:
        return PolicySections()
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{source}: expected a mapping with origin_topic, error_class or rules, got {type(raw).__name__}")
    unknown = set(raw) - {"origin_topic", "error_class", "rules"}
    if unknown:
        raise PolicyError(f"{source}: unknown sections {sorted(map(str, unknown))}; use origin_topic, error_class, rules")
    sections: list[dict[str, dict[str, Any]]] = []
    for section in ("origin_topic", "error_class"):
        entries = raw.get(section, {})
        if not isinstance(entries, Mapping):
            raise PolicyError(f"{source}: {section}: expected an object keyed by name")
        sections.append({str(name): _validate_fields(f"{section}[{name!r}]", fields) for name, fields in entries.items()})
    rules = parse_rules(raw["rules"], source) if raw.get("rules") is not None else ()
    return PolicySections(sections[0], sections[1], rules)


#: Policies remembered per (origin topic, error class) by a :class:`PolicyBook`.
POLICIES_REMEMBERED = 4096


@dataclass(frozen=True)
class PolicyBook:
    """The default policy and its overrides; :meth:`policy_for` picks the one for a message."""

    default: Policy = field(default_factory=Policy)
    by_origin_topic: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    by_error_class: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: dict(NEVER_RETRIED))
    topic_prefix: str = ""
    #: First match wins; see the module's docstring for how a rule combines with the overrides.
    rules: tuple[Rule, ...] = ()
    _resolved: dict[tuple[str, str], Policy] = field(default_factory=dict, init=False, repr=False, compare=False)

    def policy_for(self, origin_topic: str, error_class: str) -> Policy:
        # Asked once per dead letter, and a few origins and error classes make up most of them.
        key = (origin_topic, error_class)
        policy = self._resolved.get(key)
        if policy is None:
            if len(self._resolved) >= POLICIES_REMEMBERED:
                self._resolved.clear()
            policy = self._resolved[key] = self._resolve(origin_topic, error_class)
        return policy

    def _resolve(self, origin_topic: str, error_class: str) -> Policy:
        policy = self.default
        name = configured_name(origin_topic, self.by_origin_topic, self.topic_prefix)
        topic_override = self.by_origin_topic[name] if name is not None else None
        if topic_override:
            policy = replace(policy, **topic_override)
        rule = self.rule_for(origin_topic, error_class)
        class_override = self.by_error_class.get(error_class)
        if class_override is None:  # by simple name: "TimeoutError" is also "asyncio.exceptions.TimeoutError"
            class_override = self.by_error_class.get(simple_class_name(error_class))
        if rule is not None and not rule.error_classes:  # a rule for every class: the class's override still applies
            policy = replace(policy, **rule.fields)
            rule = None
        if class_override:
            policy = replace(policy, **class_override)
        if rule is not None:  # it names this error class: it wins over the class's override
            policy = replace(policy, **rule.fields)
        return policy

    def rule_for(self, origin_topic: str, error_class: str) -> Rule | None:
        """The first rule that matches the message, or None."""
        for rule in self.rules:
            if rule.matches(origin_topic, error_class, self.topic_prefix):
                return rule
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "default": self.default.to_json(),
            "origin_topic": {k: dict(v) for k, v in sorted(self.by_origin_topic.items())},
            "error_class": {k: dict(v) for k, v in sorted(self.by_error_class.items())},
            "rules": [rule.to_json() for rule in self.rules],
        }


def parse_overrides(text: str) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Read ``{"origin_topic": {topic: fields}, "error_class": {class: fields}}``; both optional."""
    sections = parse_overrides_text(text)
    return sections.by_origin_topic, sections.by_error_class


def parse_overrides_text(text: str) -> PolicySections:
    """The JSON of ``STATEFLEET_RETRY_POLICY_OVERRIDES``: the two override sections and ``rules``, each optional."""
    if not text.strip():
        return PolicySections()
    try:
        raw = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise PolicyError(f"retry policy overrides are not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise PolicyError("retry policy overrides must be a JSON object")
    return parse_policy_document(raw, "retry policy overrides")


def build_policy_book(
    *,
    max_attempts: int,
    base_delay_ms: int,
    max_delay_ms: int,
    jitter: str,
    overrides: str,
    topic_prefix: str = "",
    file_sections: PolicySections | None = None,
) -> PolicyBook:
    """The policies from settings: configured error-class overrides are merged over the built-in ones.

    ``file_sections`` (the policy file's) and the overrides' sections are merged, the environment's
    entries winning per name; the environment's rules come first (so an operator's rule set for an
    incident wins), then the file's."""
    if jitter not in JITTERS:
        raise PolicyError(f"jitter must be one of {list(JITTERS)}, got {jitter!r}")
    env = parse_overrides_text(overrides)
    file = file_sections or PolicySections()
    by_topic = {**file.by_origin_topic, **env.by_origin_topic}
    classes: dict[str, dict[str, Any]] = {name: dict(fields) for name, fields in NEVER_RETRIED.items()}
    for name, fields in [*file.by_error_class.items(), *env.by_error_class.items()]:
        classes[name] = {**classes.get(name, {}), **fields}
    catch_all = next((rule for rule in env.rules if not rule.origin_topics and not rule.error_classes), None)
    if catch_all is not None and file.rules:
        raise PolicyError(
            f"retry policy overrides: {catch_all.label} matches every origin topic and error class, "
            f"so the policy file's rules are never used ({file.rules[0].label} first)"
        )
    env_names = {rule.name: rule.label for rule in env.rules if rule.name is not None}
    for rule in file.rules:
        if rule.name in env_names:
            raise PolicyError(
                f"policy file: {rule.label}: name {rule.name!r} is already the name of "
                f"{env_names[rule.name]} of STATEFLEET_RETRY_POLICY_OVERRIDES"
            )
    rules = env.rules + file.rules
    default = Policy(max_attempts=max_attempts, base_delay_ms=base_delay_ms, max_delay_ms=max_delay_ms, jitter=jitter)
    return PolicyBook(default=default, by_origin_topic=by_topic, by_error_class=classes, topic_prefix=topic_prefix, rules=rules)


# -- decisions ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Schedule:
    due_at: int
    policy: Policy


@dataclass(frozen=True, slots=True)
class Park:
    reason: str
    policy: Policy


def due_time(policy: Policy, dlq_id: str, attempt: int, failed_at: int, now_ms: int) -> int:
    """When ``attempt`` of ``dlq_id`` is redelivered: ``failed_at`` (at most now) plus the backoff."""
    start = min(max(failed_at, 0), now_ms)
    return min(start + policy.delay_ms(dlq_id, attempt), MAX_DUE_MS)


def decide(
    book: PolicyBook,
    *,
    dlq_id: str,
    attempt: int,
    origin_topic: str,
    error_class: str,
    failed_at: int,
    retry_topic: str,
    now_ms: int,
    forbidden_retry_topics: frozenset[str] = frozenset(),
    has_key_or_value: bool = True,
) -> Schedule | Park:
    """Schedule the next delivery of a dead letter, or park it."""
    policy = book.policy_for(origin_topic, error_class)
    problem = retry_topic_problem(retry_topic, forbidden_retry_topics)
    if problem is not None:
        return Park(problem, policy)
    if not has_key_or_value:
        return Park("a message with neither key nor value cannot be redelivered", policy)
    if attempt >= policy.max_attempts:
        if policy.max_attempts == 1:
            return Park(f"{error_class} from {origin_topic} is not retried (max_attempts 1)", policy)
        return Park(f"attempt {attempt} reached max_attempts {policy.max_attempts}", policy)
    return Schedule(due_time(policy, dlq_id, attempt, failed_at, now_ms), policy)


@lru_cache(maxsize=4096)
def retry_topic_problem(topic: str, forbidden: frozenset[str] = frozenset()) -> str | None:
    """Why a message cannot be redelivered to ``topic``, or ``None`` when it can."""
    if not _TOPIC_NAME.match(topic) or topic in (".", ".."):
        return f"retry topic {topic[:300]!r} is not a valid Kafka topic name"
    if topic in forbidden:
        return f"retry topic {topic!r} would loop back into the scheduler"
    return None


# -- headers -------------------------------------------------------------------------------------


def merge_headers(raw: list[tuple[str, bytes]], normalized_dlq: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """The headers to redeliver with: every received header in its place, known ``dlq.*``
    ones replaced by their normalized values (so defaults fill missing ones), and the
    ``dlq.*`` headers the message lacked appended."""
    wanted = dict(normalized_dlq)
    out: list[tuple[str, bytes]] = []
    placed: set[str] = set()
    for name, value in raw:
        if name in wanted:
            if name in placed:
                continue
            out.append((name, wanted[name]))
            placed.add(name)
        else:
            out.append((name, value))
    out.extend((name, value) for name, value in normalized_dlq if name not in placed)
    return out


def percentile(sorted_values: list[int], q: float) -> int | None:
    """Nearest-rank percentile (``q`` in 0..100) of an ascending list."""
    if not sorted_values:
        return None
    rank = max(1, min(len(sorted_values), -(-len(sorted_values) * q // 100)))
    return sorted_values[int(rank) - 1]
