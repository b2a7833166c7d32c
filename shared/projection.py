"""The projection API of the tallies service: what a team writes to have its own rows
tallied, and the rules that keep those rows exact under replays.

A projection keeps one row per *category* (a program, a customer…), summed over the
*entities* (accounts, orders…) that belong to it. A team's module supplies a
:class:`Projection`:

- its input topics (:class:`Input`, names without the topic prefix), each with a reader
  that turns a record's JSON object into a :class:`Change` of one entity or a :class:`Mark`
  of one category, or raises :class:`InvalidInput` (the record goes to dead letters);
- ``evolve(status, event)``: the entity's status after a change, given its status before
  (None: not seen yet). A status is a string (it is stored as it is);
- ``contribution(status)``: what an entity with that status adds to its category's row, one
  integer per name of ``counters``;
- ``row(key, totals, mark)``: the published row (a JSON object) from the category's totals
  and its mark, and ``row_model``, the pydantic model of that row (the HTTP API's schema);
- ``output_topic`` (compacted, keyed by category) and ``key_field``, the row's field that
  holds the category key (the HTTP path parameter of ``GET /tallies/{key_field}``).

Why a replay never counts twice: the service keeps, per (category, entity), a
:class:`Membership`: the entity's status after the newest version applied. A change whose
version is not newer than that one changes nothing (:func:`advance`), so a duplicated,
replayed or late (re-ordered by version) change is dropped, and a category's totals are
the sum of its members' contributions, which depend on their statuses only. A mark is kept
at its maximum, which replays cannot change either. So a reader must give each change its
entity's version (1, 2, 3… per entity), and ``evolve`` must make the status after a version
depend on that version's event (and, at most, the status before it); every entity must stay
in one category.

Loaded with ``STATEFLEET_TALLIES_PROJECTION=pkg.module:attr`` (:func:`load_projection`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from pydantic import BaseModel

#: Builds a NamedTuple from its fields in C, without the Python-level ``__new__`` the class
#: generates: readers build one per input record.
build_record = tuple.__new__

#: Longest category or entity key the readers of :func:`require_key` accept, in characters.
MAX_KEY_LENGTH = 256


class InvalidInput(ValueError):
    """A record that cannot be applied; it goes to dead-letters with this message and never counts."""


class ProjectionError(RuntimeError):
    """A projection that cannot be loaded or lacks part of the API; names the module and what is wrong."""


class Change(NamedTuple):
    """A change of one entity, as a reader returns it.

    ``event`` is what ``evolve`` reads: a string, a number or a list of them (it crosses an
    internal topic as JSON, so a tuple comes back as a list). ``version``: the entity's
    version this change brings it to (1, 2, 3…)."""

    entity: str
    category: str
    event: Any
    version: int


class Mark(NamedTuple):
    """A value of one category kept at its maximum (e.g. the latest login's ts)."""

    category: str
    value: int


class Membership(NamedTuple):
    """An entity's standing in its category: its status after the newest applied version."""

    status: str
    version: int


#: Reads one record's JSON object; raises :class:`InvalidInput` for a record it refuses.
Reader = Callable[[Mapping[str, Any]], "Change | Mark"]


@dataclass(frozen=True)
class Input:
    """An input topic (its name without the configured prefix) and how its records are read."""

    topic: str
    read: Reader


@dataclass(frozen=True)
class Projection:
    """A team's tallies. See the module's documentation for what each part must do."""

    #: Names the projection's state (consumer group, changelogs, local data), so two
    #: projections never share it. The bundled default is ``accounts``.
    name: str
    inputs: tuple[Input, ...]
    #: Compacted, keyed by category: the rows as they change.
    output_topic: str
    #: The row field holding the category key; also the path parameter of ``GET /tallies/{…}``.
    key_field: str
    #: Names of the integers ``contribution`` returns, in order.
    counters: tuple[str, ...]
    evolve: Callable[[str | None, Any], str]
    contribution: Callable[[str], tuple[int, ...]]
    #: The row from the category key, its totals (None: no member) and its mark (None: none yet).
    row: Callable[[str, tuple[int, ...] | None, int | None], dict[str, Any]]
    row_model: type[BaseModel]
    description: str = ""

    def __post_init__(self) -> None:
        problems = projection_problems(self)
        if problems:
            raise ProjectionError(f"projection {self.name!r}: {'; '.join(problems)}")

    def reader_for(self, topic: str, prefix: str = "") -> Reader | None:
        """How a record of ``topic`` (its full name, under ``prefix``) is read; None: not an input."""
        for item in self.inputs:
            if prefix + item.topic == topic:
                return item.read
        return None


def projection_problems(p: Projection) -> list[str]:
    """What makes ``p`` unusable (empty: nothing)."""
    problems: list[str] = []
    if not isinstance(p.name, str) or not p.name or not all(c.isalnum() or c in "-_" for c in p.name):
        problems.append("'name' must be a non-empty string of letters, digits, '-' and '_'")
    if not p.inputs or not all(isinstance(i, Input) and i.topic and callable(i.read) for i in p.inputs):
        problems.append("'inputs' must be a non-empty tuple of Input(topic, read)")
    elif len({i.topic for i in p.inputs}) != len(p.inputs):
        problems.append("'inputs' names a topic twice")
    if not isinstance(p.output_topic, str) or not p.output_topic:
        problems.append("'output_topic' must be a non-empty string")
    if not isinstance(p.key_field, str) or not p.key_field.isidentifier():
        problems.append("'key_field' must be an identifier")
    if not p.counters or not all(isinstance(c, str) for c in p.counters):
        problems.append("'counters' must be a non-empty tuple of names")
    for name in ("evolve", "contribution", "row"):
        if not callable(getattr(p, name, None)):
            problems.append(f"'{name}' must be callable")
    if not (isinstance(p.row_model, type) and issubclass(p.row_model, BaseModel)):
        problems.append("'row_model' must be a pydantic model class")
    elif p.key_field not in p.row_model.model_fields:
        problems.append(f"'row_model' has no field {p.key_field!r} (the key_field)")
    return problems


def load_projection(spec: str) -> Projection:
    """The :class:`Projection` named by ``pkg.module:attr``; raises :class:`ProjectionError`
    naming the module and what is missing or wrong."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ProjectionError(f"STATEFLEET_TALLIES_PROJECTION={spec!r}: expected 'pkg.module:attr'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any failure to import is the module's, and is reported as such
        raise ProjectionError(f"cannot import projection module {module_name!r}: {type(exc).__name__}: {exc}") from exc
    if not hasattr(module, attr):
        raise ProjectionError(f"projection module {module_name!r} has no attribute {attr!r}")
    projection = getattr(module, attr)
    if not isinstance(projection, Projection):
        raise ProjectionError(f"{module_name}:{attr} is a {type(projection).__name__}, not a shared.projection.Projection")
    return projection


def require_key(obj: Mapping[str, Any], name: str) -> str:
    """``obj[name]`` as a category or entity key: a non-empty string of at most
    :data:`MAX_KEY_LENGTH` characters without NUL (state keys use NUL as a separator)."""
    value = obj.get(name)
    if type(value) is str and 0 < len(value) <= MAX_KEY_LENGTH and "\x00" not in value:
        return value
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"'{name}' must be a non-empty string, got {value!r:.80}")
    if "\x00" in value:
        raise InvalidInput(f"'{name}' must not contain NUL")
    raise InvalidInput(f"'{name}' is longer than {MAX_KEY_LENGTH} characters")


def require_int(obj: Mapping[str, Any], name: str, minimum: int | None = None) -> int:
    """``obj[name]`` as an integer (not a boolean), at least ``minimum`` when given."""
    value = obj.get(name)
    if type(value) is not int:
        raise InvalidInput(f"'{name}' must be an integer, got {value!r:.80}")
    if minimum is not None and value < minimum:
        raise InvalidInput(f"'{name}' must be >= {minimum}, got {value}")
    return value


# -- the rules, one implementation each: the service and any batch fold run these ---------------


def advance(evolve: Callable[[str | None, Any], str], current: Membership | None, change: Change) -> Membership | None:
    """The entity's membership after ``change``, or ``None`` when it is a replay (its version is
    not newer than the one applied)."""
    if current is not None and change.version <= current.version:
        return None
    return build_record(Membership, (evolve(current.status if current is not None else None, change.event), change.version))


def delta(contribution: Callable[[str], tuple[int, ...]], before: str | None, after: str) -> tuple[int, ...]:
    """How a category's totals move when one of its entities goes from ``before`` to ``after``."""
    gained = contribution(after)
    if before is None:
        return gained
    return tuple(a - b for a, b in zip(gained, contribution(before), strict=True))


def add_to(totals: list[int], contribution: tuple[int, ...]) -> None:
    """Add ``contribution`` to ``totals`` in place."""
    for i, value in enumerate(contribution):
        if value:
            totals[i] += value


def latest(current: int | None, value: int) -> int:
    """A mark after ``value`` is seen: the larger of the two."""
    return value if current is None or value > current else current


def fold(projection: Projection, changes: Iterable[Change], marks: Iterable[int]) -> tuple[tuple[int, ...] | None, int | None]:
    """One category's (totals, mark) from its whole history, in any order, duplicates included
    (totals None: no member). Changes are applied per entity in version order through
    :func:`advance`, as the service applies them, so this equals what the service holds after
    the same input."""
    members: dict[str, Membership] = {}
    for change in sorted(changes, key=lambda c: (c.entity, c.version)):
        updated = advance(projection.evolve, members.get(change.entity), change)
        if updated is not None:
            members[change.entity] = updated
    totals: list[int] | None = None
    for member in members.values():
        if totals is None:
            totals = [0] * len(projection.counters)
        add_to(totals, projection.contribution(member.status))
    mark: int | None = None
    for value in marks:
        mark = latest(mark, value)
    return (tuple(totals) if totals is not None else None), mark
