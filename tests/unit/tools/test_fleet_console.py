"""`make up` points the console at every instance it starts."""

from __future__ import annotations

from tools import fleet


def test_console_reads_every_instance_of_every_service() -> None:
    env = fleet.console_env({"tallies": 3, "validator": 1, "retry-scheduler": 2})
    assert env == {
        "STATEFLEET_CONSOLE_VALIDATOR_URL": "http://127.0.0.1:8001",
        "STATEFLEET_CONSOLE_TALLIES_URL": "http://127.0.0.1:8002,http://127.0.0.1:8012,http://127.0.0.1:8022",
        "STATEFLEET_CONSOLE_RETRY_SCHEDULER_URL": "http://127.0.0.1:8003,http://127.0.0.1:8013",
    }
