"""Fuzz every service's HTTP API from its own OpenAPI document (schemathesis), against
real service processes on the real broker.

Every answer must be one the document lists, with the body, content type and headers
it lists: no 5xx, no undocumented status. Afterwards each worker must still be alive
and still processing. The run is bounded in examples and in time (``FUZZ_SECONDS``
per service); ``STATEFLEET_FUZZ_SECONDS`` and ``STATEFLEET_FUZZ_EXAMPLES`` turn it up.

``positive_data_acceptance`` is left out: it expects a 2xx for every request the
schema allows, while a cursor this API did not make (400) or an id nobody created
(404) is well-formed and still refused, as documented.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.environment import service_environment
from tests.support.kafka import create_topics
from tests.support.services import ServiceProcess
from tools import web

pytestmark = pytest.mark.e2e

TOKEN = "fuzz-admin-token"
FUZZ_SECONDS = int(os.environ.get("STATEFLEET_FUZZ_SECONDS", "15"))
FUZZ_EXAMPLES = int(os.environ.get("STATEFLEET_FUZZ_EXAMPLES", "15"))
SERVICES = ("validator", "tallies", "retry_scheduler")


@pytest.fixture(scope="module")
def every_service(
    kafka_bootstrap: str, module_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, ServiceProcess]]:
    """The validator, the tallies and the retry scheduler, by name, on one prefix for the module."""
    tmp = tmp_path_factory.mktemp("fuzz")
    prefix = module_prefix
    create_topics([f"{prefix}dead-letters", f"{prefix}retry", f"{prefix}parking-lot"])
    env = service_environment(kafka_bootstrap, prefix, tmp / "data", instance="fuzz", log_level="WARNING", admin_token=TOKEN)
    procs = {name: ServiceProcess(name, env, tmp / f"{name}.log").start() for name in SERVICES}
    try:
        for proc in procs.values():
            proc.wait_ready()
        yield procs
    finally:
        for proc in procs.values():
            proc.kill()


def schemathesis(url: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    cli = Path(sys.executable).with_name("schemathesis")
    return subprocess.run(
        [
            str(cli),
            "run",
            f"{url}/openapi.json",
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance",
            "--max-examples",
            str(FUZZ_EXAMPLES),
            "--max-time",
            str(FUZZ_SECONDS),
            "--request-timeout",
            "10",
            "--header",
            f"Authorization: Bearer {TOKEN}",
            "--max-failures",
            "5",
            "--no-color",
        ],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=FUZZ_SECONDS + 90,
    )


@pytest.mark.parametrize("service", SERVICES)
def test_fuzzed_requests_get_only_documented_answers(
    every_service: dict[str, ServiceProcess], service: str, tmp_path: Path
) -> None:
    proc = every_service[service]
    run = schemathesis(proc.url, tmp_path)
    report = run.stdout[-12_000:] + run.stderr[-2_000:]
    assert run.returncode == 0, report
    assert "Tested:" in run.stdout, report  # the run reached the operations

    assert proc.proc is not None and proc.proc.poll() is None, proc.log_tail()
    assert web.get(proc.url + "/readyz", timeout=5).status_code == 200, proc.log_tail()
    if service == "validator":  # the worker still decides commands, not just answers HTTP
        account = f"after-fuzz-{uuid.uuid4().hex[:8]}"
        r = web.post(
            proc.url + "/commands",
            params={"wait": "true"},
            timeout=20,
            json={"type": "CreateAccount", "account_id": account, "program_id": "after-fuzz"},
        )
        assert r.status_code == 200 and r.json()["status"] == "accepted", (r.text, proc.log_tail())
