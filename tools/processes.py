"""The state of a local process, as the fleet and broker tools need it: running, being torn
down after a kill, or gone (a zombie counts as gone: only its exit status is left)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

#: PF_EXITING in /proc/<pid>/stat's flags: the process is being torn down (after SIGKILL,
#: releasing a large address space takes a while; its port and files are still held).
_PF_EXITING = 0x4


def process_state(pid: int) -> str | None:
    """ "running"; "exiting" (being torn down after a kill: it still holds its port and
    files); "zombie" (dead, only its exit status left for its parent to collect); or
    None (no such process)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # someone else's process holds the pid: it exists
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "running"  # no procfs (macOS): signal 0 is all there is to go on
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
    state, flags = fields[0], int(fields[6])
    if state in ("Z", "X", "x"):
        return "zombie"
    return "exiting" if flags & _PF_EXITING or _kill_pending(pid) else "running"


def _kill_pending(pid: int) -> bool:
    """Whether a SIGKILL is sent but not yet acted on (the moment right after ``kill -9``)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    bit = 1 << (signal.SIGKILL - 1)
    return any(int(line.split(":", 1)[1], 16) & bit for line in status.splitlines() if line.startswith(("SigPnd:", "ShdPnd:")))


def exited(pid: int) -> bool:
    """Whether ``pid`` is gone or only its exit status is left; a child of this process is
    collected on the way (a process started, then stopped or killed, stays a zombie until then
    and answers signal 0)."""
    if _collect(pid):
        return True
    state = process_state(pid)
    if state == "zombie":
        # It may have finished exiting since the first look: a child of ours is collected now.
        _collect(pid)
        return True
    return state is None


def _collect(pid: int) -> bool:
    """Collect the exit status of ``pid`` if it is a child of this process that has exited."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:  # not our child, or collected already: its parent collects it
        return False
