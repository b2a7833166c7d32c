"""Run service instances as real processes against the real broker, for tests.

Each instance gets its own free port and data dir; ``kill()`` sends SIGKILL, so
tests can prove what survives a crash.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support import forkserver
from tools import web

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: Every :class:`ServiceProcess` started in this test process, in order (see :func:`stop_started_since`).
STARTED: list[ServiceProcess] = []


def stop_started_since(count: int) -> list[ServiceProcess]:
    """Stop the instances started after the first ``count`` of :data:`STARTED` that still run
    (SIGTERM, then SIGKILL): a test that leaves one running would leave a worker consuming,
    writing and using a core for the rest of the suite. The ones it stopped."""
    left = [proc for proc in STARTED[count:] if proc.proc is not None and proc.proc.poll() is None]
    for proc in left:
        proc.stop(timeout=10)
    return left


@dataclass
class ServiceProcess:
    """One instance of ``python -m services.<module>`` (or of ``module`` itself, when dotted),
    with ``args`` on its command line."""

    module: str
    env: dict[str, str]
    log_path: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | forkserver.ForkedProcess | None = None
    args: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServiceProcess:
        env = {**os.environ, **self.env, "STATEFLEET_HTTP_PORT": str(self.port), "STATEFLEET_HTTP_HOST": "127.0.0.1"}
        module = self.module if "." in self.module else f"services.{self.module}"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            if forkserver.enabled():
                self.proc = forkserver.spawn(module, list(self.args), env, REPO, log.fileno())
            else:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", module, *self.args],
                    cwd=REPO,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
        STARTED.append(self)
        return self

    def wait_ready(self, timeout: float = 90.0) -> ServiceProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.module} exited with {self.proc.returncode}; log:\n{self.log_tail()}")
            try:
                if web.get(self.url + "/readyz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"{self.module} not ready on {self.url} within {timeout}s; log:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, no final commit."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return "(no log)"


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.25, message: str = "condition"):  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until it returns a truthy value; return that value."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {message}; last value: {last!r}")


async def wait_for_async(predicate, timeout_s: float = 30.0, interval: float = 0.25, message: str = "condition"):  # type: ignore[no-untyped-def]
    """:func:`wait_for` in a coroutine: call ``predicate()`` (awaiting what it returns when that is
    awaitable) until it gives a truthy value; return that value. ``interval=0`` gives the other
    tasks of the loop one turn between two calls: a wait for what they do next."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last = None
    while loop.time() < deadline:
        last = predicate()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise TimeoutError(f"timed out after {timeout_s}s waiting for {message}; last value: {last!r}")


def run_until_killed(module: str, env: dict[str, str], log: Path, port: int, crash_at: str) -> None:
    """Run ``services.<module>`` with ``STATEFLEET_CRASH_AT=crash_at`` and check that it SIGKILLed
    itself there (see ``shared/engine/_faults.py``)."""
    proc = ServiceProcess(module, {**env, "STATEFLEET_CRASH_AT": crash_at}, log, port=port).start()
    assert proc.proc is not None
    try:
        code = proc.proc.wait(120)
    finally:
        proc.kill()
    assert code == -signal.SIGKILL, f"{module} was to kill itself at {crash_at} (exit {code}); log:\n{proc.log_tail()}"
    point = crash_at.split(":")[0]
    assert f"STATEFLEET_CRASH_AT={point}: killing this worker now" in log.read_text(errors="replace")
