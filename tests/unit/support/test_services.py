"""Service instances a test leaves running are stopped after it (``tests/conftest.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import services
from tests.support.services import ServiceProcess, stop_started_since


def test_an_instance_left_running_is_stopped_and_one_already_stopped_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STATEFLEET_TEST_FORKSERVER", "0")  # a plain child process: no fork server to start
    before = len(services.STARTED)
    port = services.free_port()
    left = ServiceProcess("http.server", {}, tmp_path / "left.log", port=port, args=(str(port), "--bind", "127.0.0.1")).start()
    stopped = ServiceProcess("http.server", {}, tmp_path / "stopped.log", args=("0", "--bind", "127.0.0.1")).start()
    stopped.stop()
    assert left.proc is not None and left.proc.poll() is None

    assert stop_started_since(before) == [left]
    assert left.proc.poll() is not None  # it no longer runs
    assert stop_started_since(before) == []  # nothing left the second time
