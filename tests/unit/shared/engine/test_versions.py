from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from shared.engine._versions import SUPPORTED, UnsupportedVersion, check_versions, installed, release

REPO = Path(__file__).resolve().parents[4]


def test_the_installed_versions_are_supported() -> None:
    check_versions()
    assert all((have := installed(name)) is not None and have in wanted for name, wanted in SUPPORTED.items())


def test_the_range_includes_its_lowest_and_excludes_its_bound() -> None:
    faust = SUPPORTED["faust-streaming"]
    assert faust.lowest in faust and "0.15.9" in faust
    assert "0.16.0" not in faust and "0.13.2" not in faust
    assert "0.14.1" in SUPPORTED["aiokafka"] and "0.12.0" not in SUPPORTED["aiokafka"]


def test_release_reads_the_numeric_part() -> None:
    assert release("0.14.0") == (0, 14, 0)
    assert release("0.15.3rc1") == (0, 15, 3)
    assert release("1.2.post1") == (1, 2)


def test_another_version_is_refused_naming_what_is_supported() -> None:
    with pytest.raises(UnsupportedVersion) as err:
        check_versions({"faust-streaming": "0.16.0", "aiokafka": SUPPORTED["aiokafka"].lowest})
    message = str(err.value)
    assert "faust-streaming 0.16.0 (supported: >=0.15.3,<0.16)" in message
    assert "aiokafka" not in message.split("installed:")[1]


def test_a_missing_package_is_named() -> None:
    with pytest.raises(UnsupportedVersion, match="aiokafka not installed"):
        check_versions({"faust-streaming": SUPPORTED["faust-streaming"].lowest, "aiokafka": None})


def test_pyproject_declares_the_supported_ranges() -> None:
    """The ranges a pip resolver sees are the ones the worker checks at start."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {req.name: req.specifier for req in map(Requirement, project["dependencies"]) if req.name in SUPPORTED}
    assert declared == {name: SpecifierSet(str(wanted)) for name, wanted in SUPPORTED.items()}


def test_the_lowest_run_installs_the_lowest_of_each_range() -> None:
    """`make test-lowest` (mk/lowest.mk) runs the suite on exactly the ranges' lower ends."""
    line = next(line for line in (REPO / "mk/lowest.mk").read_text().splitlines() if line.startswith("LOWEST_PINS :="))
    pins = dict(pin.split("==") for pin in line.split(":=", 1)[1].split())
    assert pins == {name: wanted.lowest for name, wanted in SUPPORTED.items()}
