"""The projection API: the loader names the module and what is missing; a projection that lacks
part of the API is refused when it is made; the version rule and the fold."""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from services.tallies.app import configured_projection
from services.tallies.domain import PROJECTION as ACCOUNTS
from shared.projection import Change, Membership, ProjectionError, advance, delta, fold, load_projection
from shared.settings import Settings


@pytest.fixture
def module() -> Iterator[types.ModuleType]:
    mod = types.ModuleType("team_projection_for_test")
    sys.modules[mod.__name__] = mod
    yield mod
    del sys.modules[mod.__name__]


def test_loads_the_named_attribute(module: types.ModuleType) -> None:
    module.MINE = ACCOUNTS  # type: ignore[attr-defined]
    assert load_projection("team_projection_for_test:MINE") is ACCOUNTS
    assert configured_projection(Settings(tallies_projection="team_projection_for_test:MINE")) is ACCOUNTS
    assert configured_projection(Settings()) is ACCOUNTS


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon", "expected 'pkg.module:attr'"),
        (":ATTR", "expected 'pkg.module:attr'"),
        ("no_such_module_xyz:P", "cannot import projection module 'no_such_module_xyz': ModuleNotFoundError"),
        ("team_projection_for_test:MISSING", "projection module 'team_projection_for_test' has no attribute 'MISSING'"),
        ("team_projection_for_test:OTHER", "team_projection_for_test:OTHER is a int, not a shared.projection.Projection"),
    ],
)
def test_loader_names_the_module_and_what_is_wrong(module: types.ModuleType, spec: str, message: str) -> None:
    module.OTHER = 3  # type: ignore[attr-defined]
    with pytest.raises(ProjectionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_projection(spec)


def test_a_module_that_fails_on_import_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "failing_projection_for_test.py").write_text("raise RuntimeError('no config')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ProjectionError, match="'failing_projection_for_test': RuntimeError: no config"):
        load_projection("failing_projection_for_test:PROJECTION")


class NoKey(BaseModel):
    other: int


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": ""}, "'name' must be a non-empty string"),
        ({"inputs": ()}, "'inputs' must be a non-empty tuple"),
        ({"inputs": (ACCOUNTS.inputs[0], ACCOUNTS.inputs[0])}, "'inputs' names a topic twice"),
        ({"key_field": "not an identifier"}, "'key_field' must be an identifier"),
        ({"counters": ()}, "'counters' must be a non-empty tuple"),
        ({"evolve": None}, "'evolve' must be callable"),
        ({"row_model": dict}, "'row_model' must be a pydantic model class"),
        ({"row_model": NoKey}, "'row_model' has no field 'program_id'"),
    ],
)
def test_a_projection_lacking_part_of_the_api_is_refused(change: dict[str, object], message: str) -> None:
    with pytest.raises(ProjectionError, match=message):
        dataclasses.replace(ACCOUNTS, **change)  # type: ignore[arg-type]


def test_a_change_applies_only_past_the_applied_version() -> None:
    def evolve(status: str | None, event: str) -> str:
        return event

    assert advance(evolve, None, Change("e", "c", "a", 1)) == Membership("a", 1)
    assert advance(evolve, Membership("a", 2), Change("e", "c", "b", 2)) is None
    assert advance(evolve, Membership("a", 2), Change("e", "c", "b", 1)) is None
    assert advance(evolve, Membership("a", 2), Change("e", "c", "b", 4)) == Membership("b", 4)


def test_delta_and_fold() -> None:
    assert delta(ACCOUNTS.contribution, None, "active") == (1, 0)
    assert delta(ACCOUNTS.contribution, "active", "inactive") == (-1, 1)
    changes = [Change("a", "P", "AccountCreated", 1), Change("a", "P", "AccountDeactivated", 2)]
    assert fold(ACCOUNTS, changes[::-1] + changes, [5, 9, 7]) == ((0, 1), 9)
    assert fold(ACCOUNTS, [], []) == (None, None)
