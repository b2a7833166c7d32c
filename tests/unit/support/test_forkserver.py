"""The fork server the tests start service instances with (tests/support/forkserver.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import forkserver
from tests.support.services import wait_for

PROBE = "tests.unit.support.child_probe"


@pytest.fixture(scope="module")
def server() -> Iterator[forkserver.ForkServer]:
    started = forkserver.ForkServer()
    yield started
    started.stop()


def spawn(server: forkserver.ForkServer, tmp_path: Path, *args: str) -> tuple[forkserver.ForkedProcess, Path]:
    log = tmp_path / "child.log"
    with open(log, "ab") as out:
        child = server.spawn(PROBE, list(args), {"PROBE": "given", "PATH": "/usr/bin"}, tmp_path, out.fileno())
    return child, log


def report(log: Path) -> dict[str, object]:
    return dict(json.loads(log.read_text().splitlines()[0]))


def test_a_child_runs_the_module_as_main_with_its_own_environment_folder_and_arguments(
    server: forkserver.ForkServer, tmp_path: Path
) -> None:
    child, log = spawn(server, tmp_path, "3", "extra")
    assert child.wait(30) == 3 and child.returncode == 3
    seen = report(log)
    assert seen["argv"] == ["3", "extra"] and seen["cwd"] == str(tmp_path) and seen["probe"] == "given"
    assert seen["main"] == "__main__"
    assert seen["preloaded"] is True and seen["project_imported"] is False


def test_a_child_imports_from_the_pythonpath_it_is_given(server: forkserver.ForkServer, tmp_path: Path) -> None:
    team = tmp_path / "team"
    log = tmp_path / "child.log"
    env = {"PATH": "/usr/bin", "PYTHONPATH": os.pathsep.join([str(team), os.environ.get("PYTHONPATH", "")])}
    with open(log, "ab") as out:
        child = server.spawn(PROBE, ["0"], env, tmp_path, out.fileno())
    assert child.wait(30) == 0
    path = report(log)["path"]
    assert isinstance(path, list) and path[0] == str(team)


def test_a_killed_child_reports_the_signal_as_popen_does(server: forkserver.ForkServer, tmp_path: Path) -> None:
    child, log = spawn(server, tmp_path, "sleep")
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.2)
    wait_for(lambda: log.exists() and log.read_text(), timeout=30, interval=0.05, message="the child's first line in its log")
    child.kill()
    assert child.wait(30) == -signal.SIGKILL and child.poll() == -signal.SIGKILL
    child.kill()  # exited: nothing is signalled


def test_an_exception_exits_1_with_its_traceback_in_the_log(server: forkserver.ForkServer, tmp_path: Path) -> None:
    child, log = spawn(server, tmp_path, "fail")
    assert child.wait(30) == 1
    assert "ValueError: probe failure" in log.read_text()


def test_children_run_side_by_side(server: forkserver.ForkServer, tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / str(i)).mkdir()
    children = [spawn(server, tmp_path / str(i), "sleep")[0] for i in range(3)]
    assert len({c.pid for c in children}) == 3 and all(c.poll() is None for c in children)
    for child in children:
        child.terminate()
    assert [c.wait(30) for c in children] == [-signal.SIGTERM] * 3


def test_a_test_process_with_more_than_1024_descriptors_still_waits_for_its_children(
    server: forkserver.ForkServer, tmp_path: Path
) -> None:
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        child, _ = spawn(server, tmp_path, "sleep")
        assert child.poll() is None
        child.kill()
        assert child.wait(30) == -signal.SIGKILL
    finally:
        for fd in held:
            os.close(fd)
