"""One running instance per data folder.

RocksDB locks each database itself, but only when it opens it, which Faust does in the
middle of a rebalance: a second process on the same folder then fails deep in recovery.
Kubernetes makes that second process on purpose: a StatefulSet pod deleted with
``--force`` is replaced at once, on the same volume, while the old container may still
be stopping. So an instance takes an exclusive lock on its folder before anything else,
waits for it while the previous holder stops, and otherwise exits saying who holds it
(the pod restarts and tries again; no half-opened state).
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

LOCK_NAME = ".instance.lock"
#: Held for the life of the process (closing the file would release the lock).
_held: list[IO[str]] = []


class DataDirLocked(SystemExit):
    """Another process kept the data folder past the wait; the message says which."""


def _holder(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError:
        return "unknown"
    return text or "unknown"


def hold_data_dir(folder: Path, wait_s: float, poll_s: float = 0.5) -> IO[str]:
    """Takes ``folder``'s lock for this process, waiting up to ``wait_s`` for its holder."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    handle = open(path, "a+")  # noqa: SIM115 (kept open: the lock lives as long as the file)
    started = time.monotonic()
    last_report = 0.0
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            waited = time.monotonic() - started
            if waited >= wait_s:
                handle.close()
                raise DataDirLocked(
                    f"{folder} is in use by another process ({_holder(path)}) after waiting {wait_s:.0f}s: "
                    "two instances must not share a data folder. If the previous instance is gone, its "
                    "process still holds the folder; give each instance its own folder (STATEFLEET_DATA_DIR, "
                    "STATEFLEET_INSTANCE_ID) or raise STATEFLEET_DATA_DIR_LOCK_WAIT_S"
                ) from None
            if waited - last_report >= 5 or last_report == 0.0:
                log.warning(
                    "waiting for %s: held by %s (an instance still stopping?); waited %.0fs of %.0fs",
                    folder,
                    _holder(path),
                    waited,
                    wait_s,
                )
                last_report = waited or 1e-9
            time.sleep(poll_s)
    if time.monotonic() - started > poll_s:
        log.info("took %s after %.1fs", folder, time.monotonic() - started)
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {os.uname().nodename}\n")
    handle.flush()
    _held.append(handle)
    return handle
