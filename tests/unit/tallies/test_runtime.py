"""The tallies worker's start: a projection module that cannot be loaded stops it with one line
naming the setting, the module and what is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.tallies import runtime
from shared.settings import Settings

BROKEN = """
import dataclasses

from services.tallies.domain import PROJECTION as ACCOUNTS

PROJECTION = dataclasses.replace(ACCOUNTS, name="tickets", counters=())
"""


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("team_tallies_for_test:PROJECTION", "cannot import projection module 'team_tallies_for_test': ProjectionError: "),
        ("team_tallies_for_test:PROJECTION", "'counters' must be a non-empty tuple of names"),
        ("no_such_team_module:PROJECTION", "cannot import projection module 'no_such_team_module': ModuleNotFoundError"),
        ("services.tallies.domain:NOPE", "projection module 'services.tallies.domain' has no attribute 'NOPE'"),
    ],
)
def test_a_projection_that_cannot_be_loaded_stops_the_worker_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str, message: str
) -> None:
    (tmp_path / "team_tallies_for_test.py").write_text(BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(runtime, "get_settings", lambda: Settings(tallies_projection=spec))
    with pytest.raises(SystemExit) as stopped:
        runtime.main()
    text = str(stopped.value.code)
    assert text.startswith("statefleet tallies: STATEFLEET_TALLIES_PROJECTION: ") and message in text, text
