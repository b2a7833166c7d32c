"""Start the tests' service processes by forking one that has imported their libraries.

A service's start spent 1.2 to 1.7 CPU-seconds importing Faust, aiokafka, FastAPI, pydantic,
httpx and the rest, most of it the same for every start; a test run starts about 230 of
them on two cores, beside the builds that a cold machine needs. The fork server imports the
third-party libraries once; each start forks it, and the child becomes ``python -m
<module>``: it takes the requested environment, working directory, arguments and log file,
then runs the module as ``__main__`` and exits through the interpreter's own shutdown.

What stays real: each instance is a process of its own, with its own pid, signals, exit
status and log; SIGKILL kills it as before. What it shares with its siblings: the
libraries' import-time state, taken before any of them ran, and the hash seed (nothing in
the services routes by Python's ``hash()``). The project's own packages (``services``,
``shared``) are imported by each child, after its environment is set: they read settings at
import. ``STATEFLEET_TEST_FORKSERVER=0`` starts every instance with ``python -m`` instead.

    python -m tests.support.forkserver SOCKET    the server (ForkServer starts it)
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import gc
import importlib
import json
import os
import runpy
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

#: What every service imports and no service configures at import: imported once, here.
PRELOADED = (
    "aiokafka",
    "faust",
    "faust.types.web",
    "fastapi",
    "fastapi.routing",
    "fastapi.openapi.models",
    "httpx",
    "prometheus_client",
    "pydantic",
    "pydantic_settings",
    "rocksdict",
    "uvicorn",
)
#: Read their settings at import, so each child imports them itself.
NEVER_PRELOADED = ("services", "shared", "spark_jobs")
REQUEST_BYTES = 1 << 20


def enabled() -> bool:
    return os.environ.get("STATEFLEET_TEST_FORKSERVER", "1") != "0"


# -- the server -------------------------------------------------------------------------------


@dataclass
class Request:
    module: str
    args: list[str]
    env: dict[str, str]
    cwd: str


def _preload() -> None:
    for name in PRELOADED:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    project = sorted(m for m in sys.modules if m.split(".")[0] in NEVER_PRELOADED)
    if project:
        raise SystemExit(f"forkserver: the preload imported {project}, which read settings at import")
    if asyncio.get_event_loop_policy()._local._loop is not None:  # type: ignore[attr-defined]
        raise SystemExit("forkserver: the preload made an event loop, whose selector the children would share")
    if threading.active_count() != 1:
        raise SystemExit(f"forkserver: the preload started threads {threading.enumerate()}: forking would be unsafe")


def serve(socket_path: str) -> tuple[Request, int]:
    """Answers start requests until the process that started it exits; returns only in a forked
    child, with that child's request and log file descriptor."""
    parent = os.getppid()
    _preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(socket_path + ".partial")
    listener.listen(64)
    os.rename(socket_path + ".partial", socket_path)  # connectable once it has its name
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # the wake-up fd does the work
    children: dict[int, socket.socket] = {}
    gc.freeze()  # the preloaded objects' pages stay shared with the children
    print(f"forkserver: ready (pid {os.getpid()}, {len(sys.modules)} modules imported)", flush=True)
    while os.getppid() == parent:
        readable, _, _ = select.select([listener.fileno(), wake_read], [], [], 1.0)
        if wake_read in readable:
            os.read(wake_read, 4096)
        _report_exits(children)
        if listener.fileno() not in readable:
            continue
        conn, _ = listener.accept()
        fds: list[int] = []
        try:
            data, fds, _, _ = socket.recv_fds(conn, REQUEST_BYTES, 1)
            request = Request(**json.loads(data))
            if len(fds) != 1:
                raise ValueError(f"{len(fds)} file descriptors, not the one log file")
        except (OSError, ValueError, TypeError) as error:
            print(f"forkserver: a bad request ({error}): refused", flush=True)
            for fd in fds:
                os.close(fd)
            conn.close()
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for held in (listener, conn, *children.values()):
                held.close()
            os.close(wake_read)
            os.close(wake_write)
            gc.unfreeze()
            return request, fds[0]
        os.close(fds[0])
        children[pid] = conn
        with contextlib.suppress(OSError):
            conn.send(json.dumps({"pid": pid}).encode())
    raise SystemExit(0)  # the test process is gone


def _report_exits(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.send(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode())
            conn.close()


def become(request: Request, log_fd: int) -> None:
    """Turns the forked child into ``python -m request.module *request.args``."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    for fd in (null, log_fd):
        os.close(fd)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    # As `python -m` would: the requested PYTHONPATH's folders come first on the import path
    # (a team's package outside the repository, tests/e2e/test_team_module.py).
    extra = [entry for entry in request.env.get("PYTHONPATH", "").split(os.pathsep) if entry and entry not in sys.path]
    sys.path[:0] = extra
    if request.env.get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(write_through=True)  # type: ignore[union-attr]
        sys.stderr.reconfigure(write_through=True)  # type: ignore[union-attr]
    sys.argv = [request.module, *request.args]
    runpy.run_module(request.module, run_name="__main__", alter_sys=True)


# -- the client -------------------------------------------------------------------------------


class ForkedProcess:
    """A child of the fork server, with what the tests use of ``subprocess.Popen``."""

    def __init__(self, pid: int, conn: socket.socket) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._conn = conn

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read_exit(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._read_exit(left) and deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def _read_exit(self, timeout: float | None) -> bool:
        if not _readable(self._conn, timeout):
            return False
        data = self._conn.recv(4096)
        if not data:  # the server is gone, and with it the child's exit status
            if not _running(self.pid):
                raise RuntimeError(f"the fork server exited before pid {self.pid}: its exit status is lost")
            time.sleep(min(timeout if timeout is not None else 0.1, 0.1))
            return False
        self.returncode = int(json.loads(data)["returncode"])
        self._conn.close()
        return True


def _readable(conn: socket.socket, timeout: float | None) -> bool:
    """``poll``, not ``select``: a test process holds more than select's 1,024 descriptors."""
    poller = select.poll()
    poller.register(conn, select.POLLIN)
    return bool(poller.poll(None if timeout is None else int(timeout * 1000)))


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"


@dataclass
class ForkServer:
    """The fork server of this test process, started at its first use."""

    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="statefleet-forkserver-")))
    process: subprocess.Popen[bytes] | None = None
    owner: int = field(default_factory=os.getpid)

    @property
    def socket_path(self) -> Path:
        return self.folder / "server.sock"

    def start(self) -> None:
        repo = Path(__file__).resolve().parents[2]
        with open(self.folder / "server.log", "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.forkserver", str(self.socket_path)],
                cwd=repo,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + 60
        while not self.socket_path.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the fork server did not start; its log:\n{(self.folder / 'server.log').read_text()}")
            time.sleep(0.05)

    def spawn(self, module: str, args: list[str], env: dict[str, str], cwd: Path, log_fd: int) -> ForkedProcess:
        if self.process is None or self.process.poll() is not None:
            self.start()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(str(self.socket_path))
        request = json.dumps({"module": module, "args": args, "env": env, "cwd": str(cwd)}).encode()
        socket.send_fds(conn, [request], [log_fd])
        reply = conn.recv(4096) if _readable(conn, 30) else b""
        if not reply:
            conn.close()
            raise RuntimeError(f"the fork server did not start {module}; its log:\n{(self.folder / 'server.log').read_text()}")
        return ForkedProcess(int(json.loads(reply)["pid"]), conn)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)


_server: ForkServer | None = None
_server_lock = threading.Lock()


def spawn(module: str, args: list[str], env: dict[str, str], cwd: Path, log_fd: int) -> ForkedProcess:
    """Starts ``python -m module *args`` as a child of this test process's fork server."""
    global _server
    with _server_lock:
        if _server is None or _server.owner != os.getpid():
            _server = ForkServer()
            atexit.register(_server.stop)
        if _server.process is None or _server.process.poll() is not None:
            _server.start()
    return _server.spawn(module, args, env, cwd, log_fd)


if __name__ == "__main__":
    child_request, child_log_fd = serve(sys.argv[1])
    become(child_request, child_log_fd)
