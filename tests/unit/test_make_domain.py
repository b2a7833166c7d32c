"""`make up DOMAIN=…`: the services get the domain's validator domain and tallies projection."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from shared.projection import load_projection

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def dry_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "-n", "up", *args], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_domain_orders_names_its_modules_for_the_services() -> None:
    run = dry_run("DOMAIN=orders")
    assert run.returncode == 0, run.stderr
    fleet_up = next(line for line in run.stdout.splitlines() if "tools.fleet up" in line)
    assert "STATEFLEET_VALIDATOR_DOMAIN=examples.orders.domain:ORDERS" in fleet_up
    assert "STATEFLEET_TALLIES_PROJECTION=examples.orders.projection:PROJECTION" in fleet_up
    assert load_projection("examples.orders.projection:PROJECTION").name == "orders"


def test_no_domain_runs_the_defaults_and_an_unknown_one_is_refused() -> None:
    run = dry_run()
    assert run.returncode == 0 and "STATEFLEET_TALLIES_PROJECTION" not in run.stdout
    bad = dry_run("DOMAIN=nope")
    assert bad.returncode != 0 and "DOMAIN=nope: unknown; one of: orders" in bad.stderr
