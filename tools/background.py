"""Slow preparations that run beside a test run, on what it leaves idle.

``make test`` starts the builds a cold machine needs later (the cluster's binaries, the
container image) before its suites, each in a process of its own at the lowest CPU and
I/O priority, and each under an exclusive lock that the step needing the result takes
too: that step then waits for a build in progress instead of running a second one.
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path


@contextlib.contextmanager
def exclusive(lock_file: Path, what: str, log: Callable[[str], None]) -> Iterator[None]:
    """Hold ``lock_file``'s exclusive lock; when another process holds it, say so and wait."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"another {what} is running (lock {lock_file}): waiting for it")
            started = time.monotonic()
            fcntl.flock(lock, fcntl.LOCK_EX)
            log(f"waited {time.monotonic() - started:.0f}s for it")
        yield  # the lock goes with the file's closing


@contextlib.contextmanager
def exclusive_if_free(lock_file: Path) -> Iterator[bool]:
    """Holds ``lock_file``'s exclusive lock and yields True when no other process holds it;
    yields False at once otherwise (for a caller that needs only part of another's work)."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True  # the lock goes with the file's closing


def start_at_lowest_priority(module_args: Sequence[str], log_file: Path) -> int:
    """Run ``python -m <module_args>`` in a session of its own, at nice 19 and in the idle I/O
    class, its output appended to ``log_file``; returns its pid at once."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    priority = ["nice", "-n", "19"]
    if shutil.which("ionice"):
        priority = ["ionice", "-c", "3", *priority]
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            [*priority, sys.executable, "-m", *module_args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=lowest_autogroup_priority,
        )
    return proc.pid


def lowest_autogroup_priority() -> None:
    """With the kernel's autogroup scheduling on, a new session is a scheduling group of its
    own that gets an equal share of the CPU whatever its processes' nice values: a build
    took half of the cores from the tests until its group was niced too (set after setsid)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/autogroup").write_text("19")
