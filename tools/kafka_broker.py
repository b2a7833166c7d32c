"""A real single-node Apache Kafka broker (KRaft) for local runs and tests.

The broker's jars are resolved from Maven Central by ``broker/pom.xml``; storage is
formatted once; the broker runs in the background with its pid, log and log dirs
under ``.local/broker`` (git-ignored). Every entry point is idempotent: ``start``
finds a running broker and returns, ``stop`` on a stopped broker does nothing.

Used by ``make broker`` / ``make down`` and by the pytest fixture, so tests and
local runs start the broker through the same code.

    python -m tools.kafka_broker start|stop|status|jars
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from tools.processes import exited

REPO = Path(__file__).resolve().parent.parent
BROKER_SRC = REPO / "broker"


class BrokerError(RuntimeError):
    """The broker could not be prepared or started; the message says what to do."""


@dataclass(frozen=True)
class BrokerLayout:
    home: Path
    port: int = 9092
    controller_port: int = 9093

    @property
    def libs(self) -> Path:
        return self.home / "libs"

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def config(self) -> Path:
        return self.home / "server.properties"

    @property
    def pid_file(self) -> Path:
        return self.home / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "broker.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


def default_layout() -> BrokerLayout:
    home = Path(os.environ.get("STATEFLEET_BROKER_HOME", REPO / ".local" / "broker"))
    port = int(os.environ.get("STATEFLEET_BROKER_PORT", "9092"))
    controller_port = int(os.environ.get("STATEFLEET_BROKER_CONTROLLER_PORT", str(port + 1)))
    return BrokerLayout(home=home, port=port, controller_port=controller_port)


def _log(msg: str) -> None:
    print(f"[broker] {msg}", file=sys.stderr, flush=True)


def check_toolchain() -> None:
    """Fail with one line saying what to install when Java 17+ or Maven is missing."""
    java = shutil.which("java")
    if java is None:
        raise BrokerError("Java 17+ is required to run the Kafka broker: install a JDK (apt-get install openjdk-17-jdk-headless)")
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    version = _java_major(out)
    if version is not None and version < 17:
        raise BrokerError(f"Java 17+ is required to run the Kafka broker, found Java {version}: install a newer JDK")
    if shutil.which("mvn") is None:
        raise BrokerError("Maven is required to resolve the Kafka broker's jars: install it (e.g. apt-get install maven)")


def _java_major(version_output: str) -> int | None:
    for token in version_output.split('"')[1:2]:
        head = token.split(".")[0]
        if head == "1":  # "1.8.0_x" style
            return int(token.split(".")[1])
        if head.isdigit():
            return int(head)
    return None


def resolve_jars(layout: BrokerLayout) -> None:
    """Copy the broker's runtime jars from Maven Central into ``libs`` (once)."""
    stamp = layout.libs / ".resolved"
    pom = BROKER_SRC / "pom.xml"
    if stamp.exists() and stamp.read_text() == pom.read_text():
        return
    check_toolchain()
    _log(f"resolving Kafka jars from Maven Central into {layout.libs}")
    if layout.libs.exists():
        shutil.rmtree(layout.libs)
    layout.libs.mkdir(parents=True)
    cmd = [
        "mvn",
        "-B",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={layout.libs}",
        "-DincludeScope=runtime",
    ]
    returncode, tail = _run_maven(cmd)
    if returncode != 0:
        raise BrokerError("Maven could not resolve the broker's jars:\n" + "\n".join(tail))
    stamp.write_text(pom.read_text())


class MavenProgress:
    """Condenses Maven's output to a progress line every ``interval`` seconds at most.

    A first run downloads a few hundred files (Maven's plugins, then Kafka's jars);
    one line per file would flood the terminal, none at all looks like a hang.
    """

    def __init__(self, interval: float = 2.0) -> None:
        self.interval = interval
        self.files = 0
        self.last_file = ""
        self._last_report = float("-inf")

    def feed(self, line: str, now: float) -> str | None:
        """The progress line to show after ``line``, if one is due."""
        text = line.strip()
        if text.startswith("[INFO] "):
            text = text[len("[INFO] ") :]
        if text.startswith("Downloaded from "):
            self.files += 1
            url = text.split(": ", 1)[-1].split(" ", 1)[0]
            self.last_file = url.rsplit("/", 1)[-1]
        elif not text.startswith("Copying "):
            return None
        if now - self._last_report < self.interval:
            return None
        self._last_report = now
        if text.startswith("Copying "):
            return f"Maven: {text}"
        return f"Maven: {self.files} files downloaded (latest {self.last_file})"

    def summary(self) -> str:
        return f"Maven: done, {self.files} files downloaded" if self.files else "Maven: done (all files were cached)"


def _run_maven(cmd: list[str]) -> tuple[int, list[str]]:
    """Run Maven showing condensed progress; its exit code and the last lines it wrote."""
    progress = MavenProgress()
    tail: list[str] = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    for line in proc.stdout:
        tail = [*tail[-199:], line.rstrip("\n")]
        shown = progress.feed(line, time.monotonic())
        if shown:
            _log(shown)
    returncode = proc.wait()
    if returncode == 0:
        _log(progress.summary())
    return returncode, tail


def _java_cmd(layout: BrokerLayout, main_class: str, *args: str) -> list[str]:
    heap = os.environ.get("STATEFLEET_BROKER_HEAP", "1g")
    return [
        "java",
        f"-Xmx{heap}",
        f"-Xms{heap}",
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={BROKER_SRC / 'log4j2.properties'}",
        "-cp",
        f"{layout.libs}/*",
        main_class,
        *args,
    ]


def write_config(layout: BrokerLayout) -> None:
    text = (BROKER_SRC / "server.properties.template").read_text()
    text = (
        text.replace("@LOG_DIR@", str(layout.data))
        .replace("@PORT@", str(layout.port))
        .replace("@CONTROLLER_PORT@", str(layout.controller_port))
    )
    layout.config.write_text(text)


def new_cluster_id() -> str:
    """A random KRaft cluster id: 16 bytes, URL-safe base64 without padding.

    Never starting with "-", which the storage tool would read as an option (Kafka's own
    ``Uuid.randomUuid`` draws again for the same reason).
    """
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def format_storage(layout: BrokerLayout) -> None:
    """Format KRaft storage once; an existing ``meta.properties`` means it is done."""
    if (layout.data / "meta.properties").exists():
        return
    layout.data.mkdir(parents=True, exist_ok=True)
    cid = new_cluster_id()
    _log(f"formatting KRaft storage in {layout.data} (cluster id {cid})")
    proc = subprocess.run(
        _java_cmd(layout, "kafka.tools.StorageTool", "format", "-t", cid, "-c", str(layout.config), "--standalone"),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise BrokerError(f"formatting the broker's storage failed:\n{proc.stdout}\n{proc.stderr}")


def _pid(layout: BrokerLayout) -> int | None:
    try:
        pid = int(layout.pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return None if exited(pid) else pid


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def is_ready(layout: BrokerLayout, timeout: float = 5.0) -> bool:
    """True when the broker answers a metadata request (not just an open port)."""
    if not port_open(layout.port):
        return False
    try:
        from shared.engine.clients import PlainAdmin  # noqa: F401
    except ImportError:
        return True
    import asyncio

    async def probe() -> bool:
        from shared.engine.clients import PlainAdmin

        admin = PlainAdmin(bootstrap_servers=layout.bootstrap, request_timeout_ms=int(timeout * 1000))
        try:
            await asyncio.wait_for(admin.start(), timeout)
            await asyncio.wait_for(admin.list_topics(), timeout)
            return True
        except Exception:
            return False
        finally:
            await admin.close()

    return asyncio.run(probe())


def start(layout: BrokerLayout | None = None, wait_s: float = 90.0) -> BrokerLayout:
    layout = layout or default_layout()
    layout.home.mkdir(parents=True, exist_ok=True)
    if _pid(layout) is not None and is_ready(layout):
        _log(f"already running on {layout.bootstrap} (pid {_pid(layout)})")
        return layout
    if _pid(layout) is None and port_open(layout.port):
        raise BrokerError(f"port {layout.port} is taken by another process: stop it or set STATEFLEET_BROKER_PORT")
    if _pid(layout) is None:
        resolve_jars(layout)
        write_config(layout)
        format_storage(layout)
        _log(f"starting Kafka on {layout.bootstrap}; log: {layout.log_file}")
        with open(layout.log_file, "ab") as log:
            proc = subprocess.Popen(
                _java_cmd(layout, "kafka.Kafka", str(layout.config)),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        layout.pid_file.write_text(str(proc.pid))
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if _pid(layout) is None:
            tail = layout.log_file.read_text(errors="replace")[-3000:] if layout.log_file.exists() else ""
            raise BrokerError(f"the broker exited during start-up; last log lines:\n{tail}")
        if is_ready(layout):
            _log(f"ready on {layout.bootstrap}")
            return layout
        time.sleep(0.5)
    raise BrokerError(f"the broker did not answer on {layout.bootstrap} within {wait_s:.0f}s; see {layout.log_file}")


def stop(layout: BrokerLayout | None = None, wait_s: float = 60.0) -> None:
    layout = layout or default_layout()
    pid = _pid(layout)
    if pid is None:
        _log("not running")
        layout.pid_file.unlink(missing_ok=True)
        return
    _log(f"stopping pid {pid}")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and _pid(layout) is not None:
        time.sleep(0.2)
    if _pid(layout) is not None:
        _log("did not stop in time; killing")
        os.kill(pid, signal.SIGKILL)
    layout.pid_file.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["start", "stop", "status", "jars"])
    args = parser.parse_args(argv)
    layout = default_layout()
    try:
        if args.action == "start":
            start(layout)
        elif args.action == "stop":
            stop(layout)
        elif args.action == "jars":
            resolve_jars(layout)
        else:
            running = _pid(layout) is not None and is_ready(layout)
            print(f"broker {'running' if running else 'stopped'} ({layout.bootstrap})")
            return 0 if running else 1
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
