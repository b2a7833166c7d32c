"""Fixtures of the chart tests: a cached renderer and the list of values scenarios."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helm.chart import CHART, SCENARIOS, Manifest, run_helm, scenario_values, to_manifest

Render = Callable[..., Manifest]


@pytest.fixture(scope="session")
def render() -> Render:
    """render(scenario="default", sets=[...], values=[...], api_versions=[...]) -> Manifest (cached)."""
    cache: dict[tuple[Any, ...], Manifest] = {}

    def _render(
        scenario: str = "default",
        sets: tuple[str, ...] | list[str] = (),
        values: tuple[Path, ...] = (),
        api_versions: tuple[str, ...] | list[str] = (),
    ) -> Manifest:
        key = (scenario, tuple(sets), tuple(values), tuple(api_versions))
        if key not in cache:
            files = scenario_values(scenario) + list(values)
            cache[key] = to_manifest(run_helm(CHART, files, list(sets), list(api_versions)))
        return cache[key]

    return _render


@pytest.fixture(params=SCENARIOS)
def scenario(request: pytest.FixtureRequest) -> str:
    return str(request.param)
