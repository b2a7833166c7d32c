"""The retry scheduler's named API tokens as chart values: a tokens file from an existing Secret,
mounted where STATEFLEET_TOKENS_FILE points, payloads behind a token when asked; checked by the schema."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import pytest

from tests.helm.chart import CHART, RenderError, env_of, run_helm

STS = "sf-statefleet-retry-scheduler"


def pod(m: Any, name: str = STS) -> dict[str, Any]:
    spec: dict[str, Any] = m.get("StatefulSet", name)["spec"]["template"]["spec"]
    return spec


def test_the_tokens_file_is_mounted_from_the_secret_where_the_scheduler_reads_it(render):
    spec = pod(render("replicas"))
    c = spec["containers"][0]
    env = env_of(c)
    path = PurePosixPath(env["STATEFLEET_TOKENS_FILE"]["value"])
    assert path == PurePosixPath("/etc/statefleet/tokens/tokens.yaml")
    assert env["STATEFLEET_PAYLOADS_REQUIRE_TOKEN"]["value"] == "true"
    mount = next(v for v in c["volumeMounts"] if v["name"] == "api-tokens")
    assert mount == {"name": "api-tokens", "mountPath": str(path.parent), "readOnly": True}
    volume = next(v for v in spec["volumes"] if v["name"] == "api-tokens")
    assert volume["secret"]["secretName"] == "statefleet-api-tokens"
    assert volume["secret"]["items"] == [{"key": "tokens.yaml", "path": path.name}]
    assert volume["secret"]["defaultMode"] == 0o440  # readable by the pod's group (fsGroup), no one else
    # the admin token is still given: it stays the token named admin
    assert env["STATEFLEET_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["name"]
    for other in ("sf-statefleet-tallies", "sf-statefleet-validator"):
        other_env = env_of(pod(render("replicas"), other)["containers"][0])
        assert "STATEFLEET_TOKENS_FILE" not in other_env and "STATEFLEET_PAYLOADS_REQUIRE_TOKEN" not in other_env


def test_another_key_of_the_secret(render):
    sets = ["services.retryScheduler.tokens.existingSecret=team-tokens", "services.retryScheduler.tokens.key=api.yaml"]
    spec = pod(render(sets=sets))
    assert env_of(spec["containers"][0])["STATEFLEET_TOKENS_FILE"]["value"] == "/etc/statefleet/tokens/api.yaml"
    volume = next(v for v in spec["volumes"] if v["name"] == "api-tokens")
    assert volume["secret"]["secretName"] == "team-tokens"
    assert volume["secret"]["items"] == [{"key": "api.yaml", "path": "api.yaml"}]


def test_by_default_the_admin_token_only_and_payloads_open(render):
    spec = pod(render())
    c = spec["containers"][0]
    env = env_of(c)
    assert "STATEFLEET_TOKENS_FILE" not in env and "STATEFLEET_PAYLOADS_REQUIRE_TOKEN" not in env
    assert all(v["name"] != "api-tokens" for v in spec["volumes"]) and all(v["name"] != "api-tokens" for v in c["volumeMounts"])
    only_payloads = env_of(pod(render(sets=["services.retryScheduler.tokens.payloadsRequireToken=true"]))["containers"][0])
    assert only_payloads["STATEFLEET_PAYLOADS_REQUIRE_TOKEN"]["value"] == "true" and "STATEFLEET_TOKENS_FILE" not in only_payloads


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (["services.retryScheduler.tokens.existingSecret=Team_Tokens"], "/services/retryScheduler/tokens/existingSecret"),
        (["services.retryScheduler.tokens.key=a/b"], "/services/retryScheduler/tokens/key"),
        (["services.retryScheduler.tokens.payloadsRequireToken=yes"], "/services/retryScheduler/tokens/payloadsRequireToken"),
        (["services.retryScheduler.tokens.secret=s3cret"], "additional properties 'secret' not allowed"),
    ],
)
def test_the_schema_refuses_bad_token_values(sets: list[str], expected: str) -> None:
    with pytest.raises(RenderError) as err:
        run_helm(CHART, [], sets, [])
    assert expected in str(err.value)
