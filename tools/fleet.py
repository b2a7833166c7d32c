"""Run the fleet locally in the background: ``make up`` / ``make down`` / ``make status``.

Each instance is ``python -m services.<module>`` with its own instance id, port and
data dir; logs go to ``.local/logs/<service>-<n>.log`` and pids to ``.local/run``.
Instance n of a service listens on the service's port + 10 * n (8002, 8012, 8022…).
The operator console (``services.console``) comes up with them, on port 8000 unless
``--console-port`` says otherwise, reading every instance of every service.

A second fleet can run beside the first: ``STATEFLEET_PORT_OFFSET`` moves every
service's port, ``STATEFLEET_FLEET_HOME`` its pids, logs and data (default ``.local``),
and the services connect to the broker ``make broker`` runs (``STATEFLEET_BROKER_PORT``)
unless ``STATEFLEET_KAFKA_BOOTSTRAP_SERVERS`` names another.

    python -m tools.fleet up --tallies 3
    python -m tools.fleet down
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tools.kafka_broker import default_layout
from tools.processes import exited, process_state

REPO = Path(__file__).resolve().parent.parent
FLEET_HOME = Path(os.environ.get("STATEFLEET_FLEET_HOME", REPO / ".local")).resolve()
RUN_DIR = FLEET_HOME / "run"
LOG_DIR = FLEET_HOME / "logs"
PORT_OFFSET = int(os.environ.get("STATEFLEET_PORT_OFFSET", "0"))
#: Longest wait for a killed instance to finish exiting before it is started again.
EXIT_WAIT_S = 30.0


@dataclass(frozen=True)
class ServiceKind:
    name: str
    module: str
    port: int


SERVICES = (
    ServiceKind("validator", "services.validator", 8001),
    ServiceKind("tallies", "services.tallies", 8002),
    ServiceKind("retry-scheduler", "services.retry_scheduler", 8003),
)
CONSOLE = ServiceKind("console", "services.console", 8000)
#: The console's setting naming each service's base URLs.
CONSOLE_URL_SETTINGS = {
    "validator": "STATEFLEET_CONSOLE_VALIDATOR_URL",
    "tallies": "STATEFLEET_CONSOLE_TALLIES_URL",
    "retry-scheduler": "STATEFLEET_CONSOLE_RETRY_SCHEDULER_URL",
}


def _available(kind: ServiceKind) -> bool:
    return (REPO / kind.module.replace(".", "/") / "__main__.py").exists()


def _pid_file(kind: ServiceKind, n: int) -> Path:
    return RUN_DIR / f"{kind.name}-{n}.pid"


def _is_instance_of(pid: int, kind: ServiceKind) -> bool:
    """Whether ``pid`` runs ``kind`` (a pid file can outlive its process and the pid be reused)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no procfs: trust the pid file
    return kind.module.encode() in cmdline


def _wait_exec(pid: int, timeout: float = 5.0) -> None:
    """Wait until ``pid`` runs its program: Popen can return while the kernel is still setting up
    the new program, and until then /proc/<pid>/cmdline is empty, which `_is_instance_of` reads
    as another program."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(pid):  # a zombie's cmdline is empty too
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes():
                return
        except OSError:
            return  # gone already, or no procfs
        time.sleep(0.005)


def _recorded_pid(kind: ServiceKind, n: int) -> int | None:
    try:
        return int(_pid_file(kind, n).read_text())
    except (FileNotFoundError, ValueError):
        return None


def _running(kind: ServiceKind, n: int) -> int | None:
    pid = _recorded_pid(kind, n)
    if pid is None or process_state(pid) != "running" or not _is_instance_of(pid, kind):
        return None
    return pid


def _alive(pid: int) -> bool:
    return process_state(pid) == "running"


def port(kind: ServiceKind, n: int = 0) -> int:
    return kind.port + PORT_OFFSET + 10 * n


def url(kind: ServiceKind, n: int = 0) -> str:
    return f"http://127.0.0.1:{port(kind, n)}"


def _wait_exited(pid: int, timeout: float = EXIT_WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while process_state(pid) == "exiting" and time.monotonic() < deadline:
        time.sleep(0.1)


def service_env(kind: ServiceKind, n: int) -> dict[str, str]:
    """The environment instance ``n`` of ``kind`` runs with."""
    return {
        **os.environ,
        "STATEFLEET_INSTANCE_ID": f"{kind.name}-{n}",
        "STATEFLEET_HTTP_PORT": str(port(kind, n)),
        "STATEFLEET_DATA_DIR": os.environ.get("STATEFLEET_DATA_DIR", str(FLEET_HOME / "data")),
        # The broker `make broker` runs (STATEFLEET_BROKER_PORT moves it), unless told otherwise.
        "STATEFLEET_KAFKA_BOOTSTRAP_SERVERS": os.environ.get("STATEFLEET_KAFKA_BOOTSTRAP_SERVERS", default_layout().bootstrap),
        "PYTHONPATH": str(REPO),
    }


def start_instance(kind: ServiceKind, n: int, extra_env: dict[str, str] | None = None) -> None:
    if _running(kind, n):
        print(f"  {kind.name}-{n}: already running ({url(kind, n)})")
        return
    old = _recorded_pid(kind, n)
    if old is not None and process_state(old) == "exiting":
        # Killed a moment ago: it still holds its port and its RocksDB lock until it is gone.
        print(f"  {kind.name}-{n}: pid {old} is still exiting; waiting for it")
        _wait_exited(old)
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    env = {**service_env(kind, n), **(extra_env or {})}
    log_path = LOG_DIR / f"{kind.name}-{n}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", kind.module],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    _pid_file(kind, n).write_text(str(proc.pid))
    _wait_exec(proc.pid)
    print(f"  {kind.name}-{n}: started pid {proc.pid} on {url(kind, n)}; log {log_path}")


def pid_of(kind: ServiceKind, n: int) -> int | None:
    """The pid of instance ``n`` of ``kind``, or None if it is not running."""
    return _running(kind, n)


def kill_instance(kind: ServiceKind, n: int, sig: int = signal.SIGKILL) -> int | None:
    """Send ``sig`` (SIGKILL: no clean shutdown) to instance ``n`` of ``kind``; its pid, or None if it was not running."""
    pid = _running(kind, n)
    if pid is not None:
        os.kill(pid, sig)
    return pid


def reap(pid: int, timeout: float = EXIT_WAIT_S) -> None:
    """Wait until a killed process is gone, collecting its exit status if this process started it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not exited(pid):
        time.sleep(0.1)


def instance_data_dir(kind: ServiceKind, n: int) -> Path:
    """Where instance ``n`` of ``kind`` keeps its tables (``<data dir>/<service>/<instance id>``)."""
    env = service_env(kind, n)
    return Path(env["STATEFLEET_DATA_DIR"]) / kind.module.rsplit(".", 1)[-1] / env["STATEFLEET_INSTANCE_ID"]


def wait_ready(kind: ServiceKind, n: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    # One client for every poll: each new one loads the CA certificates (about 50 ms of CPU).
    with httpx.Client(timeout=1) as http:
        while time.monotonic() < deadline:
            if not _running(kind, n):
                return False
            try:
                if http.get(url(kind, n) + "/readyz").status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
    return False


def console_env(counts: dict[str, int]) -> dict[str, str]:
    """The console's settings: every instance of each service as a base URL (the first that answers is asked)."""
    return {
        setting: ",".join(url(kind, n) for n in range(counts.get(kind.name, 1)))
        for kind in SERVICES
        if (setting := CONSOLE_URL_SETTINGS.get(kind.name))
    }


def up(counts: dict[str, int], timeout: float, console_port: int | None = CONSOLE.port) -> int:
    print("starting the fleet:")
    wanted = [(k, n) for k in SERVICES if _available(k) for n in range(counts.get(k.name, 1))]
    for kind, n in wanted:
        start_instance(kind, n)
    console = ServiceKind(CONSOLE.name, CONSOLE.module, console_port) if console_port else None
    if console is not None and _available(console):
        start_instance(console, 0, console_env(counts))
        wanted.append((console, 0))
    failed = [f"{k.name}-{n}" for k, n in wanted if not wait_ready(k, n, timeout)]
    if failed:
        print(f"not ready within {timeout:.0f}s: {', '.join(failed)} — see {LOG_DIR}/", file=sys.stderr)
        return 1
    print("fleet ready:")
    for kind, n in wanted:
        print(f"  {kind.name}-{n}: {url(kind, n)}{'' if kind.name == CONSOLE.name else '/docs'}")
    if console is not None:
        print(f"operator console: {url(console)}")
    return 0


def down() -> int:
    pids: list[tuple[str, int]] = []
    for pid_file in sorted(RUN_DIR.glob("*.pid")) if RUN_DIR.exists() else []:
        try:
            pid = int(pid_file.read_text())
        except ValueError:
            pid_file.unlink()
            continue
        kind = next((k for k in (*SERVICES, CONSOLE) if pid_file.stem.rsplit("-", 1)[0] == k.name), None)
        if _alive(pid) and kind is not None and _is_instance_of(pid, kind):
            os.kill(pid, signal.SIGTERM)
            pids.append((pid_file.stem, pid))
        else:
            pid_file.unlink()
    deadline = time.monotonic() + 30
    for name, pid in pids:
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
        (RUN_DIR / f"{name}.pid").unlink(missing_ok=True)
        print(f"  stopped {name} (pid {pid})")
    return 0


def status() -> int:
    shown = 0
    for kind in (*SERVICES, CONSOLE):
        n = 0
        while _pid_file(kind, n).exists():
            pid = _running(kind, n)
            print(f"  {kind.name}-{n}: {'running pid ' + str(pid) if pid else 'stopped'} ({url(kind, n)})")
            n += 1
            shown += 1
    if not shown:
        print("  no service instances (make up starts them)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    up_p = sub.add_parser("up")
    for kind in SERVICES:
        up_p.add_argument(f"--{kind.name}", type=int, default=1, metavar="N", help=f"instances of {kind.name}")
    up_p.add_argument("--timeout", type=float, default=120.0)
    up_p.add_argument(
        "--console-port", type=int, default=CONSOLE.port, metavar="PORT", help="port of the operator console (0: none)"
    )
    sub.add_parser("down")
    sub.add_parser("status")
    args = parser.parse_args(argv)
    if args.action == "up":
        counts = {k.name: getattr(args, k.name.replace("-", "_")) for k in SERVICES}
        return up(counts, args.timeout, args.console_port)
    if args.action == "down":
        return down()
    return status()


if __name__ == "__main__":
    sys.exit(main())
