"""The retry scheduler refuses exactly_once rather than run at-least-once while claiming it:
its redeliveries are not part of a transaction yet."""

from __future__ import annotations

import pytest

from services.retry_scheduler.runtime import build
from shared.settings import Settings


def test_exactly_once_is_refused_at_start_with_what_to_set(tmp_path: object) -> None:
    settings = Settings(processing_guarantee="exactly_once", data_dir=tmp_path)  # type: ignore[arg-type]
    with pytest.raises(SystemExit) as exited:
        build(settings)
    message = str(exited.value)
    assert "STATEFLEET_PROCESSING_GUARANTEE=exactly_once is not supported by the retry scheduler" in message
    assert "at_least_once" in message


def test_the_setting_takes_only_the_two_guarantees() -> None:
    assert Settings().processing_guarantee == "at_least_once"
    with pytest.raises(ValueError):
        Settings(processing_guarantee="at_most_once")  # type: ignore[arg-type]
