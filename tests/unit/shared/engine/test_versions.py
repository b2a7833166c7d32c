from __future__ import annotations

import pytest

from shared.engine._versions import SUPPORTED, UnsupportedVersion, check_versions, installed


def test_the_installed_versions_are_the_supported_ones() -> None:
    check_versions()
    assert {name: installed(name) for name in SUPPORTED} == SUPPORTED


def test_another_version_is_refused_naming_what_is_supported() -> None:
    with pytest.raises(UnsupportedVersion) as err:
        check_versions({"faust-streaming": "0.16.0", "aiokafka": SUPPORTED["aiokafka"]})
    message = str(err.value)
    assert "faust-streaming 0.16.0 (supported: 0.15.3)" in message
    assert "aiokafka" not in message.split("installed:")[1]


def test_a_missing_package_is_named() -> None:
    with pytest.raises(UnsupportedVersion, match="aiokafka not installed"):
        check_versions({"faust-streaming": SUPPORTED["faust-streaming"], "aiokafka": None})
