"""The fleet tool: restarting right after a crash, and where a fleet runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.services import free_port, wait_for
from tools import fleet, web
from tools.processes import process_state


@pytest.fixture
def fleet_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(fleet, "RUN_DIR", tmp_path / "run")
    monkeypatch.setattr(fleet, "LOG_DIR", tmp_path / "logs")
    return tmp_path


def test_a_zombie_is_not_running_and_a_live_process_is() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert process_state(child.pid) == "running"
        os.kill(child.pid, signal.SIGKILL)
        # Not reaped yet: it still answers signal 0.
        wait_for(lambda: process_state(child.pid) == "zombie", timeout=10, interval=0.05, message="the killed child a zombie")
        assert not fleet._alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert process_state(child.pid) is None


def test_an_instance_killed_a_moment_ago_is_started_again(fleet_home: Path) -> None:
    kind = fleet.ServiceKind("stand-in", "tests.support.ready_server", free_port())
    fleet.start_instance(kind, 0)
    first = fleet._running(kind, 0)
    assert first is not None and fleet.wait_ready(kind, 0, timeout=15)
    try:
        os.kill(first, signal.SIGKILL)  # its parent (this process) does not reap it: a zombie stays behind
        # Until the kill takes effect the process still runs, and is rightly seen as running: the
        # kernel clears the pending SIGKILL before it marks the process as exiting, and a loaded
        # machine can hold it between the two. The case here starts once the kill took effect.
        wait_for(lambda: process_state(first) != "running", timeout=15, message="the kill to take effect")
        fleet.start_instance(kind, 0)
        second = fleet._running(kind, 0)
        assert second is not None and second != first
        assert fleet.wait_ready(kind, 0, timeout=15)
        assert web.get(fleet.url(kind, 0) + "/readyz", timeout=2).status_code == 200
    finally:
        for pid in {first, fleet._recorded_pid(kind, 0)}:
            if pid is not None and process_state(pid) is not None:
                os.kill(pid, signal.SIGKILL)


def test_a_pid_file_naming_another_program_is_not_an_instance(fleet_home: Path) -> None:
    kind = fleet.ServiceKind("stand-in", "tests.support.ready_server", free_port())
    fleet.RUN_DIR.mkdir(parents=True)
    fleet._pid_file(kind, 0).write_text(str(os.getpid()))  # a live pid, but pytest, not the service
    assert fleet._running(kind, 0) is None


def test_services_connect_to_the_broker_make_broker_runs_and_ports_move(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "STATEFLEET_BROKER_PORT": "19092",
        "STATEFLEET_PORT_OFFSET": "1000",
        "STATEFLEET_FLEET_HOME": str(tmp_path),
    }
    env.pop("STATEFLEET_KAFKA_BOOTSTRAP_SERVERS", None)
    code = (
        "from tools import fleet\n"
        "kind = fleet.SERVICES[1]\n"
        "print(fleet.url(kind, 1), fleet.RUN_DIR, fleet.service_env(kind, 1)['STATEFLEET_KAFKA_BOOTSTRAP_SERVERS'])"
    )
    run = subprocess.run([sys.executable, "-c", code], env=env, cwd=fleet.REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert out.split() == ["http://127.0.0.1:9012", str(tmp_path / "run"), "127.0.0.1:19092"]


def test_an_instance_is_killed_collected_and_its_data_dir_named(fleet_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kind = fleet.ServiceKind("stand-in", "tests.support.ready_server", free_port())
    assert fleet.kill_instance(kind, 0) is None  # not running: nothing to kill
    fleet.start_instance(kind, 0)
    pid = fleet.pid_of(kind, 0)
    assert pid is not None and fleet.wait_ready(kind, 0, timeout=15)
    try:
        assert fleet.kill_instance(kind, 0) == pid
        fleet.reap(pid, timeout=10)
        assert process_state(pid) is None  # collected, not left a zombie
        assert fleet.pid_of(kind, 0) is None
    finally:
        if process_state(pid) is not None:
            os.kill(pid, signal.SIGKILL)
    monkeypatch.setenv("STATEFLEET_DATA_DIR", str(fleet_home / "data"))
    validator = fleet.SERVICES[0]
    assert fleet.instance_data_dir(validator, 1) == fleet_home / "data" / "validator" / "validator-1"
    scheduler = next(k for k in fleet.SERVICES if k.name == "retry-scheduler")
    assert fleet.instance_data_dir(scheduler, 0) == fleet_home / "data" / "retry_scheduler" / "retry-scheduler-0"
