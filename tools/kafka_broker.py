"""A real single-node Apache Kafka broker (KRaft) for local runs and tests.

The broker's jars are resolved from Maven Central by ``broker/pom.xml``; storage is
formatted once; the broker runs in the background with its pid, log and log dirs
under ``.local/broker`` (git-ignored). Every entry point is idempotent: ``start``
finds a running broker and returns, ``stop`` on a stopped broker does nothing.

Used by ``make broker`` / ``make down`` and by the pytest fixture, so tests and
local runs start the broker through the same code.

With ``--secure`` the same commands run a second broker, under ``.local/broker-secure`` on
port 9096 (``STATEFLEET_SECURE_BROKER_HOME``, ``STATEFLEET_SECURE_BROKER_PORT``), whose one
client listener is SASL_SSL: SCRAM-SHA-512 users, a certificate from a CA made for it (openssl), and
ACLs (StandardAuthorizer) that let each service's user do only what that service does
(see ``tools/kafka_acls.py`` and docs/security.md). ``env --secure --user U`` prints the
settings a client connects with as U.

    python -m tools.kafka_broker [--secure] start|stop|status|jars|grant|env
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tools.processes import exited

if TYPE_CHECKING:
    from tools.kafka_acls import Acl

REPO = Path(__file__).resolve().parent.parent
BROKER_SRC = REPO / "broker"


class BrokerError(RuntimeError):
    """The broker could not be prepared or started; the message says what to do."""


@dataclass(frozen=True)
class BrokerLayout:
    home: Path
    port: int = 9092
    controller_port: int = 9093
    #: The address both listeners bind to and advertise (a Kubernetes cluster on this machine
    #: reaches the broker on its bridge address: ``STATEFLEET_BROKER_HOST``).
    host: str = "127.0.0.1"
    #: One SASL_SSL listener (SCRAM-SHA-512) with ACLs, instead of PLAINTEXT for all.
    secure: bool = False
    #: Where the jars are, when not under ``home`` (the secure broker runs the plaintext one's).
    libs_dir: Path | None = None

    @property
    def libs(self) -> Path:
        return self.libs_dir or self.home / "libs"

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
        return f"{self.host}:{self.port}"

    @property
    def tls_dir(self) -> Path:
        return self.home / "tls"

    @property
    def ca_file(self) -> Path:
        """The CA certificate (PEM) clients trust the broker's certificate with."""
        return self.tls_dir / "ca.pem"

    @property
    def credentials_file(self) -> Path:
        """The password of every SCRAM user, made at the first start (JSON, mode 600)."""
        return self.home / "credentials.json"


def default_layout() -> BrokerLayout:
    home = Path(os.environ.get("STATEFLEET_BROKER_HOME", REPO / ".local" / "broker"))
    port = int(os.environ.get("STATEFLEET_BROKER_PORT", "9092"))
    controller_port = int(os.environ.get("STATEFLEET_BROKER_CONTROLLER_PORT", str(port + 1)))
    host = os.environ.get("STATEFLEET_BROKER_HOST", "127.0.0.1")
    return BrokerLayout(home=home, port=port, controller_port=controller_port, host=host)


def secure_layout() -> BrokerLayout:
    """The secure broker's own home and ports, so that it runs beside the plaintext one."""
    home = Path(os.environ.get("STATEFLEET_SECURE_BROKER_HOME", REPO / ".local" / "broker-secure"))
    port = int(os.environ.get("STATEFLEET_SECURE_BROKER_PORT", "9096"))
    controller_port = int(os.environ.get("STATEFLEET_SECURE_BROKER_CONTROLLER_PORT", str(port + 1)))
    host = os.environ.get("STATEFLEET_SECURE_BROKER_HOST", "127.0.0.1")
    # The same jars as the plaintext broker: resolved once for both.
    return BrokerLayout(
        home=home, port=port, controller_port=controller_port, host=host, secure=True, libs_dir=default_layout().libs
    )


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
    """The JVM's command line: ``STATEFLEET_BROKER_HEAP`` sizes the heap, and the options in
    ``STATEFLEET_BROKER_JAVA_OPTS`` come after the defaults, so they can override them (``make
    test`` sets ``-XX:TieredStopAtLevel=1``; see the Makefile)."""
    heap = os.environ.get("STATEFLEET_BROKER_HEAP", "1g")
    return [
        "java",
        f"-Xmx{heap}",
        f"-Xms{heap}",
        "-XX:+UseG1GC",
        *os.environ.get("STATEFLEET_BROKER_JAVA_OPTS", "").split(),
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={BROKER_SRC / 'log4j2.properties'}",
        "-cp",
        f"{layout.libs}/*",
        main_class,
        *args,
    ]


def write_config(layout: BrokerLayout) -> None:
    text = (BROKER_SRC / "server.properties.template").read_text()
    if layout.secure:
        text = _with_properties(text, (BROKER_SRC / "secure.properties.template").read_text())
        text = (
            text.replace("@TLS_DIR@", str(layout.tls_dir))
            .replace("@ADMIN_USER@", ADMIN_USER)
            .replace("@ADMIN_PASSWORD@", credentials(layout)[ADMIN_USER])
        )
    text = (
        text.replace("@LOG_DIR@", str(layout.data))
        .replace("@PORT@", str(layout.port))
        .replace("@CONTROLLER_PORT@", str(layout.controller_port))
        .replace("@HOST@", layout.host)
    )
    layout.config.write_text(text)
    if layout.secure:
        layout.config.chmod(0o600)  # it holds the admin's password


def _with_properties(base: str, overrides: str) -> str:
    """``base`` with each property ``overrides`` sets replaced in place (or appended)."""

    def key(line: str) -> str | None:
        text = line.strip()
        return text.split("=", 1)[0].strip() if text and not text.startswith("#") and "=" in text else None

    new = {k: line for line in overrides.splitlines() if (k := key(line)) is not None}
    out = [new.get(k, line) if (k := key(line)) is not None else line for line in base.splitlines()]
    replaced = {key(line) for line in base.splitlines()} & set(new)
    out += [line for line in overrides.splitlines() if key(line) not in replaced]
    return "\n".join(out) + "\n"


# -- the secure broker's certificates, users and ACLs ----------------------------------------

#: The SCRAM user the tooling (and the broker itself, between its listeners) connects as.
ADMIN_USER = "admin"


def credentials(layout: BrokerLayout) -> dict[str, str]:
    """Every SCRAM user's password (made once, kept in the broker's home)."""
    from tools.kafka_acls import USERS

    try:
        known: dict[str, str] = json.loads(layout.credentials_file.read_text())
    except FileNotFoundError:
        known = {}
    wanted = {ADMIN_USER, *USERS}
    if not wanted <= set(known):
        known = {**{user: secrets.token_urlsafe(24) for user in sorted(wanted)}, **known}
        layout.home.mkdir(parents=True, exist_ok=True)
        layout.credentials_file.touch(mode=0o600)
        layout.credentials_file.write_text(json.dumps(known, indent=2) + "\n")
    return known


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BrokerError(f"openssl {args[0]} failed:\n{proc.stdout}\n{proc.stderr}")


#: The broker certificate's extensions: valid for the addresses clients and the broker itself dial.
BROKER_CERT_EXTENSIONS = """\
basicConstraints=CA:FALSE
subjectAltName=DNS:localhost,IP:127.0.0.1@EXTRA_SAN@
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
"""


def make_certificates(layout: BrokerLayout) -> None:
    """A CA of this broker's own, and the broker's key and certificate for 127.0.0.1,
    localhost and the broker's own address, signed by it (once), all PEM: ``ca.pem`` is what clients (and the broker, as a
    client of itself) trust; ``broker-keystore.pem`` holds the broker's key and chain.

    openssl, not keytool: each keytool call starts a JVM, nine of them took 13 s on a busy
    machine; Kafka reads PEM key and trust stores as well as PKCS12 ones."""
    tls = layout.tls_dir
    keystore = tls / "broker-keystore.pem"
    if keystore.exists() and layout.ca_file.exists():
        return
    if shutil.which("openssl") is None:
        raise BrokerError("openssl is required to make the secure broker's certificates: install it (apt-get install openssl)")
    _log(f"making a CA and the broker's certificate in {tls}")
    if tls.exists():
        shutil.rmtree(tls)
    tls.mkdir(parents=True)
    tls.chmod(0o700)  # the keys are not encrypted: the folder is what guards them
    ca_key, key, csr, cert = tls / "ca.key", tls / "broker.key", tls / "broker.csr", tls / "broker.pem"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(layout.ca_file),
             "-days", "3650", "-subj", "/CN=statefleet local CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", "/CN=localhost")
    extensions = tls / "broker.ext"
    extra = f",IP:{layout.host}" if layout.host != "127.0.0.1" else ""
    extensions.write_text(BROKER_CERT_EXTENSIONS.replace("@EXTRA_SAN@", extra))
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(layout.ca_file), "-CAkey", str(ca_key), "-CAcreateserial",
             "-out", str(cert), "-days", "3650", "-extfile", str(extensions))  # fmt: skip
    # Kafka's PEM key store: the (PKCS#8) key, then the chain from the broker's certificate up.
    keystore.write_text(key.read_text() + cert.read_text() + layout.ca_file.read_text())


def client_env(layout: BrokerLayout, user: str = ADMIN_USER) -> dict[str, str]:
    """The settings (``STATEFLEET_`` variables) a client connects to the secure broker with as ``user``."""
    passwords = credentials(layout)
    if user not in passwords:
        raise BrokerError(f"the secure broker has no user {user!r}; its users: {', '.join(sorted(passwords))}")
    return {
        "STATEFLEET_KAFKA_BOOTSTRAP_SERVERS": layout.bootstrap,
        "STATEFLEET_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "STATEFLEET_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "STATEFLEET_KAFKA_SASL_USERNAME": user,
        "STATEFLEET_KAFKA_SASL_PASSWORD": passwords[user],
        "STATEFLEET_KAFKA_SSL_CAFILE": str(layout.ca_file),
    }


def grant(layout: BrokerLayout, topic_prefix: str = "") -> None:
    """Create (or update) every service's and job's SCRAM user, and its ACLs for topics and
    groups named with ``topic_prefix``. Granting what exists already changes nothing."""
    from tools.kafka_acls import USERS, fleet_acls

    passwords = credentials(layout)
    apply_security(layout, {user: passwords[user] for user in USERS}, fleet_acls(topic_prefix))
    _log(f"granted {', '.join(USERS)} their ACLs for topic prefix {topic_prefix!r}")


def apply_security(layout: BrokerLayout, users: dict[str, str], acls: Sequence[Acl]) -> None:
    """Create or update the SCRAM ``users`` (name: password) and add ``acls``, as the admin."""
    lines = [f"user {user} {password}" for user, password in users.items()]
    _apply_security_spec(layout, [*lines, *(acl.spec_line() for acl in acls)])


def _apply_security_spec(layout: BrokerLayout, lines: list[str]) -> None:
    """Apply ``lines`` (users and ACLs, see broker/SecuritySetup.java) as the admin."""
    client = layout.home / "admin-client.properties"
    spec = layout.home / "security-spec.txt"
    client.touch(mode=0o600)
    client.write_text(
        "\n".join(
            [
                f"bootstrap.servers={layout.bootstrap}",
                "security.protocol=SASL_SSL",
                "sasl.mechanism=SCRAM-SHA-512",
                "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
                f'username="{ADMIN_USER}" password="{credentials(layout)[ADMIN_USER]}";',
                "ssl.truststore.type=PEM",
                f"ssl.truststore.location={layout.ca_file}",
            ]
        )
        + "\n"
    )
    spec.touch(mode=0o600)
    spec.write_text("\n".join(lines) + "\n")
    cmd = [
        "java",
        "-Xmx256m",
        f"-Dlog4j2.configurationFile={BROKER_SRC / 'log4j2.properties'}",
        "-cp",
        f"{layout.libs}/*",
        str(BROKER_SRC / "SecuritySetup.java"),
        str(client),
        str(spec),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    spec.unlink(missing_ok=True)
    if proc.returncode != 0:
        raise BrokerError(f"applying users and ACLs failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


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
    scram: list[str] = []
    if layout.secure:
        # The admin exists from the start: the broker itself connects as it between its listeners.
        scram = ["--add-scram", f"SCRAM-SHA-512=[name={ADMIN_USER},password={credentials(layout)[ADMIN_USER]}]"]
    proc = subprocess.run(
        _java_cmd(layout, "kafka.tools.StorageTool", "format", "-t", cid, "-c", str(layout.config), "--standalone", *scram),
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
    if not port_open(layout.port, layout.host):
        return False
    try:
        from shared.engine.clients import PlainAdmin  # noqa: F401
    except ImportError:
        return True
    import asyncio

    async def probe() -> bool:
        from shared.engine.clients import PlainAdmin

        admin = PlainAdmin(**admin_kwargs(layout), request_timeout_ms=int(timeout * 1000))
        try:
            await asyncio.wait_for(admin.start(), timeout)
            await asyncio.wait_for(admin.list_topics(), timeout)
            return True
        except Exception:
            return False
        finally:
            await admin.close()

    return asyncio.run(probe())


def admin_kwargs(layout: BrokerLayout) -> dict[str, object]:
    """How the tooling's clients reach the broker: as the admin, on the secure one."""
    if not layout.secure:
        return {"bootstrap_servers": layout.bootstrap}
    from shared.engine.clients import client_kwargs
    from shared.settings import Settings

    env = client_env(layout)
    return client_kwargs(
        Settings(
            kafka_bootstrap_servers=env["STATEFLEET_KAFKA_BOOTSTRAP_SERVERS"],
            kafka_security_protocol="SASL_SSL",
            kafka_sasl_mechanism=env["STATEFLEET_KAFKA_SASL_MECHANISM"],
            kafka_sasl_username=env["STATEFLEET_KAFKA_SASL_USERNAME"],
            kafka_sasl_password=env["STATEFLEET_KAFKA_SASL_PASSWORD"],
            kafka_ssl_cafile=env["STATEFLEET_KAFKA_SSL_CAFILE"],
        )
    )


def start(layout: BrokerLayout | None = None, wait_s: float = 90.0) -> BrokerLayout:
    layout = layout or default_layout()
    layout.home.mkdir(parents=True, exist_ok=True)
    # Test workers start the broker they share at the same moment: one formats and starts it,
    # the others find it running.
    with open(layout.home / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _start_locked(layout, wait_s)


def _start_locked(layout: BrokerLayout, wait_s: float) -> BrokerLayout:
    if _pid(layout) is not None and is_ready(layout):
        _log(f"already running on {layout.bootstrap} (pid {_pid(layout)})")
        return layout
    if _pid(layout) is None and port_open(layout.port, layout.host):
        variable = "STATEFLEET_SECURE_BROKER_PORT" if layout.secure else "STATEFLEET_BROKER_PORT"
        raise BrokerError(f"port {layout.port} is taken by another process: stop it or set {variable}")
    if _pid(layout) is None:
        resolve_jars(layout)
        if layout.secure:
            make_certificates(layout)
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
    parser.add_argument("action", choices=["start", "stop", "status", "jars", "grant", "env"])
    parser.add_argument("--secure", action="store_true", help="the SASL_SSL broker with ACLs (its own home and port)")
    parser.add_argument(
        "--topic-prefix",
        default=os.environ.get("STATEFLEET_TOPIC_PREFIX", ""),
        help="with --secure, start and grant: the topic prefix the services' ACLs are for",
    )
    parser.add_argument("--user", default=ADMIN_USER, help="with --secure, env: the user to print the settings of")
    args = parser.parse_args(argv)
    layout = secure_layout() if args.secure else default_layout()
    try:
        if args.action in ("grant", "env") and not layout.secure:
            raise BrokerError(f"{args.action} is for the secure broker: add --secure")
        if args.action == "start":
            start(layout)
            if layout.secure:
                grant(layout, args.topic_prefix)
        elif args.action == "grant":
            grant(layout, args.topic_prefix)
        elif args.action == "env":
            for name, value in client_env(layout, args.user).items():
                print(f"export {name}={shlex.quote(value)}")
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
