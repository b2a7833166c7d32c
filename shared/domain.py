"""The domain API of the command validator: what a team writes, and the one implementation of
everything around it.

A domain module supplies a :class:`Domain`: its command envelope (a pydantic model, which is
also the schema of ``POST /commands`` in the validator's OpenAPI), its command types and which
of them create an aggregate, the name of the aggregate id field, its event types, its topic
names, and two pure functions:

- ``decide(state, command) -> NewEvent | Reject``: the business rule. ``state`` is the
  aggregate's current state (None before it exists, only ever for a creating command);
- ``evolve(state, event) -> state``: the state after one of its own events.

Everything else is generic and lives here or in the validator: reading a command record
(:func:`parse_command`), idempotency by ``command_id``, the existence checks
(``ALREADY_EXISTS``, ``NOT_FOUND``), ``expected_version`` (``VERSION_CONFLICT``), versions
1, 2, 3… without gaps, event ids derived from the command id, and the order the checks run in
(:func:`decide`):

1. a ``command_id`` seen before for that aggregate: the same outcome again, no new event;
2. ``INVALID_COMMAND``: the envelope (:func:`parse_command`), then the domain's
   ``check_command``;
3. for a creating type: ``ALREADY_EXISTS``, then ``VERSION_CONFLICT`` unless
   ``expected_version`` is null or 0; for the other types: ``NOT_FOUND``, the domain's
   ``guard`` (checks that come before the version check), then ``VERSION_CONFLICT``;
4. the domain's ``decide``.

A domain is loaded by :func:`load_domain` from ``pkg.module:attr`` (the validator reads
``STATEFLEET_VALIDATOR_DOMAIN``); a module that cannot be imported or lacks part of the API
stops it with a :class:`DomainError` naming the module and what is missing.
"""

from __future__ import annotations

import hashlib
import importlib
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, Any, Generic, NamedTuple, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from shared.http.bounds import MAX_JSON_DEPTH, JsonObject, NonNegativeInt64, Text

S = TypeVar("S")

#: Longest aggregate id, command id (or any other id) the fleet accepts, in characters.
MAX_ID_LENGTH = 256

NOT_FOUND = "NOT_FOUND"
ALREADY_EXISTS = "ALREADY_EXISTS"
VERSION_CONFLICT = "VERSION_CONFLICT"
INVALID_TRANSITION = "INVALID_TRANSITION"
INVALID_COMMAND = "INVALID_COMMAND"
#: The rejection reasons of every domain; a domain may add its own (``Domain.reasons``).
REASONS = (NOT_FOUND, ALREADY_EXISTS, VERSION_CONFLICT, INVALID_TRANSITION, INVALID_COMMAND)

#: Event ids are UUIDv5 in this namespace of (aggregate_id, command_id).
EVENT_ID_NAMESPACE = uuid.UUID("5b0c4a34-8f3e-4d0e-9d6c-1f6f2a7c9e51")

#: What is remembered of an answered command: its event's version, or its rejection reason.
OutcomeCode = int | str


class MalformedCommand(ValueError):
    """A record that cannot even be rejected (no readable command_id and aggregate id)."""


class DomainError(RuntimeError):
    """A domain module that cannot be loaded, or lacks part of the API."""


# -- ids -------------------------------------------------------------------------------------


def id_problem(name: str, value: Any) -> str | None:
    """Why ``value`` cannot be an id (aggregate id, command_id…), or None when it can: a
    non-empty string of at most :data:`MAX_ID_LENGTH` characters without NUL (state keys use
    NUL as a separator)."""
    if not isinstance(value, str) or not value:
        return f"'{name}' must be a non-empty string, got {value!r:.80}"
    if len(value) > MAX_ID_LENGTH:
        return f"'{name}' is longer than {MAX_ID_LENGTH} characters"
    if "\x00" in value:
        return f"'{name}' must not contain NUL"
    return None


def id_field_problem(name: str, value: Any, *, required: bool) -> str | None:
    if value is None:
        return f"'{name}' is required" if required else None
    return id_problem(name, value)


_NAMESPACE_BYTES = EVENT_ID_NAMESPACE.bytes


def event_id_for(aggregate_id: str, command_id: str) -> str:
    """The event id of the event a command produces: the same command, the same id.

    ``uuid.uuid5(EVENT_ID_NAMESPACE, aggregate_id + NUL + command_id)`` as text, computed
    without the UUID object (once per command; the object's construction and formatting cost
    more than the hash)."""
    digest = bytearray(hashlib.sha1(_NAMESPACE_BYTES + f"{aggregate_id}\x00{command_id}".encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


# -- the HTTP envelope -------------------------------------------------------------------------


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL")
    return value


#: An id in a command envelope: 1 to MAX_ID_LENGTH characters, no NUL.
Id = Annotated[Text, Field(min_length=1, max_length=MAX_ID_LENGTH), AfterValidator(_no_nul)]


class CommandEnvelope(BaseModel):
    """The fields every domain's command has, as ``POST /commands`` takes them. A domain's
    command model subclasses it and adds ``type`` (a ``Literal`` of its command types), its
    aggregate id field and any fields of its own. Types are checked strictly (no coercion of
    "3" to 3) and unknown fields are refused, so a misspelt ``expected_version`` cannot
    silently turn off the version check."""

    model_config = ConfigDict(strict=True, extra="forbid")

    command_id: Id | None = Field(
        None, description="Idempotency key; generated (UUID4) when absent. Sending the same id again yields the same outcome."
    )
    expected_version: NonNegativeInt64 | None = Field(
        None, description="When given, the command is rejected with VERSION_CONFLICT unless it equals the current version"
    )
    data: JsonObject = Field(
        default_factory=dict,
        description="The command's data. Integers must fit in 64 bits (signed), numbers be finite, "
        f"nesting at most {MAX_JSON_DEPTH} levels deep",
    )
    issued_at: NonNegativeInt64 | None = Field(None, description="Epoch ms; defaults to the time the API received the command")


# -- what the validator decides with -----------------------------------------------------------


_NO_FIELDS: Mapping[str, Any] = MappingProxyType({})


class Command(NamedTuple):
    """One command as the validator reads it. ``fields`` holds the domain's own envelope
    fields (``Domain.command_fields``, e.g. ``customer_id``), None when absent. ``invalid``
    says why it is malformed; such a command is rejected with INVALID_COMMAND. (A tuple:
    one is read per command, and a tuple is made in C.)"""

    command_id: str
    aggregate_id: str
    type: str
    expected_version: int | None = None
    data: Mapping[str, Any] = _NO_FIELDS
    issued_at: int = 0
    fields: Mapping[str, Any] = _NO_FIELDS
    invalid: str | None = None

    @property
    def storable(self) -> bool:
        """Whether the aggregate id can key a state row (else the command is answered statelessly)."""
        return len(self.aggregate_id) <= MAX_ID_LENGTH and "\x00" not in self.aggregate_id


class NewEvent(NamedTuple):
    """What ``decide`` returns to accept a command: the event's type and data, and ``fields``,
    extra top-level fields of the event record (the accounts domain's ``program_id``).
    (Tuples: one is made per command, and a tuple is made in C.)"""

    type: str
    data: Mapping[str, Any] = _NO_FIELDS
    fields: Mapping[str, Any] = _NO_FIELDS


class Reject(NamedTuple):
    """What ``decide`` (or ``guard``) returns to reject a command."""

    reason: str
    detail: str


class Event(NamedTuple):
    """An event as the validator writes it: ``NewEvent`` stamped with its id, aggregate and version."""

    event_id: str
    command_id: str
    type: str
    aggregate_id: str
    version: int
    occurred_at: int
    data: Mapping[str, Any]
    fields: Mapping[str, Any] = _NO_FIELDS


class Rejection(NamedTuple):
    command_id: str
    aggregate_id: str
    reason: str
    detail: str
    current_version: int | None


class Aggregate(NamedTuple, Generic[S]):
    """An aggregate that exists: its id, version (1, 2, 3…) and the domain's state."""

    aggregate_id: str
    version: int
    state: S


class Accepted(NamedTuple, Generic[S]):
    event: Event
    aggregate: Aggregate[S]

    @property
    def code(self) -> OutcomeCode:
        return self.event.version


class Rejected(NamedTuple):
    rejection: Rejection

    @property
    def code(self) -> OutcomeCode:
        return self.rejection.reason


class Duplicate(NamedTuple):
    """The command id was answered before: ``original`` is that answer (version or reason)."""

    command_id: str
    aggregate_id: str
    original: OutcomeCode


Outcome = Accepted[Any] | Rejected | Duplicate


@dataclass(slots=True)
class Row(Generic[S]):
    """What the validator keeps per aggregate id: the aggregate (None while it never existed)
    and the ids of the commands answered for it, oldest first, with their outcome codes."""

    aggregate: Aggregate[S] | None = None
    history: dict[str, OutcomeCode] = field(default_factory=dict)

    def remember(self, command_id: str, code: OutcomeCode, limit: int) -> None:
        self.history[command_id] = code
        while len(self.history) > limit:
            del self.history[next(iter(self.history))]


@dataclass(frozen=True)
class DomainTopics:
    """A domain's topic names, before the configured prefix."""

    commands: str
    events: str
    rejections: str
    command_batches: str


@dataclass(frozen=True)
class Domain(Generic[S]):
    """A domain the validator runs. See the module's docstring and docs/your-domain.md."""

    #: Names the domain (logs, the OpenAPI description).
    name: str
    #: The aggregate in messages: "order" gives "order 'o1' does not exist".
    noun: str
    #: The ``POST /commands`` body: a :class:`CommandEnvelope` subclass.
    command_model: type[BaseModel]
    command_types: tuple[str, ...]
    #: The command types that create an aggregate (ALREADY_EXISTS when it exists); every
    #: other type needs an existing aggregate (NOT_FOUND).
    creates: frozenset[str]
    event_types: frozenset[str]
    topics: DomainTopics
    decide: Callable[[S | None, Command], NewEvent | Reject]
    evolve: Callable[[S | None, Event], S]
    #: The state as JSON (``GET /aggregates/{id}``'s ``state``, and how it is stored) and back.
    state_to_json: Callable[[S], dict[str, Any]]
    state_from_json: Callable[[Mapping[str, Any]], S]
    #: The aggregate id's field in commands.
    aggregate_id_field: str = "aggregate_id"
    #: The aggregate id's field in events, rejections and command outcomes.
    message_id_field: str = "aggregate_id"
    #: Optional id fields of the command envelope the domain reads (str or null).
    command_fields: tuple[str, ...] = ()
    #: Problems of a well-formed envelope that make the command INVALID_COMMAND (None: none).
    check_command: Callable[[Command], str | None] | None = None
    #: Rejections of a command on an existing aggregate that come before the version check.
    guard: Callable[[S, Command], Reject | None] | None = None
    #: Every reason a rejection of this domain may carry.
    reasons: tuple[str, ...] = REASONS

    # -- messages --------------------------------------------------------------------------

    def event_json(self, event: Event) -> dict[str, Any]:
        return {
            "event_id": event.event_id,
            "command_id": event.command_id,
            "type": event.type,
            self.message_id_field: event.aggregate_id,
            **event.fields,
            "version": event.version,
            "occurred_at": event.occurred_at,
            "data": dict(event.data),
        }

    def rejection_json(self, rejection: Rejection) -> dict[str, Any]:
        return {
            "command_id": rejection.command_id,
            self.message_id_field: rejection.aggregate_id,
            "reason": rejection.reason,
            "detail": rejection.detail,
            "current_version": rejection.current_version,
        }

    def aggregate_json(self, aggregate: Aggregate[S]) -> dict[str, Any]:
        """``GET /aggregates/{id}``."""
        return {
            "aggregate_id": aggregate.aggregate_id,
            "version": aggregate.version,
            "state": self.state_to_json(aggregate.state),
        }

    def command_json(self, command: Command) -> dict[str, Any]:
        """A command record as :func:`parse_command` reads it (for a producer of commands)."""
        return {
            "command_id": command.command_id,
            "type": command.type,
            self.aggregate_id_field: command.aggregate_id,
            **command.fields,
            "expected_version": command.expected_version,
            "data": dict(command.data),
            "issued_at": command.issued_at,
        }


# -- reading commands --------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_command(domain: Domain[Any], obj: Mapping[str, Any], *, default_issued_at: int) -> Command:
    """Read a command of ``domain`` from its JSON object.

    Raises :class:`MalformedCommand` when ``command_id`` or the aggregate id is not a
    non-empty string (such a record cannot be answered and becomes a dead letter). Any other
    problem gives a :class:`Command` with ``invalid`` set. A missing ``issued_at`` takes
    ``default_issued_at`` (the record's timestamp); missing ``data`` is ``{}``.
    """
    id_field = domain.aggregate_id_field
    command_id = obj.get("command_id")
    aggregate_id = obj.get(id_field)
    if not isinstance(command_id, str) or not command_id:
        raise MalformedCommand(f"'command_id' must be a non-empty string, got {command_id!r:.80}")
    if not isinstance(aggregate_id, str) or not aggregate_id:
        raise MalformedCommand(f"'{id_field}' must be a non-empty string, got {aggregate_id!r:.80}")

    # The checks below cost nothing on a well-formed command (this runs once per command);
    # the messages are built only for what is wrong.
    problems: list[str] = []
    command_type = obj.get("type")
    if command_type.__class__ is not str or command_type not in domain.command_types:
        problems.append(f"unknown command type {command_type!r:.80}; expected one of {', '.join(domain.command_types)}")
        command_type = command_type if isinstance(command_type, str) else ""
    if len(command_id) > MAX_ID_LENGTH or "\x00" in command_id:
        problems.append(id_problem("command_id", command_id) or "")
    if len(aggregate_id) > MAX_ID_LENGTH or "\x00" in aggregate_id:
        problems.append(id_problem(id_field, aggregate_id) or "")
    fields: Mapping[str, Any] = _NO_FIELDS
    if domain.command_fields:
        fields = {}
        for name in domain.command_fields:
            field_value = obj.get(name)
            if field_value is not None:
                field_problem = id_problem(name, field_value)
                if field_problem:
                    problems.append(field_problem)
                    field_value = None
            fields[name] = field_value
    expected_version = obj.get("expected_version")
    if expected_version is not None and (not _is_int(expected_version) or expected_version < 0):
        problems.append(f"'expected_version' must be null or an integer >= 0, got {expected_version!r:.80}")
        expected_version = None
    data = obj.get("data")
    if data is None:
        data = {}
    elif data.__class__ is not dict:
        problems.append(f"'data' must be a JSON object, got {type(data).__name__}")
        data = {}
    issued_at = obj.get("issued_at")
    if issued_at is None:
        issued_at = default_issued_at
    elif not _is_int(issued_at):
        problems.append(f"'issued_at' must be an integer (epoch ms), got {issued_at!r:.80}")
        issued_at = default_issued_at
    command = Command(
        command_id, aggregate_id, command_type, expected_version, data, issued_at, fields, "; ".join(problems) or None
    )
    if command.invalid is None and domain.check_command is not None:
        problem = domain.check_command(command)
        if problem:
            return command._replace(invalid=problem)
    return command


# -- deciding ----------------------------------------------------------------------------------


def _reject(command: Command, reason: str, detail: str, aggregate: Aggregate[Any] | None) -> Rejected:
    return Rejected(
        Rejection(
            command_id=command.command_id,
            aggregate_id=command.aggregate_id,
            reason=reason,
            detail=detail,
            current_version=aggregate.version if aggregate is not None else None,
        )
    )


def decide(domain: Domain[S], aggregate: Aggregate[S] | None, seen: Mapping[str, OutcomeCode], command: Command) -> Outcome:
    """The outcome of ``command`` for an aggregate in state ``aggregate`` (None: never existed),
    with the checks in the order the module's docstring gives.

    ``seen`` maps the command ids already answered for this aggregate to their outcome codes;
    a command id found there is a :class:`Duplicate` and changes nothing.
    """
    original = seen.get(command.command_id)
    if original is not None:
        return Duplicate(command_id=command.command_id, aggregate_id=command.aggregate_id, original=original)
    if command.invalid is not None:
        return _reject(command, INVALID_COMMAND, command.invalid, aggregate)
    expected = command.expected_version
    if command.type in domain.creates:
        if aggregate is not None:
            detail = f"{domain.noun} {command.aggregate_id!r} already exists (version {aggregate.version}); ids are never reused"
            return _reject(command, ALREADY_EXISTS, detail, aggregate)
        if expected not in (None, 0):
            detail = f"expected version {expected}, but the {domain.noun} does not exist yet (version 0)"
            return _reject(command, VERSION_CONFLICT, detail, aggregate)
    else:
        if aggregate is None:
            return _reject(command, NOT_FOUND, f"{domain.noun} {command.aggregate_id!r} does not exist", aggregate)
        if domain.guard is not None:
            refused = domain.guard(aggregate.state, command)
            if refused is not None:
                return _reject(command, refused.reason, refused.detail, aggregate)
        if expected is not None and expected != aggregate.version:
            detail = f"expected version {expected}, current version is {aggregate.version}"
            return _reject(command, VERSION_CONFLICT, detail, aggregate)

    state = aggregate.state if aggregate is not None else None
    decision = domain.decide(state, command)
    if isinstance(decision, Reject):
        return _reject(command, decision.reason, decision.detail, aggregate)
    if decision.type not in domain.event_types:
        raise DomainError(f"domain {domain.name!r} decided an event of unknown type {decision.type!r}")
    version = aggregate.version + 1 if aggregate is not None else 1
    event = Event(
        event_id=event_id_for(command.aggregate_id, command.command_id),
        command_id=command.command_id,
        type=decision.type,
        aggregate_id=command.aggregate_id,
        version=version,
        occurred_at=command.issued_at,
        data=decision.data,
        fields=decision.fields,
    )
    return Accepted(event=event, aggregate=Aggregate(command.aggregate_id, version, domain.evolve(state, event)))


@dataclass
class BatchPlan(Generic[S]):
    """Outcomes of a batch, one per command in input order, and the state rows to write."""

    outcomes: list[Outcome]
    states: dict[str, Row[S]]


def plan_batch(
    domain: Domain[S], commands: Iterable[Command], load: Callable[[str], Row[S] | None], history_limit: int
) -> BatchPlan[S]:
    """Decide ``commands`` in order; each is decided against the state left by the ones before.

    ``load`` reads an aggregate's stored row (called at most once per aggregate). The
    returned ``states`` are the rows that changed (an answered command is remembered even
    when rejected); duplicates change nothing. Commands whose aggregate id cannot key a row
    are answered without state.
    """
    cache: dict[str, Row[S]] = {}
    changed: dict[str, Row[S]] = {}
    outcomes: list[Outcome] = []
    for command in commands:
        if not command.storable:
            outcomes.append(decide(domain, None, {}, command))
            continue
        row = cache.get(command.aggregate_id)
        if row is None:
            row = load(command.aggregate_id) or Row()
            cache[command.aggregate_id] = row
        outcome = decide(domain, row.aggregate, row.history, command)
        outcomes.append(outcome)
        if isinstance(outcome, Duplicate):
            continue
        if isinstance(outcome, Accepted):
            row.aggregate = outcome.aggregate
        row.remember(command.command_id, outcome.code, history_limit)
        changed[command.aggregate_id] = row
    return BatchPlan(outcomes=outcomes, states=changed)


# -- reading events ----------------------------------------------------------------------------


class InvalidDomainEvent(ValueError):
    """An event record that breaks the domain's Event shape."""


def read_event(domain: Domain[S], obj: Mapping[str, Any]) -> Event:
    """An event record of ``domain`` (its JSON object) as an :class:`Event`, for its readers
    (a projection, a Spark job). Raises :class:`InvalidDomainEvent` naming the first bad field.
    Top-level fields other than the envelope's are kept in ``fields``."""
    id_field = domain.message_id_field
    event_type = obj.get("type")
    if not isinstance(event_type, str) or event_type not in domain.event_types:
        raise InvalidDomainEvent(f"unknown event type {event_type!r:.80}")
    version = obj.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise InvalidDomainEvent(f"'version' must be an integer >= 1, got {version!r:.80}")
    for name in (id_field, "command_id", "event_id"):
        problem = id_problem(name, obj.get(name))
        if problem is not None:
            raise InvalidDomainEvent(problem)
    occurred_at = obj.get("occurred_at")
    if not isinstance(occurred_at, int) or isinstance(occurred_at, bool):
        raise InvalidDomainEvent(f"'occurred_at' must be an integer (epoch ms), got {occurred_at!r:.80}")
    data = obj.get("data", {})
    if not isinstance(data, dict):
        raise InvalidDomainEvent(f"'data' must be a JSON object, got {type(data).__name__}")
    envelope = {"event_id", "command_id", "type", id_field, "version", "occurred_at", "data"}
    return Event(
        event_id=obj["event_id"],
        command_id=obj["command_id"],
        type=event_type,
        aggregate_id=obj[id_field],
        version=version,
        occurred_at=occurred_at,
        data=data,
        fields={k: v for k, v in obj.items() if k not in envelope},
    )


# -- loading -----------------------------------------------------------------------------------

#: Fields every command model has (beyond the domain's aggregate id field and ``type``).
ENVELOPE_FIELDS = ("command_id", "expected_version", "data", "issued_at")
_CALLABLES = ("decide", "evolve", "state_to_json", "state_from_json")


def _names(value: Any) -> bool:
    """Whether ``value`` is a collection of non-empty strings (a tuple, list, set or frozenset)."""
    return isinstance(value, (tuple, list, set, frozenset)) and all(isinstance(v, str) and v for v in value)


def check_domain(domain: Any, where: str) -> Domain[Any]:
    """``domain`` when it is a complete :class:`Domain`, else :class:`DomainError` saying what is missing."""
    if not isinstance(domain, Domain):
        raise DomainError(f"{where} is a {type(domain).__name__}, not a shared.domain.Domain")
    missing: list[str] = []
    for name in _CALLABLES:
        if not callable(getattr(domain, name, None)):
            missing.append(f"{name} (a function)")
    for name in ("check_command", "guard"):
        if getattr(domain, name) is not None and not callable(getattr(domain, name)):
            missing.append(f"{name} (a function or None)")
    for name in ("name", "noun", "aggregate_id_field", "message_id_field"):
        if not isinstance(getattr(domain, name), str) or not getattr(domain, name):
            missing.append(f"{name} (a non-empty string)")
    if not _names(domain.command_fields):
        missing.append("command_fields (a tuple of field names)")
    model = domain.command_model
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        missing.append("command_model (a pydantic model)")
    elif isinstance(domain.aggregate_id_field, str) and _names(domain.command_fields):
        needed = ("type", domain.aggregate_id_field, *ENVELOPE_FIELDS, *domain.command_fields)
        absent = [name for name in needed if name not in model.model_fields]
        if absent:
            missing.append(f"command_model fields {', '.join(absent)}")
    if not domain.command_types or not _names(domain.command_types):
        missing.append("command_types (at least one)")
    elif not domain.creates or not _names(domain.creates) or not set(domain.creates) <= set(domain.command_types):
        missing.append("creates (one or more of command_types)")
    if not domain.event_types or not _names(domain.event_types):
        missing.append("event_types (at least one)")
    if not _names(domain.reasons):
        missing.append("reasons (a tuple of rejection reasons)")
    for name in ("commands", "events", "rejections", "command_batches"):
        topic = getattr(domain.topics, name, None)
        if not isinstance(topic, str) or not topic:
            missing.append(f"topics.{name}")
    if missing:
        raise DomainError(f"{where} lacks part of the domain API: {'; '.join(missing)}")
    return domain


def load_domain(spec: str) -> Domain[Any]:
    """The domain ``spec`` names, ``pkg.module:attr`` (``attr`` a :class:`Domain`, or a function
    of no arguments returning one). Raises :class:`DomainError` naming the module and what is
    wrong: it cannot be imported, has no such attribute, or lacks part of the API."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise DomainError(f"domain {spec!r} must be given as 'pkg.module:attr'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise DomainError(f"domain module {module_name!r} cannot be imported: {type(exc).__name__}: {exc}") from exc
    found = getattr(module, attr, None)
    if found is None:
        raise DomainError(f"domain module {module_name!r} has no attribute {attr!r}")
    if not isinstance(found, Domain) and callable(found):
        try:
            found = found()
        except Exception as exc:
            raise DomainError(f"{spec} raised {type(exc).__name__}: {exc}") from exc
    return check_domain(found, spec)
