"""What the "first B within W after A, per key" join reads, and how one record is read.

A :class:`JoinSpec` names two sides: the *first* (records of kind A) and the *then* side
(records of kind B). Each side is a topic (its name without the topic prefix), the field
that holds the key, the field that holds the event time (epoch ms), and the kind: the value
of ``kind_field`` a record must have to count (None: every record of the topic). A field is
a name or a dotted path into the record's JSON object (``data.customer_id``).

The job writes, per record of kind A, one record keyed by its key: the key (as
``key_name``), the ``carry`` fields of the A record, A's time (``first_at_name``), the time
of the first B record with the same key and ``A's time <= B's time <= A's time + W``
(``then_at_name``, null when none) and whether there was one (``matched_name``).

:data:`ACCOUNTS` is the activation join: an AccountCreated on ``account-events`` then the
first login on ``logins`` by that account, written as the contract's Activation record.

A record is read by :func:`read_record`; this module is pure (no Spark), so it runs on
Spark's Python workers and in unit tests alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from shared import codecs
from shared.accounts import ACCOUNT_CREATED, parse_event
from shared.projection import InvalidInput, require_int, require_key
from shared.topics import ACCOUNT_EVENTS, LOGINS

#: Topics with a contract of their own: each of their records is first read as every reader of
#: the topic reads it (a record the services dead-letter is refused here too).
CONTRACT_READERS: Mapping[str, Callable[[Mapping[str, Any]], object]] = {ACCOUNT_EVENTS: parse_event}


@dataclass(frozen=True)
class Side:
    """One input of the join: a topic (without the prefix), its key and time fields, its kind."""

    topic: str
    key: str
    time: str
    kind: str | None = None


@dataclass(frozen=True)
class JoinSpec:
    first: Side
    then: Side
    #: The field holding a record's kind (on both sides).
    kind_field: str = "type"
    #: Fields of the A record copied into the output, each under its last path segment.
    carry: tuple[str, ...] = ()
    key_name: str = "key"
    first_at_name: str = "first_at"
    then_at_name: str = "then_at"
    matched_name: str = "matched"
    #: The default output topic (None: the job needs ``--output-topic``).
    default_output: str | None = None
    #: Names the default checkpoint, ``<prefix><name>``.
    name: str = "join"

    def __post_init__(self) -> None:
        names = self.output_names
        if len(set(names)) != len(names):
            raise ValueError(f"the output fields must have different names, got {', '.join(names)}")
        for path in (self.first.key, self.first.time, self.then.key, self.then.time, self.kind_field, *self.carry):
            if not path or any(not part for part in path.split(".")):
                raise ValueError(f"{path!r} is not a field name or a dotted path")

    @property
    def carry_names(self) -> tuple[str, ...]:
        return tuple(path.rsplit(".", 1)[-1] for path in self.carry)

    @property
    def output_names(self) -> tuple[str, ...]:
        """The output record's fields, in order."""
        return (self.key_name, *self.carry_names, self.first_at_name, self.then_at_name, self.matched_name)


#: The activation join: AccountCreated, then the first login of that account.
ACCOUNTS = JoinSpec(
    first=Side(ACCOUNT_EVENTS, "account_id", "occurred_at", ACCOUNT_CREATED),
    then=Side(LOGINS, "account_id", "ts"),
    carry=("program_id",),
    key_name="account_id",
    first_at_name="created_at",
    then_at_name="first_login_at",
    matched_name="activated",
    default_output="activations",
    name="activation-join",
)


def field_value(obj: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted ``path`` of ``obj`` (None when any step is missing)."""
    value: Any = obj
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def carried(value: Any) -> str | None:
    """A carried field as the output writes it: a string as it is, anything else as JSON."""
    if value is None or isinstance(value, str):
        return value
    return codecs.dumps(value).decode()


def read_record(
    side: Side, value: bytes | None, kind_field: str = "type", carry: tuple[str, ...] = ()
) -> tuple[str, tuple[str | None, ...], int] | None:
    """One record of ``side``: (key, carried values, time), or None when it is not of the side's
    kind. Raises ``codecs.DecodeError`` or ``InvalidInput`` for a record that cannot be read:
    not a JSON object, refused by its topic's contract (:data:`CONTRACT_READERS`), a key that
    is not a non-empty string of at most 256 characters without NUL, a time that is not an
    integer."""
    obj = codecs.loads_object(value)
    check = CONTRACT_READERS.get(side.topic)
    if check is not None:
        try:
            check(obj)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from exc
    if side.kind is not None and field_value(obj, kind_field) != side.kind:
        return None
    named = {side.key: field_value(obj, side.key), side.time: field_value(obj, side.time)}
    key = require_key(named, side.key)
    at = require_int(named, side.time)
    return key, tuple(carried(field_value(obj, path)) for path in carry), at
