"""One running instance per data folder: a second one waits, then exits saying who holds it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from shared.engine._instance_lock import LOCK_NAME, DataDirLocked, hold_data_dir

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from shared.engine._instance_lock import hold_data_dir
    hold_data_dir(Path(sys.argv[1]), wait_s=0)
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
    """
)


def start_holder(folder: Path, seconds: float) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_instance_exits_naming_the_holder(tmp_path: Path) -> None:
    holder = start_holder(tmp_path, 30)
    try:
        with pytest.raises(DataDirLocked) as refused:
            hold_data_dir(tmp_path, wait_s=0.3, poll_s=0.05)
        message = str(refused.value)
        assert f"pid {holder.pid}" in message and "STATEFLEET_DATA_DIR_LOCK_WAIT_S" in message
        assert isinstance(refused.value, SystemExit)  # the process ends: the pod restarts and tries again
    finally:
        holder.kill()
        holder.wait()


def test_it_takes_the_folder_once_the_holder_is_gone(tmp_path: Path) -> None:
    holder = start_holder(tmp_path, 30)
    threading.Timer(0.5, holder.kill).start()  # a SIGKILLed process releases its lock
    started = time.monotonic()
    handle = hold_data_dir(tmp_path, wait_s=20, poll_s=0.05)
    try:
        assert 0.4 < time.monotonic() - started < 15
        assert (tmp_path / LOCK_NAME).read_text().startswith(f"pid {os.getpid()} ")
    finally:
        handle.close()
        holder.wait()
