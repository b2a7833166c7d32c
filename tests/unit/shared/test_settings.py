"""Settings fit only for a local run are refused outside one."""

from __future__ import annotations

import pytest

from shared.settings import DEV_ADMIN_TOKEN, Settings, UnsafeSettings


def test_local_runs_take_the_development_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STATEFLEET_ENV", raising=False)
    monkeypatch.delenv("STATEFLEET_ADMIN_TOKEN", raising=False)
    settings = Settings()
    assert settings.env == "local" and settings.admin_token == DEV_ADMIN_TOKEN
    settings.check_deployable()


@pytest.mark.parametrize("token", [DEV_ADMIN_TOKEN, "", "   "])
@pytest.mark.parametrize("env", ["production", "staging"])
def test_other_runs_refuse_the_development_or_an_empty_token_saying_what_to_set(env: str, token: str) -> None:
    with pytest.raises(UnsafeSettings, match="Set STATEFLEET_ADMIN_TOKEN to a secret of your own"):
        Settings(env=env, admin_token=token).check_deployable()


def test_other_runs_take_a_token_of_their_own() -> None:
    Settings(env="production", admin_token="s3cret-of-our-own").check_deployable()
