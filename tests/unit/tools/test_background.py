"""The background builds `make test` starts first (tools/background.py)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path

import pytest

from tests.support.services import wait_for
from tools import background


def test_a_second_holder_waits_for_the_first(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    said: list[str] = []
    order: list[str] = []

    def second() -> None:
        with background.exclusive(lock, "thing", said.append):
            order.append("second")

    with background.exclusive(lock, "thing", said.append):
        waiter = threading.Thread(target=second)
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive()
        order.append("first")
    waiter.join(10)
    assert order == ["first", "second"]
    assert said[0].startswith("another thing is running") and said[1].startswith("waited")


def test_the_background_process_runs_at_the_lowest_priority_and_logs(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    pid = background.start_at_lowest_priority(["timeit", "-n1", "-r1", "import time; print('ran'); time.sleep(2)"], log)
    try:
        # ionice and nice set the priority, then exec the next program: once Python runs, both have.
        wait_for(
            lambda: Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == sys.executable.encode(),
            timeout=30,
            interval=0.05,
            message="ionice and nice to have exec'd Python",
        )
        nice = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])
        assert nice == 19
        assert os.getsid(pid) == pid  # a session of its own: make's Ctrl-C does not reach it
        if Path("/proc/self/autogroup").exists():
            # A session is an autogroup of its own, which nice alone does not lower.
            assert Path(f"/proc/{pid}/autogroup").read_text().split()[-1] == "19"
    finally:
        with contextlib.suppress(ChildProcessError):  # reaped already, when its Popen was collected
            os.waitpid(pid, 0)
    assert "ran" in log.read_text()


@pytest.mark.parametrize("root", ["/var/lib/containers/statefleet", "/srv/images/ci"])
def test_image_builds_into_one_store_take_one_lock(root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tools import image_build

    monkeypatch.setenv("STATEFLEET_IMAGE_STORAGE_ROOT", root)
    assert image_build.build_lock() == Path(f"/run/containers/{Path(root).name}.build.lock")


def test_exclusive_if_free_says_whether_it_holds_the_lock_and_never_waits(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    with background.exclusive(lock, "build", lambda _: None), background.exclusive_if_free(lock) as free:
        assert free is False
    with background.exclusive_if_free(lock) as free:
        assert free is True
        with background.exclusive_if_free(lock) as again:  # another open of the file: held
            assert again is False
    with background.exclusive_if_free(lock) as free:  # released with the block
        assert free is True
